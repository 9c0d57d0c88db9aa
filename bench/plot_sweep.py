#!/usr/bin/python3
"""Draws a transfer_engine_bench --sweep result: throughput against block size (log scale), one
curve per (batch size, threads), so transports and settings compare by their curves.

    bench/plot_sweep.py sweep.json sweep.png [--title TEXT]      (.png or .svg, by the name)

Needs matplotlib (Debian: apt-get install python3-matplotlib)."""

import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="the file --sweep_out wrote")
    ap.add_argument("out", help="image to write: .png or .svg")
    ap.add_argument("--title", help="default: operation, protocol and duration per point")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_sweep.py needs matplotlib: apt-get install python3-matplotlib")
    with open(args.json) as f:
        sweep = json.load(f)
    points = sweep.get("points", [])
    if not points:
        sys.exit("%s has no points; was it written by transfer_engine_bench --sweep?" % args.json)
    curves = {}
    for p in points:
        curves.setdefault((p["batch_size"], p["threads"]), []).append((p["block_size"], p["throughput"]))
    unit = points[0]["unit"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for (batch, threads), xy in sorted(curves.items()):
        xy.sort()
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o",
                label="batch %d, %d thread%s" % (batch, threads, "" if threads == 1 else "s"))
    ax.set_xscale("log", base=2)
    blocks = sorted({p["block_size"] for p in points})
    ax.set_xticks(blocks)
    ax.set_xticklabels([human(b) for b in blocks])
    ax.set_xlabel("block size (bytes per op)")
    ax.set_ylabel("throughput (%s)" % unit)
    seconds = max(p["duration_s"] for p in points)
    ax.set_title(args.title or "transfer_engine_bench --sweep: %s over %s, %.1f s per point"
                 % (sweep.get("operation", "?"), sweep.get("protocol", "?"), seconds))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(args.out)
    print("wrote %s (%d points, %d curves)" % (args.out, len(points), len(curves)))


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%g %s" % (n, unit)
        n /= 1024


if __name__ == "__main__":
    main()
