"""Peak GPU memory of one LSTM training call, forward and backward apart, under settings of a
diagnostic switch, beside cuDNN's (nn.LSTM holding the same weights). Diagnostic only.

    python scripts/lstm_memory_probe.py --cases float32:64:1024 --tf32 off --env SEQKERNELS_LSTM_X3_PRODUCTS=0 =1

Per case and setting, in MiB above what was allocated before the call (the inputs, the weights;
the unit of the benchmark's peak MB column): the forward's peak, the whole call's peak, and where
the whole call peaked (forward or backward).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

import seqkernels

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from harness import DTYPES, set_tf32  # noqa: E402  the benchmark's dtypes and TF32 switches



def peaks(model, x):
    """(forward peak, call peak) in MiB above the memory allocated before the call."""
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y, _ = model(x)
    torch.cuda.synchronize()
    forward = torch.cuda.max_memory_allocated() - base
    y.float().sum().backward()
    torch.cuda.synchronize()
    call = torch.cuda.max_memory_allocated() - base
    return forward / 2**20, call / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["float32:64:1024"], help="dtype:B:H")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--tf32", choices=["default", "off"], default="default")
    ap.add_argument("--env", nargs="+", default=[], help="VAR=VALUE, then =VALUE for the same variable; - unsets")
    args = ap.parse_args()
    if args.tf32 == "off":
        set_tf32(False)
    settings, var = [], None
    for e in args.env or ["-"]:
        name, _, value = e.rpartition("=")
        var = name or var
        settings.append((var, value))
    for case in args.cases:
        name, B, H = case.split(":")
        dtype, B, H = DTYPES[name], int(B), int(H)
        torch.manual_seed(0)
        peer = nn.LSTM(H, H).to(device="cuda", dtype=dtype)
        ours = seqkernels.LSTM(H, H).to(device="cuda", dtype=dtype)
        ours.load_state_dict(peer.state_dict())
        x = torch.randn(args.seq_len, B, H, device="cuda", dtype=dtype, requires_grad=True)
        peaks(peer, x)
        fwd, call = peaks(peer, x)
        print(f"{case} cuDNN: forward {fwd:.1f} MiB, call {call:.1f} MiB", flush=True)
        for var, value in settings:
            if var is None or value == "-":
                os.environ.pop(var or "", None)
            else:
                os.environ[var] = value
            peaks(ours, x)
            fwd, call = peaks(ours, x)
            where = "forward" if call <= fwd else "backward"
            print(f"{case} {var}={value}: forward {fwd:.1f} MiB, call {call:.1f} MiB (peak in the {where})", flush=True)


if __name__ == "__main__":
    main()
