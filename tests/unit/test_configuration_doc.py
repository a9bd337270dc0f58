"""docs/CONFIGURATION.md against the code: every flag of every command, every -o option
and every DELVEFS_* variable the code reads is documented, and the page documents nothing
that does not exist."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from delvefs.cli import build_parser
from delvefs.client.mount.options import BY_NAME, IGNORED

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "CONFIGURATION.md").read_text()
CODE_DIRS = ("delvefs", "eventhandler", "rulesets")
VARIABLE = re.compile(r"DELVEFS_[A-Z0-9_]*[A-Z0-9]")


def commands() -> dict[str, list[argparse.ArgumentParser]]:
    """command -> its parser and those of its own subcommands (principal add, ...)."""
    sub = build_parser()._subparsers._group_actions[0]
    found = {}
    for name, parser in sub.choices.items():
        parsers = [parser]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers += list(action.choices.values())
        found[name] = parsers
    return found


def flags_of(parsers) -> set[str]:
    return {option for parser in parsers for action in parser._actions
            if not isinstance(action, (argparse._HelpAction, argparse._VersionAction))
            for option in action.option_strings if option.startswith("--") or option == "-o"}


def section(command: str) -> str:
    m = re.search(rf"^## `delvefs {command}`\n(.*?)(?=^## |\Z)", DOC, re.M | re.S)
    assert m, f"docs/CONFIGURATION.md has no section '## `delvefs {command}`'"
    return m.group(1)


def table_flags(text: str) -> set[str]:
    """Flags named in the first column of a section's table rows (``| `--flag ARG` |``)."""
    return {m.group(1) for m in re.finditer(r"^\| `(--?[a-z][a-z-]*|-o)[ `]", text, re.M)}


@pytest.mark.parametrize("command", sorted(commands()))
def test_every_flag_is_documented_in_its_commands_section(command):
    text = section(command)
    flags = flags_of(commands()[command])
    documented = table_flags(text)
    missing = sorted(f for f in flags if f not in documented)
    assert not missing, f"delvefs {command}: flags missing from its table in docs/CONFIGURATION.md: {missing}"
    unknown = sorted(documented - flags)
    assert not unknown, f"delvefs {command}: docs/CONFIGURATION.md lists flags that do not exist: {unknown}"


def test_no_section_for_a_command_that_does_not_exist():
    documented = set(re.findall(r"^## `delvefs ([a-z]+)`", DOC, re.M))
    assert documented == set(commands())


def mount_option_rows() -> dict[str, str]:
    """-o option -> the long flag its row pairs it with (docs' mount table)."""
    rows = {}
    for m in re.finditer(r"^\| `(--[a-z-]+)[^|]*\| `([a-z_]+)(=[^`]*)?`", section("mount"), re.M):
        rows[m.group(2)] = m.group(1)
    return rows


def test_every_mount_option_is_documented_beside_its_flag():
    rows = mount_option_rows()
    for name, option in BY_NAME.items():
        assert rows.get(name) == option.flag, f"-o {name}: expected in the row of {option.flag}"
    assert set(rows) <= set(BY_NAME), set(rows) - set(BY_NAME)


def test_every_ignored_option_is_named():
    text = section("mount")
    for name in IGNORED:
        assert f"`{name}`" in text, name


def code_variables() -> set[str]:
    found = set()
    for d in CODE_DIRS:
        for path in (ROOT / d).rglob("*.py"):
            found |= set(VARIABLE.findall(path.read_text()))
    return found


def unit_variables() -> set[str]:
    """Variables the systemd units read from their environment files (not DelveFS)."""
    return {v for path in (ROOT / "contrib" / "systemd").iterdir() for v in VARIABLE.findall(path.read_text())}


def test_every_variable_the_code_reads_is_documented():
    documented = set(re.findall(r"`(DELVEFS_[A-Z0-9_]+)`", DOC))
    missing = sorted(code_variables() - documented)
    assert not missing, f"DELVEFS_* variables missing from docs/CONFIGURATION.md: {missing}"


def test_the_doc_names_no_variable_that_does_not_exist():
    known = code_variables() | unit_variables() | set(VARIABLE.findall((ROOT / "scripts" / "bootstrap.sh").read_text()))
    unknown = sorted(set(VARIABLE.findall(DOC)) - known)
    assert not unknown, f"docs/CONFIGURATION.md names variables nothing reads: {unknown}"
