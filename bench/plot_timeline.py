#!/usr/bin/python3
"""Throughput against time around a failure, from the adaptive data path's run
(tests/netns/netns_test.sh): every "throughput per 100 ms (MB/s), <what> between A and B:" line
and the "0.0:189 0.1:189 ..." line after it become one panel, the interval between the cue and
the failure being in place shaded. Writes one SVG.

    /usr/bin/python3 bench/plot_timeline.py NETNS_LOG OUT.svg
"""

import re
import sys

HEAD = re.compile(r"throughput per 100 ms \(MB/s\), (.+) between ([0-9.]+) ?s? and ([0-9.]+) ?s?:")


def series(path):
    """[(title, cue s, in place s, [(t, MB/s), ...]), ...] in the order the log has them."""
    out, pending = [], None
    with open(path, errors="replace") as f:
        for line in f:
            m = HEAD.search(line)
            if m:
                pending = (m.group(1), float(m.group(2)), float(m.group(3)))
                continue
            if pending:
                points = re.findall(r"([0-9.]+):([0-9.]+)", line)
                if points:
                    out.append(pending + ([(float(t), float(v)) for t, v in points],))
                pending = None
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    found = series(sys.argv[1])
    if not found:
        sys.exit("%s has no throughput timelines (run tests/netns/netns_test.sh as root)" % sys.argv[1])
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(found), 1, figsize=(8, 2.2 * len(found)), squeeze=False)
    for ax, (title, cue, cut, points) in zip(axes[:, 0], found):
        ax.step([t for t, _ in points], [v for _, v in points], where="post", color="tab:blue")
        ax.axvspan(cue, cut, color="tab:red", alpha=0.25, label="failure being put in place")
        ax.axvline(cut, color="tab:red", linewidth=1)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("MB/s per 100 ms")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the batch was submitted")
    axes[0, 0].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], format="svg")
    print("%s: %d panels" % (sys.argv[2], len(found)))


if __name__ == "__main__":
    main()
