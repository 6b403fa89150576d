"""Prints the table of an A/B (scripts/ab_builds.sh, scripts/ab_switch.sh): the JSON lines of
scripts/ab_time_lstm.py, tagged t<i>.r<round>, as one markdown row per cell (ms; for CUDA `infer`
the CUDA-graph replay, then the eager call), after a legend of what t<i> stands for.

  python scripts/ab_table.py ab.jsonl ROUNDS LABEL_0 [LABEL_1 ...]
"""
from __future__ import annotations

import json
import sys


def main() -> None:
    path, rounds, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    runs = {}
    with open(path) as f:
        for line in f:
            runs.update(json.loads(line))
    cells = list(runs["t0.r1"])
    cols = [f"t{i}.r{r}" for i in range(len(labels)) for r in range(1, rounds + 1)]
    for i, label in enumerate(labels):
        print(f"t{i} = {label}")

    def fmt(v):
        return "-" if v is None else f"{v:.3f}"

    print("| cell | " + " | ".join(f"{c} graph / eager" for c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for cell in cells:
        print(f"| {cell} | " + " | ".join(f"{fmt(runs[c][cell][0])} / {fmt(runs[c][cell][1])}" for c in cols) + " |")


if __name__ == "__main__":
    main()
