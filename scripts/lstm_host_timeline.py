"""The host's share of an eager seqkernels.LSTM call on the GPU: a timeline of one call.

    python scripts/lstm_host_timeline.py [--iters 10] [--out DIR] [--cpu-ops] [--host-only] [--case TEXT] [--trace-only]
    python scripts/lstm_host_timeline.py --train-host

An eager call's CUDA-event time is the GPU's time plus whatever the GPU waits for the host:
before the time loop's kernel is launched the GPU is mostly idle, so the host work in front
of it (the module's Python, the op's dispatch and checks, allocations, the small launches
before the loop) adds to the call one for one. For each case (the benchmark's shapes: T = 256,
I = H, one layer, PyTorch's default TF32 switches) this traces ``iters`` calls with
torch.profiler and prints, for the call of median length, every CUDA runtime call in order:
its host offset from the call's start, its host duration, the kernel or memset it issued and
when that ran on the GPU (offsets in us). The summary line gives the host time until the loop
kernel's launch and the GPU's idle time before it. Then the median time of lstm_layer's training
call (CUDA events, 30 interleaved calls, each after an untimed one: benchmarks/harness.py's
measure_interleaved) with the op's eager autograd.Function (seqkernels.ops._autograd.
register_autograd, the default) and with the op's registered torch.library formula. Last, the
host time (no profiler) of an `infer` call's layers: the module call, its lstm_infer operator,
the functional lstm_layer, the op below autograd, a default zero state, and
for scale one allocation and one small kernel. With --cpu-ops, each `infer` case also lists
the operators the call ran on the host (the profiler's cpu_op events: the module's, the op's
own span and the allocations and copies inside it; a train case's autograd nodes too). --case traces only the cases whose name
contains the text (e.g. "B=16 H=1024"); the host-time table always covers its four shapes.
--trace-only stops after the traced cases. --train-host prints only train_host_breakdown's tables (a training call's parts).
Diagnostic only: the benchmark is what the tables come from.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import seqkernels

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import harness  # noqa: E402

LOOP_KERNELS = ("lstm_persistent", "lstm_fused", "lstm_forward_step", "lstm_backward_step")


def cases(device):
    g = torch.Generator(device=device).manual_seed(0)
    for dtype, B, H, mode in (
        (torch.bfloat16, 1, 256, "infer"),
        (torch.bfloat16, 16, 512, "infer"),
        (torch.bfloat16, 16, 1024, "infer"),
        (torch.float32, 16, 1024, "infer"),
        (torch.float32, 1, 512, "infer"),
        (torch.float32, 1, 512, "train"),
        (torch.float32, 8, 512, "train"),
        (torch.float16, 8, 512, "train"),
        (torch.bfloat16, 16, 256, "train"),
    ):
        m = seqkernels.LSTM(H, H, device=device, dtype=dtype)
        x = torch.randn(256, B, H, generator=g, device=device, dtype=dtype)
        if mode == "infer":

            def call(m=m, x=x):
                with torch.no_grad():
                    m(x)

        else:
            xg = x.clone().requires_grad_()

            def call(m=m, x=xg):
                for p in (*m.parameters(), x):
                    p.grad = None
                y, _ = m(x)
                y.float().sum().backward()

        yield f"{str(dtype).replace('torch.', '')} B={B} H={H} {mode}", call


def timeline(trace_path):
    """The trace's calls: per ``call`` annotation, its runtime events (host) and what they ran."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    calls = sorted((e for e in events if e.get("name") == "call" and e.get("cat") == "user_annotation"),
                   key=lambda e: e["ts"])
    runtime = [e for e in events if e.get("cat") == "cuda_runtime" and e.get("ph") == "X"]
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    device_work = {e["args"].get("correlation"): e for e in events
                   if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and e.get("ph") == "X"}
    out = []
    for c in calls:
        t0, t1 = c["ts"], c["ts"] + c["dur"]
        rows = []
        for r in sorted((r for r in runtime if t0 <= r["ts"] <= t1), key=lambda r: r["ts"]):
            work = device_work.get(r["args"].get("correlation"))
            rows.append((r["ts"] - t0, r["dur"], r["name"], work and work["name"],
                         work and work["ts"] - t0, work and work["ts"] + work["dur"] - t0))
        gpu = [row for row in rows if row[4] is not None]
        end = max((row[5] for row in gpu), default=c["dur"])
        ops = [(o["ts"] - t0, o["dur"], o["name"]) for o in sorted(cpu_ops, key=lambda o: o["ts"])
               if t0 <= o["ts"] <= t1]
        out.append((end, c["dur"], rows, ops))
    return out


