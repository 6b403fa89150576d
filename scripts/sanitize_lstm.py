"""Small forward + backward runs of the CUDA LSTM ops, for compute-sanitizer and smoke checks.

    compute-sanitizer --tool memcheck python scripts/sanitize_lstm.py
    python scripts/sanitize_lstm.py --extra        # + CUDA-graph capture and a > 65535-step sequence
    python scripts/sanitize_lstm.py --backend persistent   # SEQKERNELS_LSTM_BACKEND for the run
    python scripts/sanitize_lstm.py --backend fused        # the fused-step loop (and its own shapes)
    python scripts/sanitize_lstm.py --mode infer           # only the inference cases (or --mode train)
    python scripts/sanitize_lstm.py --one-cluster          # only the one-cluster kernels' cases (forward, backward)
    python scripts/sanitize_lstm.py --cluster              # only the cluster forward kernel's cases
    python scripts/sanitize_lstm.py --cluster --dtype float32  # ... and of those only float32's
    python scripts/sanitize_lstm.py --direct-x3            # only the direct kernel's float32 cases without TF32
    python scripts/sanitize_lstm.py --replayed             # only the cuBLAS loop's replayed cases (projected, ragged)

Every dtype (float64, float32, bfloat16, float16) x projection or not x forward or reverse
direction x training or inference, on packed sequences with awkward sizes; each result is
compared with a plain float64 loop on the CPU (autograd for the gradients) by relative
Frobenius error. With --backend persistent the sweep also covers float32 with TF32 off (the
FFMA kernels) and two larger shapes that reach the persistent kernel's other code paths
(several m16 batch tiles; the X tile loaded in column chunks); with --backend fused, shapes
that reach the fused-step loop's other geometries (2 and 8 units per block, several m16 tiles
and batch blocks, a K tail inside a chunk). Run under compute-sanitizer
with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that every tensor is its own allocation and an
out-of-bounds access cannot land inside a pooled block. Exits non-zero on a mismatch or a
non-finite value.
"""
from __future__ import annotations

import argparse
import copy
import contextlib
import itertools
import os
import sys
import time

import torch

import seqkernels  # noqa: F401  (registers torch.ops.seqkernels)

FWD = torch.ops.seqkernels.lstm_forward.default
BWD = torch.ops.seqkernels.lstm_backward.default

# Relative error bounds of these smoke checks (float32 may run on TF32, cuDNN's default).
TOL = {torch.float64: 1e-9, torch.float32: 5e-3, torch.bfloat16: 6e-2, torch.float16: 1e-2}


