"""Where an eager seqkernels.LSTM call's time beyond its device time goes (GPU).

    python scripts/lstm_eager_gap.py [--iters 30] [--sleep-cycles 600000] [--cases bf16:64:1024 ...]
    python scripts/lstm_eager_gap.py --mode train --sleep-cycles 6000000 --cases fp16:8:512

For each case (T = 256, I = H, random initial states, PyTorch's default TF32 switches, or both
off with --tf32 off) it times, interleaved (benchmarks/harness.py's measure_interleaved): the
eager call, its graph replay, and the eager call behind a device sleep (torch.cuda._sleep) that
its launches queue behind, for seqkernels and for nn.LSTM (cuDNN). (sleep + call) - sleep is the
eager call's device time with the host's launch latency hidden: eager minus that is what the host
adds. Then the profiler's device time per kernel, eager against replayed. With --mode train
the call is the benchmark's training call (forward, output.float().sum(), backward; gradients
cleared before each call, untimed) and there is no graph: the sleep must outlast the call's host
time (~6e6 cycles, ~3 ms); then each part's host time behind a sleep (the module's forward, the
loss, the backward) for both. The device span's idle gaps are the profiler's (its cost per runtime
call inflates them). Diagnostic only: the benchmark is what the tables come from (docs/benchmarks.md, eighth
session).
"""
import argparse
import os
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import harness  # noqa: E402
import seqkernels  # noqa: E402

dev = torch.device("cuda")
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--iters", type=int, default=30, help="timed calls per candidate (>= 20)")
parser.add_argument("--sleep-cycles", type=int, default=600000, help="the sleep's GPU cycles (~0.3 ms on an H200)")
parser.add_argument("--cases", nargs="+", metavar="DTYPE:B:H",
                    default=["bf16:16:1024", "bf16:8:1024", "fp32:8:1024", "fp32:16:1024", "fp32:1:1024",
                             "bf16:16:256"],
                    help="cases as dtype (bf16, fp16, fp32):batch:hidden")
parser.add_argument("--tf32", choices=["default", "off"], default="default",
                    help="off: TF32 off for cuDNN and matmuls, both sides (the benchmark's --tf32 off)")
parser.add_argument("--mode", choices=["infer", "train"], default="infer")
args = parser.parse_args()
harness.set_tf32(False if args.tf32 == "off" else None)
SLEEP = args.sleep_cycles


def parse_case(text):
    try:
        return harness.parse_case(text)
    except ValueError as e:
        parser.error(f"--cases: {e}")


CASES = [parse_case(c) for c in args.cases]


def kernel_times(fn, n=12):
    per = harness.cuda_kernel_times(fn, n, name_chars=70)
    return {k: (len(v) / n, statistics.median(v)) for k, v in per.items()}


def device_span(fn):
    """One call's kernels (profiler): first start to last end, the union of their intervals, and
    the three largest idle gaps between them with the kernels on either side."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end, e.name[:40]) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    if not spans:
        return 0.0, 0.0, []
    busy, gaps, end, last = 0.0, [], spans[0][0], spans[0][2]
    for start, stop, name in spans:
        if start > end:
            gaps.append((start - end, last, name))
        busy += max(0.0, stop - max(start, end))
        if stop > end:
            end, last = stop, name
    return end - spans[0][0], busy, sorted(gaps, reverse=True)[:3]


def host_split(m, x, state, clear_grads, iters=40):
    """Median host time (us) of a training call's three parts, each issued while the GPU sleeps
    (so nothing waits for the device): the module's forward, the loss, loss.backward()."""
    parts = {"forward": [], "loss": [], "backward": []}
    for _ in range(iters + 3):
        clear_grads()
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP)
        t0 = time.perf_counter()
        y = m(x, state)[0]
        t1 = time.perf_counter()
        loss = y.float().sum()
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2)):
            parts[k].append(v * 1e6)
    torch.cuda.synchronize()
    return {k: statistics.median(v[3:]) for k, v in parts.items()}


for dtype, B, H in CASES:
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(256, B, H, generator=g, device=dev, dtype=dtype)
    h0 = torch.randn(1, B, H, generator=g, device=dev, dtype=dtype)
    c0 = torch.randn(1, B, H, generator=g, device=dev, dtype=dtype)
    ours = seqkernels.LSTM(H, H, device=dev, dtype=dtype)
    ref = torch.nn.LSTM(H, H, device=dev, dtype=dtype)
    ref.load_state_dict(ours.state_dict())
    ref.flatten_parameters()  # else cuDNN compacts its weights in every call

    train = args.mode == "train"
    if train:
        x.requires_grad_()

    def mk(m):
        def run():
            if train:
                y = m(x, (h0, c0))[0]
                y.float().sum().backward()
                return y
            with torch.no_grad():
                return m(x, (h0, c0))
        return run

    def clear_grads():
        for p in (*ours.parameters(), *ref.parameters(), x):
            p.grad = None

    fo, fr = mk(ours), mk(ref)
    graphs = {} if train else {"ours_graph": harness.capture_cuda_graph(fo),
                               "cudnn_graph": harness.capture_cuda_graph(fr)}

    def sleep():
        torch.cuda._sleep(SLEEP)

    def behind(fn):
        def run():
            torch.cuda._sleep(SLEEP)
            return fn()
        return run

    fns = {"ours": fo, "ours_behind": behind(fo), "cudnn": fr, "cudnn_behind": behind(fr), "sleep": sleep, **graphs}
    t = harness.measure_interleaved(fns, dev, warmup=3, iters=args.iters, before_each=clear_grads if train else None)
    ms = {k: v.median_ms for k, v in t.items()}
    print(f"\n== {dtype} B={B} H={H} {args.mode}  ({torch.cuda.get_device_name()})")
    print("  " + "  ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    for who in ("ours", "cudnn"):
        graph = f"  graph {ms[who + '_graph']:.3f}" if not train else ""
        print(f"  {who}: eager {ms[who]:.3f}  device(eager) {ms[who + '_behind'] - ms['sleep']:.3f}{graph}")
    if train:
        for who, m in (("ours", ours), ("cudnn", ref)):
            host = host_split(m, x, (h0, c0), clear_grads)
            print(f"  {who} host us (no profiler, median): forward {host['forward']:.1f}, loss {host['loss']:.1f}, "
                  f"backward {host['backward']:.1f}")

    def cleared(fn):
        def run():
            if train:
                clear_grads()
            return fn()
        return run

    for name, fn in (("eager", cleared(fo)),) + (() if train else (("graph", graphs["ours_graph"]),)):
        span, busy, gaps = device_span(fn)
        print(f"  device span of one {name} call {span:.1f}us, kernels busy {busy:.1f}us, idle {span - busy:.1f}us;"
              " largest gaps: " + "; ".join(f"{g:.1f}us after {a} before {b}" for g, a, b in gaps))
        kt = kernel_times(fn)
        print(f"  kernels, ours {name}: " + "; ".join(f"{k} x{c:g} {us:.1f}us" for k, (c, us) in sorted(kt.items(), key=lambda kv: -kv[1][1])[:5]))
