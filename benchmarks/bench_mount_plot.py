"""Plot of the mount benchmark for docs/PERFORMANCE.md ("## Mount (read path)").

    .venv/bin/python -m benchmarks.bench_mount_plot   # reads benchmarks/results/mount-100000.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    saved = json.loads((ROOT / "benchmarks/results/mount-100000.json").read_text())
    res = saved.get("unpinned") or saved.get("pinned") or saved  # (one CPU mode; older runs had one)
    n = saved["objects"]
    tools = ["DelveFS", "s3fs", "rclone"]
    cold = [res["delvefs_fresh_ls_s"], res.get("s3fs_cold_ls_s"), res.get("rclone_cold_ls_s")]
    hot = [res["delvefs_hot_ls_s"], res.get("s3fs_hot_ls_s"), res.get("rclone_hot_ls_s")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    x = range(len(tools))
    ax1.bar([i - 0.2 for i in x], [c or 0 for c in cold], 0.4, label="fresh mount + ls -l")
    ax1.bar([i + 0.2 for i in x], [h or 0 for h in hot], 0.4, label="ls -l again (hot)")
    ax1.set_xticks(list(x), tools)
    ax1.set_yscale("log")
    ax1.set_ylabel("seconds (log scale)")
    ax1.set_title(f"ls -l of {n:,} objects in one prefix")
    for i, (c, h) in enumerate(zip(cold, hot)):
        if c:
            ax1.text(i - 0.2, c, f"{c:.1f}", ha="center", va="bottom", fontsize=8)
        if h:
            ax1.text(i + 0.2, h, f"{h:.2f}", ha="center", va="bottom", fontsize=8)
    ax1.legend(fontsize=8)
    labels = ["stat/s\n(÷ boto3 head/s)", "1 GiB read\n(÷ boto3 download+read)"]
    ratios = [res["delvefs_stat_per_s"] / res["boto3_head_per_s"],
              res["boto3_download_read_s"] / res["delvefs_big_read_s"]]
    ax2.bar(labels, ratios, color=["tab:green", "tab:purple"])
    for i, r in enumerate(ratios):
        ax2.text(i, r, f"{r:.2f}×", ha="center", va="bottom")
    ax2.set_yscale("log")
    ax2.set_title("DelveFS relative to bare boto3 (higher is better)")
    fig.tight_layout()
    out = ROOT / "docs/mount-read-path.png"
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
