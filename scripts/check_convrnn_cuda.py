"""Direct checks of the CUDA ConvRNN ops (torch.ops.seqkernels.convrnn_forward / _backward)
against the plain reference loop (seqkernels/reference/convrnn.py) in float64 with autograd,
for compute-sanitizer runs and quick timings. Independent of the Python op layer.

    python scripts/check_convrnn_cuda.py              # the sweep below, every dtype
    python scripts/check_convrnn_cuda.py --small      # a few small shapes (for compute-sanitizer)
    python scripts/check_convrnn_cuda.py --bench      # + kernel vs reference-loop timings
    python scripts/check_convrnn_cuda.py --bad-inputs # + direct op calls with invalid arguments

--bad-inputs: on the H200 machine (2026-11-21) the first such call (h0 of batch 1 for B = 2,
CUDA tensors) crashed the process with a segmentation fault inside the op's redispatch instead
of raising; the same calls on CPU tensors raise. Under investigation, hence opt-in.

Every configuration checks y, h_T, grad_x, grad_weight, grad_bias and grad_h0 by relative
Frobenius error, and that two backward calls agree bit for bit. Exits non-zero on a mismatch.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import seqkernels  # noqa: F401  (registers torch.ops.seqkernels)
from seqkernels.reference.convrnn import convrnn_reference

FWD = torch.ops.seqkernels.convrnn_forward.default
BWD = torch.ops.seqkernels.convrnn_backward.default
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 8e-2, torch.float16: 1.5e-2}
# relu in 16-bit types: where the rounded state sits at the kink, act' differs from the float64
# reference's, so the gradients carry a larger (and legitimate) relative error.
TOL_RELU16 = {torch.bfloat16: 1.5e-1, torch.float16: 5e-2}

# (B, T, C, N, K, circular, relu, bias)
FULL = [
    (3, 5, 2, 7, 3, True, False, True),
    (2, 1, 1, 1, 1, False, True, False),
    (2, 4, 3, 2, 2, True, False, True),
    (1, 7, 2, 3, 5, False, False, True),  # zero padding wider than the ring
    (4, 33, 3, 5, 4, True, True, True),  # even K
    (2, 100, 1, 16, 3, True, False, False),  # the template shape's layout, several staged chunks
    (2, 40, 6, 256, 3, True, False, True),  # the benchmark's large shape (cluster G = 8)
    (2, 23, 5, 129, 6, False, True, True),
    (1, 6, 40, 300, 3, True, False, True),  # C·N = 12000 (> 8 · 1024: no cluster), tiled
    (2, 7, 4, 257, 3, True, False, True),  # tiled, a partial last tile
    (1, 5, 8, 130, 3, False, True, True),  # tiled, zero padding, a partial last tile
    (1, 5, 3, 345, 5, True, True, False),  # C·N > 1024 with K = 5, N odd: the per-unit kernels
    # The cluster forward (C·N >= 1024, N split into G = 8 or 4 equal segments of >= K units, C·N / G <= 512);
    # every configuration with C·N >= 1024 also runs with SEQKERNELS_CONVRNN_CLUSTER=0 (one block):
    (3, 11, 4, 256, 4, True, True, True),  # even K (L = 2, R = 1), G = 8
    (2, 9, 2, 512, 5, False, False, True),  # zero padding, K = 5, G = 8
    (1, 13, 16, 64, 3, True, False, False),  # 16 channels, segments of 8 units
    (2, 6, 4, 256, 1, True, True, True),  # K = 1 (no halo), G = 8
    (1, 20, 2, 516, 7, True, False, True),  # G = 4 (516 / 8 is not whole)
    (1, 7, 26, 40, 5, True, True, True),  # segments exactly K = 5 units wide, G = 8, halos every 2 steps
    (2, 30, 4, 1024, 3, False, False, True),  # G = 8, halos every step (no threads for wider ones)
]
SMALL = [FULL[0], FULL[2], FULL[3], (2, 9, 3, 40, 3, False, True, True), (2, 7, 4, 257, 3, True, False, True),
         (2, 9, 4, 256, 3, True, False, True), (1, 5, 2, 516, 4, False, True, True)]


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(cfg, dtype, dev):
    B, T, C, N, K, circular, relu, has_bias = cfg
    g = torch.Generator(device="cpu").manual_seed(hash(cfg) % (2**31))
    scale = 0.9 / (C * K) ** 0.5
    x = torch.randn(B, T, C, N, generator=g).to(dtype)
    w = (torch.randn(C, C, K, generator=g) * scale).to(dtype)
    b = (torch.randn(C, generator=g) * 0.1).to(dtype) if has_bias else None
    h0 = torch.randn(B, C, N, generator=g).to(dtype)
    gy = torch.randn(B, T, C, N, generator=g).to(dtype)
    ghT = torch.randn(B, C, N, generator=g).to(dtype)
    pm, nl = (0 if circular else 1), (1 if relu else 0)

    # Reference: float64 on the CPU, autograd.
    leaves = [t.double().requires_grad_() for t in (x, w, h0)] + ([b.double().requires_grad_()] if has_bias else [])
    xr, wr, hr = leaves[:3]
    br = leaves[3] if has_bias else None
    yr, hTr = convrnn_reference(xr, wr, hr, br, "circular" if circular else "zeros", "relu" if relu else "tanh")
    grads = torch.autograd.grad((yr * gy.double()).sum() + (hTr * ghT.double()).sum(), leaves)

    d = lambda t: None if t is None else t.to(dev)  # noqa: E731
    y, hT = FWD(d(x), d(w), d(b), d(h0), pm, nl)
    gx, gw, gb, gh0 = BWD(d(gy), d(ghT), d(w), d(h0), y, pm, nl, has_bias)
    gx2, gw2, gb2, gh02 = BWD(d(gy), d(ghT), d(w), d(h0), y, pm, nl, has_bias)
    torch.cuda.synchronize()
    errs = {
        "y": rel(y.cpu(), yr.detach()),
        "h_T": rel(hT.cpu(), hTr.detach()),
        "grad_x": rel(gx.cpu(), grads[0]),
        "grad_w": rel(gw.cpu(), grads[1]),
        "grad_h0": rel(gh0.cpu(), grads[2]),
    }
    if has_bias:
        errs["grad_b"] = rel(gb.cpu(), grads[3])
    else:
        assert gb.shape == (0,), gb.shape
    det = all(torch.equal(a, c) for a, c in ((gx, gx2), (gw, gw2), (gb, gb2), (gh0, gh02)))
    worst = max(errs.values())
    tol = TOL_RELU16[dtype] if relu and dtype in TOL_RELU16 else TOL[dtype]
    ok = worst <= tol and det and all(torch.isfinite(t).all() for t in (y, hT, gx, gw, gh0))
    cluster = os.environ.get("SEQKERNELS_CONVRNN_CLUSTER", "1")
    print(f"{'ok  ' if ok else 'FAIL'} {cfg} cluster={cluster} {str(dtype):15s} worst {worst:.2e} deterministic={det} "
          + " ".join(f"{k}={v:.1e}" for k, v in errs.items()), flush=True)
    return ok


def bad_inputs(dev):
    """The CUDA ops must raise, not crash, on bad arguments."""
    x = torch.randn(2, 3, 2, 5, device=dev)
    w = torch.randn(2, 2, 3, device=dev)
    h0 = torch.randn(2, 2, 5, device=dev)
    n = 0
    for i, args in enumerate([
        (x, w, None, h0[:1], 0, 0),
        (x, torch.randn(2, 2, 7, device=dev), None, h0, 0, 0),  # circular K > N
        (x, w, None, h0, 2, 0),
        (x, w, None, h0.cpu(), 0, 0),
        (x, w.double(), None, h0, 0, 0),
    ]):
        print(f"bad input {i} ...", flush=True)
        try:
            FWD(*args)
        except (RuntimeError, TypeError, ValueError) as e:
            print(f"  raised {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
            n += 1
    print(f"bad inputs raised: {n}/5", flush=True)
    return n == 5


def bench(dev):
    """Median times of the kernel and the reference loop (float32, on the GPU)."""

    def timeit(fn, reps):
        for _ in range(3):
            fn()
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        return statistics.median(ts)

    for B, T, C, N, K in [(32, 128, 1, 16, 3), (8, 1024, 6, 256, 3)]:
        x = torch.randn(B, T, C, N, device=dev)
        w = (torch.randn(C, C, K, device=dev) * 0.5 / (C * K) ** 0.5).requires_grad_()
        b = (torch.randn(C, device=dev) * 0.1).requires_grad_()
        h0 = torch.randn(B, C, N, device=dev)
        xg = x.clone().requires_grad_()

        def k_inf():
            with torch.no_grad():
                FWD(x, w, b, h0, 0, 0)

        def k_train():
            y, hT = FWD(x, w.detach(), b.detach(), h0, 0, 0)
            BWD(torch.ones_like(y), torch.zeros_like(hT), w.detach(), h0, y, 0, 0, True)

        def r_inf():
            with torch.no_grad():
                convrnn_reference(x, w, h0, b)

        def r_train():
            y, hT = convrnn_reference(xg, w, h0, b)
            y.sum().backward()

        reps_r = 5 if T > 500 else 10
        ki, kt = timeit(k_inf, 30), timeit(k_train, 30)
        ri, rt = timeit(r_inf, reps_r), timeit(r_train, reps_r)
        print(f"bench B={B} T={T} C={C} N={N} K={K} [{torch.cuda.get_device_name()}]: "
              f"infer kernel {ki*1e3:.1f} us, reference {ri*1e3:.1f} us, {ri/ki:.0f}x; "
              f"train kernel {kt*1e3:.1f} us, reference {rt*1e3:.1f} us, {rt/kt:.0f}x", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--bad-inputs", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    ok = True
    cfgs = SMALL if args.small else FULL
    dtypes = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
    for cfg in cfgs:
        B, T, C, N, K = cfg[:5]
        for cluster in ("1", "0") if C * N >= 1024 else ("1",):
            os.environ["SEQKERNELS_CONVRNN_CLUSTER"] = cluster  # read by the op at every call
            for dt in dtypes:
                ok &= check(cfg, dt, dev)
    os.environ.pop("SEQKERNELS_CONVRNN_CLUSTER", None)
    if args.bench:
        bench(dev)
    if args.bad_inputs:
        ok &= bad_inputs(dev)
    print("ALL OK" if ok else "FAILURES", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
