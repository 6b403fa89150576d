"""Direct calls of the CUDA operators with bad arguments must raise, never crash: each case
runs in a child process, and a child that dies of a signal is a failure.

    python scripts/cuda_bad_args.py            # all cases
    python scripts/cuda_bad_args.py CASE       # one case, in this process (for a debugger)
"""
from __future__ import annotations

import subprocess
import sys

import torch

import seqkernels  # noqa: F401  (registers torch.ops.seqkernels)

ops = torch.ops.seqkernels


def lstm_batch_mismatch():
    T, B, I, H = 3, 2, 4, 5
    x = torch.randn(T * B, I, device="cuda")
    bs = torch.full((T,), B, dtype=torch.int64)
    w_ih, w_hh = torch.randn(4 * H, I, device="cuda"), torch.randn(4 * H, H, device="cuda")
    ops.lstm_forward(x, bs, torch.zeros(1, H, device="cuda"), torch.zeros(B, H, device="cuda"), w_ih, w_hh,
                     None, None, None, False, False)


def lstm_batch_mismatch_cpu():
    T, B, I, H = 3, 2, 4, 5
    x = torch.randn(T * B, I)
    bs = torch.full((T,), B, dtype=torch.int64)
    ops.lstm_forward(x, bs, torch.zeros(1, H), torch.zeros(B, H), torch.randn(4 * H, I), torch.randn(4 * H, H),
                     None, None, None, False, False)


def lstm_dtype_mismatch():
    T, B, I, H = 3, 2, 4, 5
    x = torch.randn(T * B, I, device="cuda")
    bs = torch.full((T,), B, dtype=torch.int64)
    ops.lstm_forward(x, bs, torch.zeros(B, H, device="cuda"), torch.zeros(B, H, device="cuda"),
                     torch.randn(4 * H, I, device="cuda", dtype=torch.float64), torch.randn(4 * H, H, device="cuda"),
                     None, None, None, False, False)


def convrnn_batch_mismatch():
    x, w = torch.randn(2, 3, 1, 8, device="cuda"), torch.randn(1, 1, 3, device="cuda")
    ops.convrnn_forward(x, w, None, torch.randn(1, 1, 8, device="cuda"), 0, 0)


def convrnn_kernel_wider_than_ring():
    x, w = torch.randn(2, 3, 1, 2, device="cuda"), torch.randn(1, 1, 5, device="cuda")
    ops.convrnn_forward(x, w, None, torch.randn(2, 1, 2, device="cuda"), 0, 0)


CASES = {f.__name__: f for f in (lstm_batch_mismatch, lstm_batch_mismatch_cpu, lstm_dtype_mismatch, convrnn_batch_mismatch,
                                  convrnn_kernel_wider_than_ring)}

if __name__ == "__main__":
    if len(sys.argv) > 1:
        try:
            CASES[sys.argv[1]]()
        except (RuntimeError, TypeError, ValueError) as exc:
            print(f"raised {type(exc).__name__}: {str(exc).splitlines()[0]}")
            sys.exit(0)
        print("did not raise")
        sys.exit(1)
    failures = 0
    for name in CASES:
        proc = subprocess.run([sys.executable, "-X", "faulthandler", __file__, name], capture_output=True, text=True)
        ok = proc.returncode == 0
        failures += not ok
        detail = proc.stdout.strip() or proc.stderr.strip().splitlines()[-1:]
        print(f"{'ok  ' if ok else 'FAIL'} {name}: rc={proc.returncode} {detail}")
    print(f"cuda_bad_args: {failures} failure(s)")
    sys.exit(1 if failures else 0)
