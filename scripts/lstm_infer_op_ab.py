"""seqkernels.LSTM's eager `infer` call with its one-operator short path (lstm_infer, the default)
against the same call through lstm_layer (what the short path ran before), interleaved in one
process, with cuDNN's call beside them (GPU; on the CPU nn.LSTM).

    python scripts/lstm_infer_op_ab.py [--device cuda] [--iters 50] [--tf32 default|off] [--cell]
                                       [--cases bf16:8:1024 ...]

--cell times seqkernels.LSTMCell's one-step call (input [B, H]) against nn.LSTMCell instead.

Per case (T = 256, I = H, random initial states): the median ms per call (benchmarks/harness.py's
measure_interleaved: CUDA events after a synchronize, each timed call after an untimed one of the
same candidate) and the host time of one call (time.perf_counter around the call right after a
synchronize, median), for both paths. The lstm_layer path is reached by making the short path see
an active torch.func transform (seqkernels.nn.lstm.transformed patched for that candidate's calls),
which sends it to lstm_layer exactly as a transform would. Diagnostic only: the benchmark is what
the tables come from.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import harness  # noqa: E402
import seqkernels  # noqa: E402
import seqkernels.nn.lstm as lstm_module  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--iters", type=int, default=50)
parser.add_argument("--tf32", choices=["default", "off"], default="default")
parser.add_argument("--cell", action="store_true",
                    help="time seqkernels.LSTMCell's one-step call (input [B, H]) against nn.LSTMCell instead")
parser.add_argument("--cases", nargs="+", metavar="DTYPE:B:H",
                    default=["fp32:1:256", "bf16:1:256", "fp32:8:512", "bf16:8:512", "fp32:1:1024", "bf16:8:1024",
                             "fp32:8:1024", "bf16:16:1024"])
args = parser.parse_args()
dev = torch.device(args.device)
harness.set_tf32(False if args.tf32 == "off" else None)
real_transformed = lstm_module.transformed


def through_layer(fn):
    """fn with the short path sent to lstm_layer (as under a torch.func transform)."""
    def run():
        lstm_module.transformed = lambda: True
        try:
            return fn()
        finally:
            lstm_module.transformed = real_transformed
    return run


print(f"{torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}, torch {torch.__version__}, TF32 {args.tf32}")
print("| case | lstm_infer ms | lstm_layer ms | peer ms | host ms, lstm_infer / lstm_layer |")
print("|---|---:|---:|---:|---|")
for case in args.cases:
    dtype, B, H = harness.parse_case(case)
    torch.manual_seed(0)
    shape = (B, H) if args.cell else (1, B, H)
    x = torch.randn(B, H, device=dev, dtype=dtype) if args.cell else torch.randn(256, B, H, device=dev, dtype=dtype)
    state = (torch.randn(*shape, device=dev, dtype=dtype), torch.randn(*shape, device=dev, dtype=dtype))
    ours = (seqkernels.LSTMCell if args.cell else seqkernels.LSTM)(H, H, device=dev, dtype=dtype)
    peer = (torch.nn.LSTMCell if args.cell else torch.nn.LSTM)(H, H, device=dev, dtype=dtype)
    peer.load_state_dict(ours.state_dict())
    if not args.cell:
        peer.flatten_parameters()

    def call(m):
        def run():
            with torch.no_grad():
                return m(x, state)
        return run

    fns = {"infer_op": call(ours), "layer": through_layer(call(ours)), "peer": call(peer)}
    t = {k: v.median_ms for k, v in harness.measure_interleaved(fns, dev, iters=args.iters).items()}
    host = {k: harness.host_time_us(fns[k], dev, iters=40) / 1e3 for k in ("infer_op", "layer")}
    print(f"| {case} | {t['infer_op']:.3f} | {t['layer']:.3f} | {t['peer']:.3f} | "
          f"{host['infer_op']:.3f} / {host['layer']:.3f} |", flush=True)
