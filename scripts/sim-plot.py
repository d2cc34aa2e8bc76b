#!/usr/bin/python3
"""Plots of loom-sim's CSV: sim-plot.py CSV PREFIX.

PREFIX-busbw.png: busbw against size, one line per algorithm, one panel per rank count.
PREFIX-scaling.png (when the CSV holds several rank counts): time against rank count, one line
per algorithm, one panel per size (up to six sizes spread over the range).
Run with Debian's /usr/bin/python3 (python3-matplotlib, scripts/setup.sh).
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def human(b):
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f:
            return "%g %s" % (b / f, unit)
    return "%d B" % b


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: sim-plot.py CSV PREFIX")
    rows = list(csv.DictReader(open(sys.argv[1])))
    if not rows:
        sys.exit("sim-plot.py: %s has no points" % sys.argv[1])
    prefix = sys.argv[2]
    ranks = sorted({int(r["ranks"]) for r in rows})
    algos = []
    for r in rows:
        if r["algo"] not in algos:
            algos.append(r["algo"])
    per_node = rows[0]["per_node"]

    fig, axes = plt.subplots(1, len(ranks), figsize=(6 * len(ranks), 4.5), squeeze=False)
    for ax, p in zip(axes[0], ranks):
        for a in algos:
            pts = [(int(r["bytes"]), float(r["busbw"])) for r in rows
                   if int(r["ranks"]) == p and r["algo"] == a]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker=".", label=a)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("allreduce size (bytes)")
        ax.set_ylabel("predicted busbw (GB/s)")
        ax.set_title("loom-sim: %d ranks, %s per node" % (p, per_node))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(prefix + "-busbw.png", dpi=110)

    if len(ranks) > 1:
        sizes = sorted({int(r["bytes"]) for r in rows})
        pick = sizes if len(sizes) <= 6 else [sizes[round(i * (len(sizes) - 1) / 5)]
                                               for i in range(6)]
        cols = min(3, len(pick))
        nrow = (len(pick) + cols - 1) // cols
        fig, axes = plt.subplots(nrow, cols, figsize=(5.5 * cols, 4 * nrow), squeeze=False)
        for i, s in enumerate(pick):
            ax = axes[i // cols][i % cols]
            for a in algos:
                pts = sorted((int(r["ranks"]), float(r["time_us"])) for r in rows
                             if int(r["bytes"]) == s and r["algo"] == a)
                if pts:
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker=".", label=a)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("ranks (GPUs)")
            ax.set_ylabel("predicted time (us)")
            ax.set_title("%s allreduce" % human(s))
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=6)
        for j in range(len(pick), nrow * cols):
            axes[j // cols][j % cols].axis("off")
        fig.tight_layout()
        fig.savefig(prefix + "-scaling.png", dpi=110)


if __name__ == "__main__":
    main()
