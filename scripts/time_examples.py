"""Run every example at its default settings on each device and report wall time.

    python scripts/time_examples.py [--devices cpu cuda]

Each run is a fresh process (so the wall time includes start-up, as a user sees it). Prints
the example's own timing lines (those with "ms") and one line per run:
    example <name> <device> rc=<exit code> wall <seconds> s
and exits non-zero if any run failed.
"""
from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import time

EXAMPLES = ("lstm_language_model", "streaming_encoder", "convrnn_sequence_memory", "convlstm_next_frame")
ROOT = pathlib.Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"])
    args = parser.parse_args()
    failures = 0
    for name in EXAMPLES:
        for device in args.devices:
            start = time.perf_counter()
            run = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), "--device", device],
                                 capture_output=True, text=True, cwd=ROOT)
            wall = time.perf_counter() - start
            for line in (run.stdout + run.stderr).splitlines():
                if "ms" in line or run.returncode:
                    print(f"    {line}")
            print(f"example {name:24s} {device:4s} rc={run.returncode} wall {wall:6.1f} s", flush=True)
            failures += run.returncode != 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