def compare_autograd(device):
    """lstm_layer's training call (the path torch.compile and torch.func take; the module's eager
    call takes lstm_padded) with the op's eager autograd.Function (call_op's direct apply) against
    the op's registered torch.library formula."""
    from seqkernels.ops import _autograd
    from seqkernels.ops.lstm import lstm_layer

    applies = dict(_autograd._EAGER_APPLY)

    class Registered:
        """Stands in for an op's autograd.Function: the op itself through the dispatcher, so that
        torch.library's autograd kernel records it (the Function's extra arguments dropped)."""

        def __init__(self, op):
            self.op, self.n = op, len(op._schema.arguments)

        def apply(self, *args):
            return self.op(*args[: self.n])

    registered = {op: Registered(op).apply for op in applies}

    def recording_through(table, call):
        def run():
            _autograd._EAGER_APPLY.clear()
            _autograd._EAGER_APPLY.update(table)
            call()

        return run

    print("\n== lstm_layer train calls: eager autograd.Function against the registered torch.library formula (ms)")
    for dtype, B, H in ((torch.float32, 8, 512), (torch.float16, 8, 512), (torch.bfloat16, 16, 256)):
        m = seqkernels.LSTM(H, H, device=device, dtype=dtype)
        x = torch.randn(256 * B, H, device=device, dtype=dtype, requires_grad=True)
        bs = torch.full((256,), B, dtype=torch.int64)
        h0 = torch.zeros(B, H, device=device, dtype=dtype)
        w = (m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0, m.bias_hh_l0)

        def call():
            for p in (*m.parameters(), x):
                p.grad = None
            lstm_layer(x, bs, h0, h0, *w)[0].float().sum().backward()

        try:
            times = harness.measure_interleaved(
                {"function": recording_through(applies, call), "registered": recording_through(registered, call)},
                device, iters=30)
        finally:
            _autograd._EAGER_APPLY.clear()
            _autograd._EAGER_APPLY.update(applies)
        f, r = times["function"].median_ms, times["registered"].median_ms
        name = f"{str(dtype).replace('torch.', '')} B={B} H={H}"
        print(f"   {name:28s} function {f:.3f}  registered {r:.3f}  ({(r - f) * 1e3:.0f} us less)")


