"""Log files rotate by size, and a daemon's stderr follows the current file."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_log_file_rotates_and_stderr_follows(tmp_path):
    log = tmp_path / "mount.log"
    script = textwrap.dedent(f"""
        import logging, sys
        from delvefs.shared import logsetup
        logsetup.MAX_BYTES = 2000
        logsetup.setup("info", {str(log)!r}, capture_std=True)
        for i in range(300):
            logging.getLogger("t").info("line %d %s", i, "x" * 40)
        print("a traceback outside logging", file=sys.stderr, flush=True)
        logging.getLogger("t").debug("not at info")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # stderr went to the log file
    current = log.read_text()
    assert "a traceback outside logging" in current and "line 299" in current
    assert "not at info" not in current
    rotated = sorted(p.name for p in tmp_path.iterdir() if p.name != "mount.log")
    assert rotated == ["mount.log.1", "mount.log.2", "mount.log.3", "mount.log.4", "mount.log.5"]
    assert all(p.stat().st_size <= 2200 for p in tmp_path.iterdir())


def test_level_precedence(monkeypatch):
    import logging

    from delvefs.shared.logsetup import level_of
    monkeypatch.setenv("DELVEFS_LOG_LEVEL", "warning")
    assert level_of(None) == logging.WARNING
    assert level_of(None, debug=True) == logging.DEBUG
    assert level_of("error", debug=True) == logging.ERROR
    monkeypatch.delenv("DELVEFS_LOG_LEVEL")
    assert level_of(None) == logging.INFO
