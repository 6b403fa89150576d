"""The persistent LSTM kernels' SEQKERNELS_LSTM_TRACE report for a few cells: SM cycles a step per
phase of each launch, printed by the kernels themselves (thread 0 of block 0) when the variable is
set. A CUDA diagnostic; nothing is timed on the host.

    python scripts/lstm_trace.py [--train] [--seq-len 256] [--cases bf16:8:512 bf16:16:512 ...]
    SEQKERNELS_LSTM_ONE_CLUSTER=1 python scripts/lstm_trace.py --cases bf16:16:512   # a forced kernel

Per case (I = H, one layer): one untraced warm-up call, then one traced call (`infer` under
torch.no_grad(), or with --train a forward and a backward), synchronized, so the kernels' lines
appear in their launch order after the case's header line.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import harness  # noqa: E402
import seqkernels  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--train", action="store_true", help="trace a forward and a backward instead of `infer`")
parser.add_argument("--seq-len", type=int, default=256)
parser.add_argument("--tf32", choices=["default", "on", "off"], default="default",
                    help="float32's TF32 switches (harness.set_tf32): PyTorch's defaults, both on, both off")
parser.add_argument("--cases", nargs="+", metavar="DTYPE:B:H",
                    default=["bf16:1:256", "bf16:8:256", "bf16:16:256", "bf16:1:512", "bf16:8:512", "bf16:16:512"])
args = parser.parse_args()
if not torch.cuda.is_available():
    sys.exit("lstm_trace: the trace is the CUDA kernels'; no CUDA device here")
cases = [harness.parse_case(c) for c in args.cases]
harness.set_tf32({"default": None, "on": True, "off": False}[args.tf32])


def call(model: torch.nn.Module, x: torch.Tensor) -> None:
    if args.train:
        y, _ = model(x)
        y.float().sum().backward()
    else:
        with torch.no_grad():
            model(x)
    torch.cuda.synchronize()


torch.manual_seed(0)
for dtype, batch, hidden in cases:
    model = seqkernels.LSTM(hidden, hidden).to(device="cuda", dtype=dtype)
    x = torch.randn(args.seq_len, batch, hidden, device="cuda", dtype=dtype, requires_grad=args.train)
    os.environ.pop("SEQKERNELS_LSTM_TRACE", None)
    call(model, x)
    print(f"== {dtype} B={batch} H={hidden} T={args.seq_len} {'train' if args.train else 'infer'}", flush=True)
    os.environ["SEQKERNELS_LSTM_TRACE"] = "1"
    call(model, x)
    os.environ.pop("SEQKERNELS_LSTM_TRACE", None)
