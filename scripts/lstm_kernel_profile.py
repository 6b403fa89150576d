"""Device time by kernel of one seqkernels.LSTM call beside nn.LSTM's (GPU, profiler): where a call's
device time goes.

    python scripts/lstm_kernel_profile.py [--mode train] [--cases fp16:64:1024 ...] [--calls 5]

For each case (T = 256, I = H, random initial states; --mode train: forward, output.float().sum(),
backward, every gradient) it profiles --calls calls of each module after warm-up and prints, per
kernel name, the calls a module call makes and their device time per module call (µs), largest first,
and the sum. Diagnostic only: the benchmark is what the tables come from.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import harness  # noqa: E402
import seqkernels  # noqa: E402
from seqkernels._config import lstm_loop_choice  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--cases", nargs="+", metavar="DTYPE:B:H", default=["fp16:64:1024"],
                    help="cases as dtype (bf16, fp16, fp32):batch:hidden")
parser.add_argument("--mode", choices=["infer", "train"], default="train")
parser.add_argument("--calls", type=int, default=5, help="profiled calls per module")
parser.add_argument("--top", type=int, default=12, help="kernels listed per module")
args = parser.parse_args()
dev = torch.device("cuda")


def by_kernel(fn, calls):
    """{kernel name: (launches a call, µs a call)}."""
    per = harness.cuda_kernel_times(fn, calls)
    return {k: (len(v) / calls, sum(v) / calls) for k, v in per.items()}


for text in args.cases:
    dtype, B, H = harness.parse_case(text)
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(256, B, H, generator=g, device=dev, dtype=dtype, requires_grad=args.mode == "train")
    h0 = torch.randn(1, B, H, generator=g, device=dev, dtype=dtype)
    c0 = torch.randn(1, B, H, generator=g, device=dev, dtype=dtype)
    ours = seqkernels.LSTM(H, H, device=dev, dtype=dtype)
    ref = torch.nn.LSTM(H, H, device=dev, dtype=dtype)
    ref.load_state_dict(ours.state_dict())
    ref.flatten_parameters()
    print(f"\n== {dtype} B={B} H={H} {args.mode} ({torch.cuda.get_device_name()}), loops: "
          f"{lstm_loop_choice(B, H, dtype=dtype, device='cuda')}")
    for who, m in (("seqkernels", ours), ("cuDNN", ref)):
        def call(m=m):
            if args.mode == "train":
                for p in (*m.parameters(), x):
                    p.grad = None
                m(x, (h0, c0))[0].float().sum().backward()
            else:
                with torch.no_grad():
                    m(x, (h0, c0))
        rows = sorted(by_kernel(call, args.calls).items(), key=lambda kv: -kv[1][1])
        print(f"  {who}: {sum(us for _, us in (v for _, v in rows)):.1f} us of kernels a call")
        for name, (n, us) in rows[:args.top]:
            print(f"    {us:9.1f} us  x{n:<6g} {name}")