def reference(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
    """Plain loop over time on packed rows, differentiable (no in-place updates)."""
    bs = batch_sizes.tolist()
    offs = [0]
    for b in bs:
        offs.append(offs[-1] + b)
    H = w_ih.shape[0] // 4
    h, c = h0, c0
    ys = [None] * len(bs)
    order = range(len(bs) - 1, -1, -1) if reverse else range(len(bs))
    for t in order:
        bt, off = bs[t], offs[t]
        pre = x[off : off + bt] @ w_ih.T + h[:bt] @ w_hh.T
        if b_ih is not None:
            pre = pre + b_ih + b_hh
        i, f, g, o = pre.split(H, dim=1)
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
        c_new = f * c[:bt] + i * g
        m = o * c_new.tanh()
        h_new = m if w_hr is None else m @ w_hr.T
        ys[t] = h_new
        h = torch.cat([h_new, h[bt:]])
        c = torch.cat([c_new, c[bt:]])
    return torch.cat(ys), h, c


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a = a.detach().double().cpu()
    ref = ref.detach().double().cpu()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_case(dtype, proj, has_bias, batch_sizes, I, H, gen):
    P = 3 if proj else 0
    Hout = P or H
    G = 4 * H
    B = batch_sizes[0]
    N = sum(batch_sizes)
    scale = H**-0.5

    def r(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * s).to(dtype)

    t = dict(
        x=r(N, I),
        h0=r(B, Hout, s=0.5),
        c0=r(B, H, s=0.5),
        w_ih=r(G, I, s=scale),
        w_hh=r(G, Hout, s=scale),
        b_ih=r(G, s=0.1) if has_bias else None,
        b_hh=r(G, s=0.1) if has_bias else None,
        w_hr=r(P, H, s=scale) if proj else None,
    )
    return t, torch.tensor(batch_sizes, dtype=torch.int64)


def run_case(dtype, proj, reverse, training, has_bias, batch_sizes, I, H, gen) -> tuple[bool, str]:
    t, bs = make_case(dtype, proj, has_bias, batch_sizes, I, H, gen)
    dev = {k: (v.cuda() if v is not None else None) for k, v in t.items()}
    args = (dev["x"], bs, dev["h0"], dev["c0"], dev["w_ih"], dev["w_hh"], dev["b_ih"], dev["b_hh"], dev["w_hr"])
    y, h_n, c_n, gates, cells = FWD(*args, reverse, training)

    ref_in = {k: (v.double().requires_grad_(training) if v is not None else None) for k, v in t.items()}
    ry, rh, rc = reference(
        ref_in["x"], bs, ref_in["h0"], ref_in["c0"], ref_in["w_ih"], ref_in["w_hh"], ref_in["b_ih"], ref_in["b_hh"],
        ref_in["w_hr"], reverse,
    )
    errs = {"y": rel_err(y, ry), "h_n": rel_err(h_n, rh), "c_n": rel_err(c_n, rc)}
    if not training:
        ok_shapes = gates.shape[0] == 0 and cells.shape[0] == 0
        errs["saved"] = 0.0 if ok_shapes else float("inf")
    else:
        gy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
        gh = torch.randn(h_n.shape, generator=gen, dtype=torch.float64)
        gc = torch.randn(c_n.shape, generator=gen, dtype=torch.float64)
        grads = BWD(
            gy.to(dtype).cuda(), gh.to(dtype).cuda(), gc.to(dtype).cuda(), dev["x"], bs, dev["h0"], dev["c0"],
            dev["w_ih"], dev["w_hh"], dev["w_hr"], y, gates, cells, reverse, has_bias,
        )
        loss = (ry * gy).sum() + (rh * gh).sum() + (rc * gc).sum()
        names = ["x", "h0", "c0", "w_ih", "w_hh"] + (["b_ih"] if has_bias else []) + (["w_hr"] if proj else [])
        ref_grads = torch.autograd.grad(loss, [ref_in[n] for n in names])
        got = {"x": grads[0], "h0": grads[1], "c0": grads[2], "w_ih": grads[3], "w_hh": grads[4]}
        if has_bias:
            got["b_ih"] = grads[5]
        else:
            errs["grad_bias_shape"] = 0.0 if tuple(grads[5].shape) == (0,) else float("inf")
        if proj:
            got["w_hr"] = grads[6]
        else:
            errs["grad_w_hr_shape"] = 0.0 if tuple(grads[6].shape) == (0, 0) else float("inf")
        for n, rg in zip(names, ref_grads):
            errs["d" + n] = rel_err(got[n], rg)
    torch.cuda.synchronize()
    worst = max(errs.values())
    ok = worst <= TOL[dtype]
    tag = (
        f"{str(dtype).replace('torch.', ''):8s} proj={int(proj)} rev={int(reverse)} train={int(training)} "
        f"bias={int(has_bias)} bs={batch_sizes} I={I} H={H}"
    )
    detail = " ".join(f"{k}={v:.1e}" for k, v in errs.items())
    return ok, f"{'ok  ' if ok else 'FAIL'} {tag}  worst={worst:.1e}  {detail}"


@contextlib.contextmanager
def rnn_tf32(allowed: bool):
    """TF32 for float32 RNNs on or off (what both CUDA backends follow), restored afterwards."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved


# The one-cluster forward and backward kernels (16-bit, B <= 64, H in {128, 256, 512}, sm_90: one
# thread-block cluster of H / 32 blocks per 8 batch rows, h (dG) sent with bulk copies into every
# block's shared memory of its cluster): one cluster, two (B = 12, the second half empty) and three
# (B = 20); then packed sequences, whose groups run different numbers of steps (the second group of
# [12, 9, 9, 3] one step, of [20, 17, 9, 4] three and two) and whose rows sit out steps (both
# directions: in reverse they start late from h0); at H = 512 eight clusters of 16 blocks (more than
# an H200 holds at once: 4 clusters of two batch groups run them, paired_groups; with
# SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS=1 every equal-sized H = 512 case pairs, B = 8 with an empty second
# group; =0, in waves, one_cluster_waves) and six, packed; each case runs
# inference and training, so both kernels run.
ONE_CLUSTER_CASES = [([8, 8, 8], 8, 512, torch.bfloat16, True), ([3, 3], 8, 128, torch.float16, True),
                     ([5, 5, 5, 5], 8, 256, torch.bfloat16, True), ([12, 12, 12], 8, 512, torch.float16, True),
                     ([20, 20, 20], 8, 256, torch.bfloat16, True), ([8, 8, 5, 1], 8, 512, torch.float16, True),
                     ([12, 9, 9, 3], 8, 256, torch.bfloat16, True), ([20, 17, 9, 4], 8, 128, torch.float16, True),
                     ([64, 64, 64], 8, 512, torch.float16, True), ([48, 40, 21, 3], 8, 512, torch.bfloat16, True)]

# The forward's cluster kernel (16-bit, float32 with and without TF32; 16 < B <= 64, equal batch
# sizes, sm_90: 64 clusters of two blocks, partial sums in distributed shared memory, step flags
# between them); its one-m16-tile instances (H = 1024 from B = 2, all of K in each block up to
# B = 8; h_{t-1}'s words polled where a block gathers at most 32 KiB a step, re-read together) and
# TF32 (on scaled fp16 operands) at H = 1024 with 1, 2 and 4 m16 tiles (float32 B = 8 all of K in
# each block). The 16-bit H = 1024 cases to B = 16 run the row-split kernel, and in training the
# row-split backward kernel (B = 3: one row fewer to block 1; B = 1: block 1 has none);
# SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT=0 sends them from B = 2 to the cluster kernel (all of K in each
# block up to B = 8), B = 1 to the direct kernel. fp16
# B = 20 and bf16 B = 40 at H = 1024 run the row split in 2 and 4 n8 tiles of rows a block, and
# with SEQKERNELS_LSTM_ROW_SPLIT_WIDE=0 the cluster kernel in 2 and 4 m16 tiles. float32 with TF32
# at H = 1024 (scaled fp16 operands) runs the row split too: B = 5 / 8 in one n8 tile, B = 20 / 64
# in 2 / 4, B = 1 in one with block 1 idle (with SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT=0 the cluster
# kernel, and at B = 1 the direct kernel).
CLUSTER_FORWARD_CASES = [([17, 17, 17], 8, 256, torch.bfloat16, True), ([33, 33], 8, 512, torch.float16, True),
                         ([33, 33], 8, 256, torch.float32, True), ([20, 20], 8, 512, torch.float32, False),
                         ([12, 12], 8, 1024, torch.bfloat16, True), ([6, 6], 8, 1024, torch.float16, True),
                         ([3, 3], 8, 1024, torch.bfloat16, True), ([1, 1, 1], 8, 1024, torch.float16, True),
                         ([16, 16], 8, 1024, torch.bfloat16, True), ([20, 20], 8, 1024, torch.float16, True),
                         ([40, 40], 8, 1024, torch.bfloat16, True), ([8, 8], 8, 1024, torch.float32, True),
                         ([20, 20], 8, 1024, torch.float32, True), ([64, 64], 8, 1024, torch.float32, True),
                         ([5, 5], 8, 1024, torch.float32, True), ([1, 1, 1], 8, 1024, torch.float32, True)]

# The direct forward kernel in float32 without TF32 (B <= 16, Hp <= 1024): x3 on fp16 parts at
# B <= 8, Hp > 512 (Path::kHalfX3; 8 units per block, and 4 with a padded last block at H = 520;
# packed, so that rows start late in reverse and read h0), on TF32 parts elsewhere.
DIRECT_X3_CASES = [([1, 1, 1], 8, 1024, torch.float32, False), ([4, 4, 3, 1], 8, 1024, torch.float32, False),
                   ([8, 8, 6], 8, 520, torch.float32, False), ([3, 3, 1], 8, 700, torch.float32, False),
                   ([2, 2], 8, 300, torch.float32, False), ([12, 12, 9], 8, 600, torch.float32, False)]


def run_cases(cases, gen, modes) -> int:
    """Each (batch_sizes, I, H, dtype, tf32) case without projection, with bias, in both directions
    and the given modes (True: train); the number of failures."""
    failures = 0
    for (batch_sizes, I, H, dtype, tf32), reverse, training in itertools.product(cases, [False, True], modes):
        with rnn_tf32(tf32):
            ok, line = run_case(dtype, False, reverse, training, True, batch_sizes, I, H, gen)
        failures += not ok
        print(line + ("" if tf32 or dtype != torch.float32 else "  (TF32 off)"), flush=True)
    return failures


def sweep(gen, backend: str, modes=(True, False)) -> int:
    """Every case of the backend's sweep whose training flag is in `modes` (True: train)."""
    persistent = backend == "persistent"
    failures = 0
    # Packed (decreasing batch sizes, sequences ending at different steps), odd sizes; H = 8
    # takes the 16-byte vector path, H = 5 the scalar one.
    shapes = [([3, 3, 2, 1, 1], 5, 8), ([2, 1], 3, 5)]
    # float32 with TF32 as PyTorch's default has it (on), and off on the persistent backend,
    # where it selects other kernels (FFMA instead of TF32 tensor cores).
    tf32_modes = [True, False] if persistent else [True]
    for dtype, proj, reverse, training in itertools.product(
        [torch.float64, torch.float32, torch.bfloat16, torch.float16], [False, True], [False, True], modes
    ):
        for tf32 in tf32_modes if dtype == torch.float32 else [True]:
            for k, (batch_sizes, I, H) in enumerate(shapes):
                has_bias = k == 0 or not training
                with rnn_tf32(tf32):
                    ok, line = run_case(dtype, proj, reverse, training, has_bias, batch_sizes, I, H, gen)
                failures += not ok
                print(line + ("" if tf32 or dtype != torch.float32 else "  (TF32 off)"), flush=True)
    if persistent and True in modes:
        # Several m16 batch tiles, 4 units per block, packed, both directions; then H = 1024
        # (8 units per block), whose float32 backward loads the X tile in column chunks, and
        # whose TF32 forward reads half of W_hh from shared memory.
        big = [([17, 17, 9, 3], 8, 64, dt, tf32) for dt, tf32 in
               [(torch.bfloat16, True), (torch.float32, True), (torch.float32, False), (torch.float64, True)]]
        # The direct forward kernel's polling instances: rows gq and gq + 8 branch-free (TF32, B = 16),
        # row gq (B = 5), the per-word loop (bf16 B = 12 at H = 1024); ragged where the cluster
        # kernel would take equal batch sizes (TF32 B = 16 at H = 1024).
        big += [([16, 16, 9], 8, 1024, torch.float32, True), ([16, 16], 8, 1024, torch.float32, False),
                ([5, 5], 8, 1024, torch.bfloat16, True), ([5, 5], 8, 1024, torch.float32, True),
                ([12, 12, 9], 8, 1024, torch.bfloat16, True)]
        # float32 without TF32 on the direct kernel (h as 30-bit values, split by the consumer):
        # 4 k-steps per warp (H = 512, B = 16), a padded last block (H = 300, B = 5), 8 k-steps
        # per warp with 5 of them from shared memory (H = 1000: 125 blocks of 8), at B <= 8 and
        # B > 8 (two rows per lane).
        big += [([16, 16, 9], 8, 512, torch.float32, False), ([5, 5], 8, 300, torch.float32, False),
                ([7, 7, 3], 8, 1000, torch.float32, False), ([13, 12, 9], 8, 1000, torch.float32, False)]
        # The split backward kernel in thread-block clusters (B >= 4 on sm_90: 72 blocks, 9
        # clusters of 8; distributed shared memory and cluster barriers).
        big += [([9, 9, 7, 4], 8, 286, torch.bfloat16, True), ([9, 9, 7, 4], 8, 286, torch.float32, True)]
        failures += run_cases(big + CLUSTER_FORWARD_CASES + ONE_CLUSTER_CASES, gen, (True,))
    if backend == "cublas":
        failures += replayed_cases(gen, modes)
        # float32 with TF32: the step GEMMs on scaled fp16 operands (lstm.cu, HalfRecStep and
        # HalfDhStep): the backward's dh in one K part (B = 4, H = 64) and 4 (B = 8, H = 512:
        # 128-unit blocks), the forward's product in 1 and 2 (B = 8, H = 512), both directions,
        # `infer` and `train`.
        for (B, H), reverse, training in itertools.product([(4, 64), (8, 512)], [False, True], modes):
            with rnn_tf32(True):
                ok, line = run_case(torch.float32, False, reverse, training, True, [B] * 36, 4, H, gen)
            failures += not ok
            print(line + "  (fp16 step GEMMs)", flush=True)
        # float32 without TF32 from B = 17: the forward's steps as split TF32 GEMMs (x3 steps),
        # replayed (T = 36; H = 8 vectorised) and plain (packed: the GEMM over B + bt rows, H = 5
        # scalar), both directions; replayed, the backward's dh too (x3 dh, forced: 4 K parts; on
        # TF32 parts at H = 8, on fp16 parts at H = 256); the backward's whole-sequence products on
        # fp16 parts (forced).
        os.environ["SEQKERNELS_LSTM_X3_DH"] = "1"
        os.environ["SEQKERNELS_LSTM_X3_HALF_PRODUCTS"] = "1"
        try:
            for batch_sizes, H in [([17] * 36, 8), ([17] * 36, 256), ([20, 20, 17, 3], 5)]:
                for reverse, training in itertools.product([False, True], modes):
                    with rnn_tf32(False):
                        ok, line = run_case(torch.float32, False, reverse, training, True, batch_sizes, 4, H, gen)
                    failures += not ok
                    print(line + "  (TF32 off)", flush=True)
        finally:
            del os.environ["SEQKERNELS_LSTM_X3_DH"]
            del os.environ["SEQKERNELS_LSTM_X3_HALF_PRODUCTS"]
        # float32 without TF32: the whole-sequence products as split TF32 GEMMs at any size
        # (SEQKERNELS_LSTM_X3_PRODUCTS=1; the backward's operands split transposed through shared
        # memory), I = 33 (unaligned rows), packed, both directions.
        os.environ["SEQKERNELS_LSTM_X3_PRODUCTS"] = "1"
        try:
            for reverse, training in itertools.product([False, True], modes):
                with rnn_tf32(False):
                    ok, line = run_case(torch.float32, False, reverse, training, True, [9, 9, 6, 2], 33, 40, gen)
                failures += not ok
                print(line + "  (TF32 off, split products)", flush=True)
        finally:
            del os.environ["SEQKERNELS_LSTM_X3_PRODUCTS"]
    if backend == "fused" and True in modes:
        # 2 units per block (H = 64, 40: a K tail), 8 (H = 1024), several m16 tiles (B = 17, 33),
        # two batch blocks of 8 tiles (B = 140), packed and both directions; bf16 and TF32.
        big = [([17, 17, 9, 3], 8, 64), ([33, 20, 2], 8, 40), ([140, 100, 100], 4, 64), ([16, 16], 8, 1024)]
        for (batch_sizes, I, H), dtype in itertools.product(big, [torch.bfloat16, torch.float32]):
            for reverse in (False, True):
                ok, line = run_case(dtype, False, reverse, True, True, batch_sizes, I, H, gen)
                failures += not ok
                print(line, flush=True)
        # float32 without TF32 (three MMAs per product; at H = 1024 the backward's W slice,
        # big and small parts, read from L2).
        for batch_sizes, I, H in [([17, 17, 9, 3], 8, 64), ([16, 16], 8, 1024)]:
            for reverse in (False, True):
                with rnn_tf32(False):
                    ok, line = run_case(torch.float32, False, reverse, True, True, batch_sizes, I, H, gen)
                failures += not ok
                print(line + "  (TF32 off)", flush=True)
    if backend == "fused":
        # Equal batch sizes and T >= 16: the fused loop replays its steps from kept CUDA graphs
        # (csrc/cuda/replayed_steps.cuh; T = 36: two 16-step chunks and four eager steps); one
        # m16 tile (B = 3) and several (B = 17, H = 40: a K tail); each case twice.
        for dtype, reverse, training, (B, H) in itertools.product(
            [torch.float32, torch.bfloat16], [False, True], modes, [(3, 64), (17, 40)]
        ):
            for _ in range(2):
                ok, line = run_case(dtype, False, reverse, training, True, [B] * 36, 4, H, gen)
                failures += not ok
                print(line, flush=True)
    return failures


def replayed_cases(gen, modes) -> int:
    """T >= 16: the cuBLAS loop replays its steps from a kept CUDA graph (csrc/cuda/lstm.cu; T =
    36: two 16-step chunks and four eager steps): equal batch sizes with a projection (P = 3) and
    without, and ragged ones without (rows that start and end at different steps); H = 8
    vectorised, H = 5 scalar; each case twice (a capture, then a replay)."""
    failures = 0
    ragged = [3] * 10 + [2] * 20 + [1] * 6
    for dtype, (proj, B), reverse, training, H in itertools.product(
        [torch.float64, torch.float32, torch.bfloat16, torch.float16], [(False, 3), (True, 3), (False, None)],
        [False, True], modes, [8, 5]
    ):
        batch_sizes = ragged if B is None else [B] * 36
        for _ in range(2):
            ok, line = run_case(dtype, proj, reverse, training, True, batch_sizes, 4, H, gen)
            failures += not ok
            print(line, flush=True)
    return failures


def extra(gen) -> int:
    """Checks that need no sanitizer: CUDA-graph capture, and a sequence longer than 65535 steps."""
    failures = 0
    # 1. Capture forward (inference and training) and backward in a CUDA graph; replays must
    #    match eager calls.
    for dtype in (torch.float32, torch.bfloat16):
        t, bs = make_case(dtype, False, True, [4] * 16, 32, 64, gen)
        dev = {k: (v.cuda() if v is not None else None) for k, v in t.items()}
        args = (dev["x"], bs, dev["h0"], dev["c0"], dev["w_ih"], dev["w_hh"], dev["b_ih"], dev["b_hh"], None)
        eager = FWD(*args, False, True)
        gy = torch.randn_like(eager[0])
        gh = torch.randn_like(eager[1])
        gc = torch.randn_like(eager[2])
        eager_grads = BWD(gy, gh, gc, dev["x"], bs, dev["h0"], dev["c0"], dev["w_ih"], dev["w_hh"], None, eager[0],
                          eager[3], eager[4], False, True)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up on the capture stream (cuBLAS workspaces)
            FWD(*args, False, True)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = FWD(*args, False, True)
            grads = BWD(gy, gh, gc, dev["x"], bs, dev["h0"], dev["c0"], dev["w_ih"], dev["w_hh"], None, out[0],
                        out[3], out[4], False, True)
        g.replay()
        torch.cuda.synchronize()
        errs = [rel_err(a, b) for a, b in zip(list(out[:3]) + list(grads[:6]), list(eager[:3]) + list(eager_grads[:6]))]
        # Same inputs, same kernels: only cuBLAS's choice of algorithm may differ between the
        # capture stream and the default one; unwritten or stale outputs would be O(1) off.
        ok = max(errs) <= TOL[dtype]
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} cuda-graph capture fwd+bwd {dtype}: max rel diff vs eager {max(errs):.1e}",
              flush=True)
    # 2. T = 70000 steps (more than a grid dimension could hold), against nn.LSTM in float64
    #    on the CPU (cuDNN rejects this length with CUDNN_STATUS_NOT_SUPPORTED).
    T, B, I, H = 70000, 2, 4, 8
    lstm = torch.nn.LSTM(I, H, dtype=torch.float64, device="cuda")
    x = torch.randn(T, B, I, dtype=torch.float64, generator=gen).cuda()
    start = time.perf_counter()
    with torch.no_grad():
        ry, (rh, rc) = (t.cuda() if i == 0 else tuple(u.cuda() for u in t)
                        for i, t in enumerate(copy.deepcopy(lstm).cpu()(x.cpu())))
        y, h_n, c_n, _, _ = FWD(
            x.reshape(T * B, I), torch.full((T,), B, dtype=torch.int64), torch.zeros(B, H, dtype=torch.float64,
                                                                                    device="cuda"),
            torch.zeros(B, H, dtype=torch.float64, device="cuda"), lstm.weight_ih_l0, lstm.weight_hh_l0,
            lstm.bias_ih_l0, lstm.bias_hh_l0, None, False, False,
        )
    torch.cuda.synchronize()
    err = max(rel_err(y, ry.reshape(T * B, H)), rel_err(h_n, rh[0]), rel_err(c_n, rc[0]))
    ok = err <= 1e-9
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} T={T} float64 vs nn.LSTM (CPU): rel err {err:.1e} ({time.perf_counter() - start:.1f} s)",
          flush=True)
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", action="store_true", help="also CUDA-graph capture and a 70000-step sequence")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--backend", choices=["auto", "persistent", "fused", "cublas"], default=None,
                        help="set SEQKERNELS_LSTM_BACKEND for this run (default: leave the environment as it is)")
    parser.add_argument("--mode", choices=["both", "infer", "train"], default="both",
                        help="only the sweep's inference or training cases (e.g. to tell which results an "
                             "initcheck report reads)")
    parser.add_argument("--one-cluster", action="store_true",
                        help="only the one-cluster kernels' cases, forward and backward (sets --backend persistent)")
    parser.add_argument("--cluster", action="store_true",
                        help="only the cluster forward kernel's cases (sets --backend persistent)")
    parser.add_argument("--direct-x3", action="store_true",
                        help="only the direct forward kernel's float32 cases without TF32 (sets --backend persistent)")
    parser.add_argument("--replayed", action="store_true",
                        help="only the cuBLAS loop's replayed cases, projected and ragged too (sets --backend cublas)")
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                        help="with --one-cluster, --cluster or --direct-x3: only that dtype's cases")
    args = parser.parse_args()
    if args.one_cluster or args.cluster or args.direct_x3:
        args.backend = "persistent"
    if args.replayed:
        args.backend = "cublas"
    if args.backend is not None:
        os.environ["SEQKERNELS_LSTM_BACKEND"] = args.backend
    if not torch.cuda.is_available():
        print("sanitize_lstm: no CUDA device", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(args.seed)
    rnn_precision = getattr(getattr(torch.backends.cudnn, "rnn", None), "fp32_precision", "n/a")
    backend = os.environ.get("SEQKERNELS_LSTM_BACKEND", "auto")
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"cudnn rnn fp32_precision: {rnn_precision}  SEQKERNELS_LSTM_BACKEND={backend}", flush=True)
    modes = {"both": (True, False), "infer": (False,), "train": (True,)}[args.mode]

    def of_dtype(cases):
        return [c for c in cases if args.dtype is None or c[3] == getattr(torch, args.dtype)]

    if args.one_cluster:
        failures = run_cases(of_dtype(ONE_CLUSTER_CASES), gen, modes)
    elif args.cluster:
        failures = run_cases(of_dtype(CLUSTER_FORWARD_CASES), gen, modes)
    elif args.direct_x3:
        failures = run_cases(of_dtype(DIRECT_X3_CASES), gen, modes)
    elif args.replayed:
        failures = replayed_cases(gen, modes)
    else:
        failures = sweep(gen, backend, modes)
    if args.extra:
        failures += extra(gen)
    print(f"sanitize_lstm: {failures} failure(s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
