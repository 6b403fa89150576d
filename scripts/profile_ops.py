"""Where a call's GPU time goes: the CUDA kernels of one seqkernels op call, per kernel
(torch.profiler), for the benchmark shapes of the conv suites and the LSTM streaming example.

    python scripts/profile_ops.py [--iters 20]

For each case prints the wall time of a call (host included, as the benchmark's events see
it), the summed kernel time per call, and the kernels sorted by their time. Diagnostic only:
the benchmark scripts are what the tables come from.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import seqkernels

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from harness import synchronize  # noqa: E402


def cases(dev):
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=dev)

    for B, T, C, N, K in ((32, 128, 1, 16, 3), (8, 1024, 6, 256, 3)):
        x, w, h0, b = rnd(B, T, C, N), rnd(C, C, K) / (C * K) ** 0.5, rnd(B, C, N), rnd(C)
        name = f"convrnn B={B} T={T} C={C} N={N} K={K}"

        def infer(x=x, w=w, h0=h0, b=b):
            with torch.no_grad():
                seqkernels.convrnn(x, w, h0, b)

        leaves = [t.clone().requires_grad_() for t in (x, w, h0, b)]

        def train(leaves=leaves):
            for t in leaves:
                t.grad = None
            y, hT = seqkernels.convrnn(*leaves)
            (y.sum() + hT.sum()).backward()

        yield name + " infer", infer
        yield name + " train", train

    for B, T, Ci, C, S, K in ((16, 10, 16, 64, 16, 5), (4, 20, 64, 64, 64, 3)):
        m = seqkernels.ConvLSTM(Ci, C, K, batch_first=True, device=dev)
        x = rnd(B, T, Ci, S, S)
        name = f"convlstm B={B} T={T} Ci={Ci} C={C} {S}x{S} K={K}"

        def c_infer(m=m, x=x):
            with torch.no_grad():
                m(x)

        xl = x.clone().requires_grad_()

        def c_train(m=m, x=xl):
            m.zero_grad(set_to_none=True)
            m(x)[0].sum().backward()

        yield name + " infer", c_infer
        yield name + " train", c_train

    lstm = seqkernels.LSTM(80, 320, num_layers=3, proj_size=160, device=dev).eval()
    chunk = rnd(8, 1, 80)
    with torch.no_grad():
        _, state = lstm(chunk)

    def stream(lstm=lstm, chunk=chunk, state=state):
        with torch.no_grad():
            lstm(chunk, state)

    for dtype in (torch.bfloat16, torch.float32):
        one = seqkernels.LSTM(256, 256, device=dev, dtype=dtype).eval()
        seq = rnd(256, 1, 256).to(dtype)

        def lstm_infer(one=one, seq=seq):
            with torch.no_grad():
                one(seq)

        yield f"lstm B=1 T=256 H=256 {dtype} infer", lstm_infer

    yield "lstm streaming chunk (3 layers, H=320, proj 160, T=8, B=1)", stream


def lstm_batch_cases(dev):
    """float32 `infer` at the batch sizes where the cuBLAS loop trails cuDNN (TF32 on, as
    PyTorch's default): seqkernels.LSTM and nn.LSTM with the same weights, T=256."""
    torch.backends.cudnn.allow_tf32 = True
    g = torch.Generator(device=dev).manual_seed(0)
    for B, H in ((64, 512), (256, 512), (256, 256)):
        peer = torch.nn.LSTM(H, H, device=dev).eval()
        ours = seqkernels.LSTM(H, H, device=dev).eval()
        ours.load_state_dict(peer.state_dict())
        x = torch.randn(256, B, H, generator=g, device=dev)
        for name, m in (("seqkernels", ours), ("nn.LSTM", peer)):
            def infer(m=m, x=x):
                with torch.no_grad():
                    m(x)

            yield f"lstm {name} B={B} H={H} T=256 float32 (TF32) infer", infer


def template_leaves(device):
    """x, weight, h0, bias of the ConvRNN template shape (32, 128, 1, 16, 3), requiring grad."""
    g = torch.Generator(device=device).manual_seed(0)
    B, T, C, N, K = 32, 128, 1, 16, 3
    return [t.requires_grad_() for t in (torch.randn(B, T, C, N, generator=g, device=device),
                                         torch.randn(C, C, K, generator=g, device=device) / K ** 0.5,
                                         torch.randn(B, C, N, generator=g, device=device),
                                         torch.randn(C, generator=g, device=device))]


class TemplateCalls:
    """The host-time probes' calls on the template leaves: ``train(impl)`` (seqkernels.convrnn
    or the reference loop, forward + backward), ``trivial_backward()`` (a one-op backward with
    no seqkernels code); each clears the leaves' gradients first."""

    def __init__(self, device):
        self.leaves = template_leaves(device)

    def clear(self):
        for t in self.leaves:
            t.grad = None

    def train(self, impl=seqkernels.convrnn):
        self.clear()
        y, h_T = impl(*self.leaves, "circular", "tanh")
        (y.float().sum() + h_T.float().sum()).backward()

    def trivial_backward(self):
        self.clear()
        self.leaves[0].sum().backward()


def single_threaded(fn):
    """fn with autograd's device threads off (the backward runs on the calling thread)."""

    def run():
        torch.autograd.set_multithreading_enabled(False)
        try:
            fn()
        finally:
            torch.autograd.set_multithreading_enabled(True)

    return run


def timing_methods(device, iters):
    """The ConvRNN template shape's training call timed several ways: CUDA events (as the
    benchmark's harness: created per call, or created once) or the host clock, alone or right
    after a call of the reference loop (as the interleaved benchmark runs them), with Python's
    garbage collector as is, collected first, or off. Tells a measurement effect from the
    op's own cost."""
    import gc

    from seqkernels.reference import convrnn_reference

    leaves = template_leaves(device)

    def train(impl):
        for t in leaves:
            t.grad = None
        y, h_T = impl(leaves[0], leaves[1], leaves[2], leaves[3], "circular", "tanh")
        (y.float().sum() + h_T.float().sum()).backward()

    def ours():
        train(seqkernels.convrnn)

    def ref_train():
        train(convrnn_reference)

    def ref_infer():
        with torch.no_grad():
            convrnn_reference(*leaves, "circular", "tanh")

    cuda = device.type == "cuda"
    kept = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None

    def timed(clock, gc_off):
        synchronize(device)
        if gc_off:
            gc.disable()
        try:
            if clock == "host" or not cuda:
                t0 = time.perf_counter()
                ours()
                synchronize(device)
                return (time.perf_counter() - t0) * 1e6
            start, end = kept if clock == "events kept" else (torch.cuda.Event(enable_timing=True),
                                                               torch.cuda.Event(enable_timing=True))
            start.record()
            ours()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3
        finally:
            gc.enable()

    variants = [  # (label, what runs before, clock, gc off during the call)
        ("alone", None, "events", False),
        ("alone", None, "events kept", False),
        ("alone", None, "host", False),
        ("after reference train", ref_train, "events", False),
        ("after reference train", ref_train, "host", False),
        ("after reference train, gc.collect()", lambda: (ref_train(), gc.collect()), "host", False),
        ("after reference train, gc off", ref_train, "host", True),
        ("after reference infer", ref_infer, "host", False),
        ("after reference train, 5 ms sleep", lambda: (ref_train(), synchronize(device), time.sleep(0.005)),
         "host", False),
    ]
    for _ in range(5):
        ours()
        ref_train()
    print("\n== convrnn template train (32, 128, 1, 16, 3): one call, median us")
    for label, before, clock, gc_off in variants:
        samples = []
        for _ in range(iters):
            if before is not None:
                before()
            samples.append(timed(clock, gc_off))
        samples.sort()
        print(f"   {clock:11s} {label:46s} {samples[len(samples) // 2]:9.1f} "
              f"(min {samples[0]:.1f})")


def host_breakdown(device, iters, trace_dir):
    """Where the ConvRNN template shape's training call spends its host time, alone and right
    after a reference-loop training call: the host clock around the whole call and around its
    parts (our forward with grad; an autograd backward of a one-op graph, i.e. the engine and
    its device-thread handoff; the same with autograd's device threads off), and the
    profiler's CPU ops of one call (self time, summed over ``iters`` calls). With
    ``trace_dir`` also one Chrome trace per condition."""
    from seqkernels.reference import convrnn_reference

    probe = TemplateCalls(device)
    leaves, clear, train, trivial_backward = probe.leaves, probe.clear, probe.train, probe.trivial_backward

    def forward_only():
        clear()
        seqkernels.convrnn(*leaves, "circular", "tanh")

    single_thread_train = single_threaded(train)

    def ref_train():
        train(convrnn_reference)

    parts = [("train", train), ("forward with grad", forward_only), ("x.sum().backward()", trivial_backward),
             ("train, autograd multithreading off", single_thread_train)]
    for _ in range(5):
        train()
        ref_train()
    print("\n== convrnn template train (32, 128, 1, 16, 3): host clock, median (min) us")
    for cond, before in (("alone", None), ("after reference train", ref_train)):
        for label, fn in parts:
            samples = []
            for _ in range(iters):
                if before is not None:
                    before()
                fn()
                synchronize(device)
                t0 = time.perf_counter()
                fn()
                synchronize(device)
                samples.append((time.perf_counter() - t0) * 1e6)
            samples.sort()
            print(f"   {cond:22s} {label:36s} {samples[len(samples) // 2]:9.1f} ({samples[0]:.1f})")
    for cond, before in (("alone", None), ("after reference train", ref_train)):
        totals: dict[str, list[float]] = {}
        for i in range(iters):
            if before is not None:
                before()
            synchronize(device)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                train()
                synchronize(device)
            for e in prof.key_averages():
                if e.device_type == torch.autograd.DeviceType.CPU:
                    acc = totals.setdefault(e.key, [0.0, 0])
                    acc[0] += e.self_cpu_time_total
                    acc[1] += e.count
            if trace_dir and i == iters - 1:
                prof.export_chrome_trace(os.path.join(trace_dir, f"trace_{cond.split()[0]}.json"))
        print(f"\n== profiler, {cond}: CPU self time per call (us), top 25")
        for key, (us, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:25]:
            print(f"   {us / iters:9.1f}  x{count / iters:4.1f}  {key[:100]}")


def after_reference(device, iters, calls=6):
    """How long the ConvRNN template shape's training call (and a one-op backward with no
    seqkernels code) stays slow after other work: ``calls`` consecutive calls, each timed by
    the host clock between synchronisations, after each of several preludes (the reference
    loop's training call, its forward alone, its training call with autograd's device threads
    off, ~2000 tiny kernel launches without autograd, a 1000-node CUDA backward), with the
    process's page faults and context switches over the first call. Tells which part of the
    preceding work leaves the host slow, and for how many calls."""
    import resource

    from seqkernels.reference import convrnn_reference

    probe = TemplateCalls(device)
    leaves, clear, train, trivial_backward = probe.leaves, probe.clear, probe.train, probe.trivial_backward
    small = torch.randn(64, device=device)

    def ref_train():
        train(convrnn_reference)

    def ref_infer():
        with torch.no_grad():
            convrnn_reference(*leaves, "circular", "tanh")

    ref_train_one_thread = single_threaded(ref_train)

    def launches():
        for _ in range(2000):
            small.add_(1e-7)

    def chain_backward():
        v = leaves[3]
        for _ in range(1000):
            v = v * 1.0001
        clear()
        v.sum().backward()

    preludes = [("nothing", None), ("reference train", ref_train), ("reference forward (no grad)", ref_infer),
                ("reference train, autograd threads off", ref_train_one_thread),
                ("2000 launches, no autograd", launches), ("1000-node CUDA backward", chain_backward)]
    for _ in range(3):
        train()
        ref_train()
    for target_name, target in (("our training call", train), ("x.sum().backward()", trivial_backward)):
        print(f"\n== {target_name} after each prelude: host us per call, median over {iters} "
              f"(call 1 .. {calls} after the prelude); first call's minor faults, vol./invol. switches")
        for label, before in preludes:
            per_call = [[] for _ in range(calls)]
            faults = []
            for _ in range(iters):
                if before is not None:
                    before()
                synchronize(device)
                for i in range(calls):
                    r0 = resource.getrusage(resource.RUSAGE_SELF)
                    t0 = time.perf_counter()
                    target()
                    synchronize(device)
                    per_call[i].append((time.perf_counter() - t0) * 1e6)
                    if i == 0:
                        r1 = resource.getrusage(resource.RUSAGE_SELF)
                        faults.append((r1.ru_minflt - r0.ru_minflt, r1.ru_nvcsw - r0.ru_nvcsw,
                                       r1.ru_nivcsw - r0.ru_nivcsw))
            med = [sorted(c)[len(c) // 2] for c in per_call]
            f = [sorted(x[k] for x in faults)[len(faults) // 2] for k in range(3)]
            print(f"   {label:40s} " + " ".join(f"{m:7.1f}" for m in med) + f"   | {f[0]} {f[1]} {f[2]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cuda", help="cpu only checks that the cases run")
    ap.add_argument("--what", choices=["all", "breakdown", "afterref", "lstm"], default="all",
                    help="breakdown: only the host-time breakdown of the ConvRNN training call; "
                         "afterref: how long that call stays slow after other work; "
                         "lstm: only the kernels of float32 LSTM calls at B = 64 and 256")
    ap.add_argument("--trace-dir", default=None, help="write Chrome traces of the breakdown here")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    device = torch.device(args.device)
    if args.what in ("all", "breakdown"):
        host_breakdown(device, args.iters, args.trace_dir)
    if args.what == "afterref":
        after_reference(device, args.iters)
    if args.what in ("breakdown", "afterref"):
        return
    if args.what == "all":
        timing_methods(device, args.iters)
    for name, fn in (lstm_batch_cases if args.what == "lstm" else cases)(args.device):
        for _ in range(5):
            fn()
        synchronize(device)
        walls = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            walls.append(time.perf_counter() - t0)
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(args.iters):
                fn()
            synchronize(device)
        kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        total = sum(e.self_device_time_total for e in kernels) / args.iters
        wall = sorted(walls)[len(walls) // 2] * 1e6
        print(f"\n== {name}: wall {wall:.1f} us/call (median), kernels {total:.1f} us/call")
        for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:8]:
            print(f"   {e.self_device_time_total / args.iters:9.1f} us  x{e.count / args.iters:5.1f}  {e.key[:110]}")


if __name__ == "__main__":
    main()