def host_breakdown(device):
    from seqkernels.ops.lstm import lstm_infer, lstm_layer

    op = torch.ops.seqkernels.lstm_forward.default
    print("\n== host time of an infer call's layers (us, median of 60, no profiler)")
    for dtype, B, H in ((torch.bfloat16, 1, 256), (torch.float32, 16, 512), (torch.bfloat16, 16, 1024),
                        (torch.float32, 16, 1024)):
        m = seqkernels.LSTM(H, H, device=device, dtype=dtype)
        x = torch.randn(256, B, H, device=device, dtype=dtype)
        x2 = x.reshape(256 * B, H)
        bs = torch.full((256,), B, dtype=torch.int64)
        h0 = torch.zeros(B, H, device=device, dtype=dtype)
        w = (m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0, m.bias_hh_l0)
        args = (x2, bs, h0, h0, *w, None, False, False)
        with torch.no_grad():
            rows = {
                "module call": lambda: m(x),
                "lstm_infer (the module's op)": lambda: lstm_infer(x, None, None, *w, False),
                "lstm_layer": lambda: lstm_layer(x2, bs, h0, h0, *w),
                "op below autograd": lambda: _below(op, args),
                "zero state (torch.zeros)": lambda: torch.zeros(2, 1, B, H, device=device, dtype=dtype),
                "one allocation (torch.empty)": lambda: torch.empty(B, H, device=device, dtype=dtype),
                "a small kernel (torch.neg)": lambda: torch.neg(h0),
                "torch.full batch_sizes (CPU)": lambda: torch.full((256,), B, dtype=torch.int64),
            }
            for label, fn in rows.items():
                for _ in range(5):
                    fn()
                us = harness.host_time_us(fn, device)
                print(f"   {str(dtype).replace('torch.', '')} B={B} H={H}  {label:30s} {us:8.1f}")


def train_host_breakdown(device, iters=60):
    """Host time of a training call's parts (us, median of ``iters``), each timed twice: the GPU idle
    (drained first), and the GPU asleep (behind a device sleep, as the backward's launches are
    behind the forward's loop); then the host operators of ten calls (profiler, CPU only: no CUDA
    runtime tracing, whose own cost per runtime call distorts a timeline)."""
    from torch.profiler import ProfilerActivity as PA

    from seqkernels.ops import _autograd
    from seqkernels.ops.lstm import lstm_layer

    fwd_op = torch.ops.seqkernels.lstm_forward.default
    bwd_op = torch.ops.seqkernels.lstm_backward.default
    print("\n== host time of a train call's parts (us, median of 60, no profiler): the GPU idle, the GPU asleep")
    for dtype, B, H in ((torch.float16, 8, 512), (torch.bfloat16, 16, 256)):
        m = seqkernels.LSTM(H, H, device=device, dtype=dtype)
        x = torch.randn(256, B, H, device=device, dtype=dtype, requires_grad=True)
        x2 = x.detach().reshape(256 * B, H)
        x2g = x2.clone().requires_grad_()
        bs = torch.full((256,), B, dtype=torch.int64)
        h0 = torch.randn(B, H, device=device, dtype=dtype)
        w = (m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0, m.bias_hh_l0)
        args = (x2, bs, h0, h0, *w, None, False, True)
        with torch.no_grad():
            y, h_n, c_n, gates, cells = _below(fwd_op, args)
        dy = torch.randn_like(y)
        bargs = (dy, torch.zeros_like(h_n), torch.zeros_like(c_n), x2, bs, h0, h0, w[0], w[1], None, y, gates,
                 cells, False, True)

        def clear():
            for p in (*m.parameters(), x, x2g):
                p.grad = None

        state = {}

        def forward():
            state["y"] = m(x)[0]

        def loss():
            state["loss"] = state["y"].float().sum()

        def backward():
            state["loss"].backward()

        rows = {
            "module forward (records grad)": (clear, forward),
            "  lstm_layer (records grad)": (clear, lambda: lstm_layer(x2g, bs, h0, h0, *w)),
            "  Function.apply": (clear, lambda: _autograd._EAGER_FUNCTIONS[fwd_op].apply(*args)),
            "  op below autograd, training": (clear, lambda: _below(fwd_op, args)),
            "loss (y.float().sum())": (lambda: (clear(), forward()), loss),
            "loss.backward()": (lambda: (clear(), forward(), loss()), backward),
            "  backward op below autograd": (clear, lambda: _below(bwd_op, bargs)),
            "  torch.zeros_like(h_n)": (clear, lambda: torch.zeros_like(h_n)),
            "one small kernel (torch.neg)": (clear, lambda: torch.neg(h0)),
            "one allocation (torch.empty)": (clear, lambda: torch.empty(B, H, device=device, dtype=dtype)),
            "pure Python (300-term sum)": (clear, lambda: sum(i * i for i in range(300))),
        }
        for label, (before, fn) in rows.items():
            medians = []
            for asleep in (False, True):
                samples = []
                for i in range(iters + 5):
                    before()
                    torch.cuda.synchronize()
                    if asleep:
                        torch.cuda._sleep(4_000_000)
                    t0 = time.perf_counter()
                    fn()
                    samples.append((time.perf_counter() - t0) * 1e6)
                torch.cuda.synchronize()
                medians.append(statistics.median(samples[5:]))
            print(f"   {str(dtype).replace('torch.', '')} B={B} H={H}  {label:32s} {medians[0]:8.1f} {medians[1]:8.1f}")
        for _ in range(3):
            clear(), forward(), loss(), backward()
        torch.cuda.synchronize()
        with profile(activities=[PA.CPU]) as prof:
            for _ in range(10):
                clear()
                torch.cuda.synchronize()
                torch.cuda._sleep(4_000_000)
                forward(), loss(), backward()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))


def _below(op, args):
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=None, help="keep the Chrome traces here")
    ap.add_argument("--host-only", action="store_true", help="only the host-time breakdown (no profiler)")
    ap.add_argument("--train-host", action="store_true",
                    help="only the host time of a train call's parts and its host operators (no CUDA tracing)")
    ap.add_argument("--case", default=None, help="only the traced cases whose name contains this, e.g. 'B=16 H=1024'")
    ap.add_argument("--cpu-ops", action="store_true",
                    help="also list each traced call's operators on the host (allocations, copies, the op itself)")
    ap.add_argument("--trace-only", action="store_true",
                    help="only the traced cases (no autograd comparison, no host-time table)")
    args = ap.parse_args()
    device = torch.device("cuda")
    if args.train_host:
        train_host_breakdown(device)
        return
    if args.host_only:
        host_breakdown(device)
        return
    out_dir = args.out or tempfile.mkdtemp()
    os.makedirs(out_dir, exist_ok=True)
    for name, call in cases(device):
        if args.case and args.case not in name:
            continue
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                torch.cuda.synchronize()
                with record_function("call"):
                    call()
                torch.cuda.synchronize()
        path = os.path.join(out_dir, name.replace(" ", "_").replace("=", "") + ".json")
        prof.export_chrome_trace(path)
        calls = sorted(timeline(path), key=lambda c: c[0])
        end, host, rows, ops = calls[len(calls) // 2]
        print(f"\n== {name}: median call {end:.1f} us until its last GPU work (host {host:.1f} us); "
              f"{len(rows)} runtime calls")
        print(f"   {'host at':>8s} {'dur':>6s}  {'runtime call':28s} {'gpu start':>9s} {'gpu end':>8s}  issued")
        for at, dur, api, work, ws, we in rows:
            gpu = f"{ws:9.1f} {we:8.1f}" if work else f"{'':9s} {'':8s}"
            print(f"   {at:8.1f} {dur:6.1f}  {api[:28]:28s} {gpu}  {(work or '')[:70]}")
        loops = [r for r in rows if r[3] and any(k in r[3] for k in LOOP_KERNELS)]
        if loops:
            first = loops[0]
            busy = sum(r[5] - r[4] for r in rows if r[4] is not None and r[5] <= first[4])
            print(f"   first loop kernel launched at {first[0]:.1f} us (host), ran from {first[4]:.1f} us; "
                  f"GPU busy before it {busy:.1f} us")
        if args.cpu_ops:
            print(f"   the call's operators on the host (profiler's cpu_op events, nested ones included):")
            print(f"   {'host at':>8s} {'dur':>6s}  operator")
            for at, dur, op_name in ops:
                print(f"   {at:8.1f} {dur:6.1f}  {op_name[:90]}")
    if args.trace_only:
        return
    compare_autograd(device)
    host_breakdown(device)


if __name__ == "__main__":
    main()
