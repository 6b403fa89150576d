"""`python -m seqkernels`: the configuration report and the LSTM loop choice per shape."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import seqkernels
from seqkernels._config import lstm_loop_choice, ops


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SEQKERNELS_LSTM_BACKEND"}  # auto
    return subprocess.run([sys.executable, "-m", "seqkernels", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_ops_listed_from_the_dispatcher():
    names = ops()
    for cell in ("lstm", "convrnn", "convlstm"):
        assert f"{cell}_forward" in names and f"{cell}_backward" in names, names
        assert names.index(f"{cell}_forward") < names.index(f"{cell}_backward")


def test_report_lists_every_op():
    out = run_cli()
    assert out.returncode == 0, out.stderr
    for op in ops():
        assert f"  {op}: (True," in out.stdout, out.stdout  # registered on the CPU


@pytest.mark.parametrize("batch,dtype,proj,steps,loop", [
    (256, torch.float32, 0, 256, "persistent"),
    (257, torch.float32, 0, 256, "gemm"),
    (1, torch.float64, 0, 256, "gemm"),
    (1, torch.float32, 8, 256, "persistent"),  # the projected forward and backward
    (15, torch.float32, 8, 256, "persistent"),
    (16, torch.float32, 8, 256, ("persistent", "gemm")),  # the projected backward only below B = 16
    (256, torch.float32, 8, 256, ("persistent", "gemm")),
    (257, torch.float32, 8, 256, "gemm"),
    (1, torch.float32, 8, 7, "gemm"),
    (8, torch.float16, 8, 256, "gemm"),  # with a projection only float32
    (8, torch.float32, 0, 4, "persistent"),  # from B = 8: T >= 4
    (8, torch.float32, 0, 3, "gemm"),
    (7, torch.float32, 0, 8, "persistent"),  # below B = 8: T >= 8
    (7, torch.float32, 0, 7, "gemm"),
    (1, torch.float32, 0, 1, "gemm"),  # an LSTMCell step
])
def test_cpu_choice_mirrors_use_persistent_loop(monkeypatch, batch, dtype, proj, steps, loop):
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    choice = lstm_loop_choice(batch, 256, dtype, proj, "cpu", steps=steps)
    forward, backward = loop if isinstance(loop, tuple) else (loop, loop)
    assert (choice["forward"][0], choice["backward"][0]) == (forward, backward), choice


@pytest.mark.parametrize("amx", ["1", "0"])
def test_cpu_choice_mirrors_the_half_type_rules(monkeypatch, amx):
    """bfloat16 on AMX tiles where the CPU has them (H % 16 == 0; the backward H % 64 == 0; one
    sequence from T = 32), else on the float32 loop like float16 (amx_bf16_loop_applies,
    amx_bf16_backward_applies, half_via_float_loop in csrc/cpu/lstm.cpp); the profiler shows the
    op ran the loop the report names."""
    from _helpers import cpu_has_amx

    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    monkeypatch.delenv("SEQKERNELS_CPU_AVX512", raising=False)
    monkeypatch.setenv("SEQKERNELS_CPU_AMX", amx)
    tiles = amx == "1" and cpu_has_amx()
    cases = [  # (B, H, T, dtype)
        (8, 64, 16, torch.bfloat16), (8, 48, 16, torch.bfloat16), (8, 40, 16, torch.bfloat16),
        (1, 64, 16, torch.bfloat16), (1, 64, 32, torch.bfloat16), (8, 64, 16, torch.float16), (8, 64, 3, torch.float16),
    ]
    for B, H, T, dtype in cases:
        choice = lstm_loop_choice(B, H, dtype, 0, "cpu", steps=T)
        if T < 4:
            expected = ("gemm", "gemm")
        elif dtype == torch.bfloat16 and tiles and H % 16 == 0:
            expected = ("gemm", "gemm") if B == 1 and T < 32 else ("persistent", "persistent" if H % 64 == 0 else "gemm")
        else:
            expected = ("persistent", "persistent")
        assert (choice["forward"][0], choice["backward"][0]) == expected, (B, H, T, dtype, choice)
        on_tiles = "bfloat16 on AMX tiles" in choice["forward"][1]
        assert on_tiles == (expected[0] == "persistent" and dtype == torch.bfloat16 and tiles and H % 16 == 0)
        # What the op runs (RecordFunction scopes): the report's loop.
        x = torch.randn(T, B, H).to(dtype)
        model = seqkernels.LSTM(H, H).to(dtype)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model(x.requires_grad_())[0].float().sum().backward()
        ran = {e.name for e in prof.events()}
        fwd = ("seqkernels::lstm_forward_amx_bf16" if on_tiles else "seqkernels::lstm_forward_half_via_float"
               if expected[0] == "persistent" else None)
        assert fwd is None or fwd in ran, (B, H, T, dtype, sorted(n for n in ran if "seqkernels" in n))
        if expected[0] == "gemm":
            assert not any("amx_bf16" in n or "half_via_float" in n for n in ran)


def test_cpu_products_name_the_kernels(monkeypatch):
    """cpu_products mirrors amx_products / amx_sequence_products: AMX tiles from B = 16 and
    H = 384 (and T*B >= 1024 rows), the whole-sequence products alone from 1024 rows, AVX-512
    below, and the switches SEQKERNELS_CPU_AMX / SEQKERNELS_CPU_AVX512 - on whatever this CPU
    has."""
    from seqkernels._config import CPU_AMX_FLAGS, _cpu_flags, cpu_products

    monkeypatch.delenv("SEQKERNELS_CPU_AMX", raising=False)
    monkeypatch.delenv("SEQKERNELS_CPU_AVX512", raising=False)
    flags = _cpu_flags()
    if "avx512f" not in flags:
        assert cpu_products(64, 512) == "AVX2"
        return
    monkeypatch.setenv("SEQKERNELS_CPU_AVX512", "0")
    assert cpu_products(64, 512) == "AVX2"
    monkeypatch.delenv("SEQKERNELS_CPU_AVX512")
    if not set(CPU_AMX_FLAGS) <= flags:
        assert cpu_products(64, 512) == "AVX-512"
        return
    assert cpu_products(16, 384) == "AMX tiles"
    assert cpu_products(64, 383) == "AVX-512"  # H < 384
    assert cpu_products(16, 512, steps=63) == "AVX-512"  # T*B < 1024 rows
    assert cpu_products(8, 512).startswith("AVX-512, the whole-sequence products on AMX tiles")
    assert cpu_products(1, 512) == "AVX-512"  # N = 256 rows
    monkeypatch.setenv("SEQKERNELS_CPU_AMX", "1")
    assert cpu_products(1, 16, steps=1) == "AMX tiles"
    monkeypatch.setenv("SEQKERNELS_CPU_AMX", "0")
    assert cpu_products(64, 512) == "AVX-512"


def test_cpu_choice_follows_the_environment(monkeypatch):
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    assert lstm_loop_choice(64, 256)["forward"][0] == "persistent"
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    assert lstm_loop_choice(1, 256)["forward"][0] == "gemm"
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "fast")
    with pytest.raises(ValueError, match="SEQKERNELS_LSTM_BACKEND"):
        lstm_loop_choice(1, 256)


@pytest.mark.parametrize("batch,hidden,dtype,tf32,forward,backward", [
    # tensor-core dtypes (csrc/cuda/lstm_loop.cuh)
    (1, 1024, torch.bfloat16, True, "persistent", "persistent"),  # 2 KiB state
    (16, 256, torch.float16, True, "persistent", "persistent"),  # 8 KiB: the limit
    (8, 1024, torch.bfloat16, True, "persistent", "persistent"),  # 16 KiB: forward B <= 16, H <= 1024; backward: row split
    (16, 512, torch.bfloat16, True, "persistent", "persistent"),  # backward: B <= 16, B*H <= 8192, H <= 768
    (8, 768, torch.float16, True, "persistent", "persistent"),  # the same rule
    (16, 768, torch.bfloat16, True, "persistent", "fused"),  # backward: B*H = 12288 > 8192
    (32, 256, torch.bfloat16, True, "persistent", "persistent"),  # forward: the cluster kernel; backward: one cluster
    (64, 256, torch.float16, True, "persistent", "persistent"),  # the one-cluster backward up to B = 64 at H = 256
    (33, 512, torch.bfloat16, True, "persistent", "persistent"),  # ... and at H = 512, above B = 32 paired or in waves
    (32, 384, torch.bfloat16, True, "fused", "fused"),  # H = 384: not the one-cluster kernel's
    (16, 296, torch.bfloat16, True, "persistent", "fused"),  # backward: H % 32 != 0 (no clusters)
    (16, 1024, torch.float16, True, "persistent", "persistent"),  # 32 KiB: the forward's limit; backward: row split
    (17, 1024, torch.bfloat16, True, "persistent", "fused"),  # backward B > 16: not the row split's
    (17, 512, torch.bfloat16, True, "persistent", "persistent"),  # forward 16 < B <= 64, H = 512: the cluster kernel;
    # backward: the one-cluster kernel (16 < B <= 32 at H = 512)
    (40, 128, torch.bfloat16, True, "fused", "cublas"),  # H = 128: not the rule's above B = 16 (10 KiB)
    (17, 640, torch.bfloat16, True, "fused", "fused"),  # forward B > 16, H = 640: not the cluster kernel's H
    (8, 2048, torch.bfloat16, True, "cublas", "cublas"),  # H > 1280: neither persistent nor fused
    (1, 1280, torch.bfloat16, True, "fused", "fused"),  # 2.5 KiB state, but H > 1024: not persistent
    (16, 1280, torch.bfloat16, True, "fused", "fused"),  # H <= 1280, B*H = 20480 (both fused limits)
    (1, 1281, torch.float16, True, "cublas", "cublas"),  # forward H > 1280; backward: H % 8 != 0
    (1, 1288, torch.float16, True, "cublas", "fused"),  # forward H > 1280; backward B <= 4, H <= 1792
    (4, 1792, torch.bfloat16, True, "cublas", "fused"),  # the same backward rule, at its bounds
    (5, 1536, torch.bfloat16, True, "cublas", "cublas"),  # backward B > 4 beyond H = 1280
    (1, 1800, torch.float16, True, "cublas", "cublas"),  # backward H > 1792
    (32, 128, torch.bfloat16, True, "persistent", "persistent"),  # 8 KiB
    (64, 512, torch.bfloat16, True, "persistent", "persistent"),  # forward: the one-cluster kernel, else the cluster
    # kernel; backward: the one-cluster kernel, in 4 clusters of two batch groups (or waves)
    (32, 1024, torch.float16, True, "persistent", "cublas"),  # forward: the cluster kernel; backward > 20480
    (32, 640, torch.bfloat16, True, "fused", "fused"),  # backward B*H = 20480: the fused backward's limit
    (24, 896, torch.float16, True, "fused", "cublas"),  # backward B*H = 21504 > 20480
    (64, 1024, torch.bfloat16, True, "persistent", "cublas"),  # forward: the cluster kernel at its bounds
    (65, 1024, torch.bfloat16, True, "cublas", "cublas"),  # forward B > 64, B*H > 32768 (the replayed cuBLAS loop)
    (48, 768, torch.bfloat16, True, "cublas", "cublas"),  # H = 768: not the cluster kernel's; B*H > 32768
    (256, 256, torch.bfloat16, True, "cublas", "cublas"),  # B*H = 65536; backward B > 64
    (256, 1024, torch.bfloat16, True, "cublas", "cublas"),
    (16, 1024, torch.float32, True, "persistent", "cublas"),  # TF32: B <= 16, 64 KiB; backward: fp16 dh from B = 8
    (7, 1024, torch.float32, True, "persistent", "fused"),  # backward 5 < B < 8 at H > 896: fused
    (8, 1024, torch.float32, True, "persistent", "cublas"),  # backward from B = 8 where fp16 dh fits: cuBLAS
    (16, 960, torch.float32, True, "persistent", "fused"),  # backward 5 < B <= 16 at H > 896, no fp16 dh (240 units)
    (6, 960, torch.float32, True, "persistent", "fused"),  # the same backward rule, at its lower bounds
    (5, 1024, torch.float32, True, "persistent", "persistent"),  # TF32 backward: split kernel (B <= 5 at H > 896)
    (6, 1024, torch.float32, True, "persistent", "fused"),  # the fused backward from B = 6 at H > 896
    (16, 896, torch.float32, True, "persistent", "persistent"),  # backward: B <= 16 up to H = 896
    (17, 1024, torch.float32, True, "persistent", "cublas"),  # forward: the cluster kernel; backward: B > 16
    (4, 768, torch.float32, True, "persistent", "persistent"),  # the same rule
    (8, 768, torch.float32, True, "persistent", "persistent"),  # the same rule (in clusters)
    (16, 256, torch.float32, True, "persistent", "persistent"),  # the same rule, 16 KiB
    (8, 300, torch.float32, True, "persistent", "fused"),  # backward: H % 32 != 0 (no clusters), B*H <= 8192
    (4, 300, torch.float32, True, "persistent", "persistent"),  # backward: B <= 4
    (16, 800, torch.float32, True, "persistent", "persistent"),  # backward: H > 768
    (8, 2048, torch.float32, True, "cublas", "cublas"),  # TF32 H > 1024: neither persistent nor fused
    (16, 1280, torch.float32, True, "cublas", "cublas"),  # the same (B*H <= 32768)
    (32, 256, torch.float32, True, "persistent", "fused"),  # forward: the cluster kernel; backward B*H <= 8192
    (64, 256, torch.float32, True, "persistent", "cublas"),  # the same forward; backward B*H = 16384 > 8192
    (64, 512, torch.float32, True, "persistent", "cublas"),  # the same forward (TF32: H <= 512); backward B*H > 8192
    (40, 384, torch.float32, True, "fused", "cublas"),  # forward: H = 384 not the cluster kernel's, B*H <= 32768
    (32, 1024, torch.float32, True, "persistent", "cublas"),  # forward: the cluster kernel (TF32 H = 1024)
    (40, 1024, torch.float32, True, "persistent", "cublas"),  # the same, on scaled fp16 operands beyond B = 32
    (64, 1024, torch.float32, True, "persistent", "cublas"),  # the same at its bounds
    (256, 256, torch.float32, True, "cublas", "cublas"),  # forward B*H = 65536 > 32768
    (32, 2048, torch.float32, True, "cublas", "cublas"),  # forward B*H = 65536, H > 1024
    (64, 100, torch.bfloat16, True, "cublas", "cublas"),  # fused chosen, but H % 8 != 0
    # float32 with TF32 off: forward persistent at B <= 16, fused at B > 16 with H <= 512 and
    # B*H <= 32768, else cuBLAS (its split TF32 steps); backward persistent at B <= 8 with
    # H <= 512, fused at 8 <= B <= 16 or B >= 8 with B*H <= 8192
    (16, 256, torch.float32, False, "persistent", "fused"),  # backward B > 8
    (8, 512, torch.float32, False, "persistent", "persistent"),  # backward B <= 8, H <= 512
    (1, 1024, torch.float32, False, "persistent", "cublas"),  # backward H > 512, B < 8
    (8, 1024, torch.float32, False, "persistent", "fused"),  # backward 8 <= B <= 16
    (16, 1024, torch.float32, False, "persistent", "fused"),
    (32, 256, torch.float32, False, "persistent", "fused"),  # forward: the cluster kernel (x3); backward B*H = 8192
    (32, 512, torch.float32, False, "persistent", "cublas"),  # the same forward; backward B*H > 8192
    (64, 512, torch.float32, False, "persistent", "cublas"),  # the same forward, at its bounds
    (40, 384, torch.float32, False, "fused", "cublas"),  # forward: H = 384 not the cluster kernel's, H <= 512
    (32, 1024, torch.float32, False, "cublas", "cublas"),  # forward H > 512
    (17, 768, torch.float32, False, "cublas", "cublas"),  # forward B > 16, H > 512
    (64, 1024, torch.float32, False, "cublas", "cublas"),  # 256 KiB
    (32, 510, torch.float32, False, "cublas", "cublas"),  # fused chosen, but H % 4 != 0
    # float64: forward state <= 64 KiB, backward <= 32 KiB
    (16, 256, torch.float64, False, "persistent", "persistent"),  # 32 KiB
    (32, 256, torch.float64, False, "persistent", "cublas"),  # 64 KiB
    (16, 1024, torch.float64, False, "cublas", "cublas"),  # 128 KiB
    (65, 8, torch.float64, False, "cublas", "cublas"),  # beyond the persistent kernel's B <= 64
])
def test_cuda_choice_mirrors_choose_loop(monkeypatch, batch, hidden, dtype, tf32, forward, backward):
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    choice = lstm_loop_choice(batch, hidden, dtype, 0, "cuda", tf32=tf32, clusters=True)
    assert (choice["forward"][0], choice["backward"][0]) == (forward, backward)
    if forward == "persistent":
        assert "occupancy check at launch" in choice["forward"][1]
    assert lstm_loop_choice(batch, hidden, dtype, 4, "cuda", tf32=tf32)["forward"][0] == "cublas"  # projection


@pytest.mark.parametrize("batch,hidden,forward", [
    (17, 512, "fused"), (32, 1024, "fused"), (64, 512, "fused"), (64, 1024, "cublas"), (16, 1024, "persistent"),
])
def test_cuda_choice_without_clusters(monkeypatch, batch, hidden, forward):
    """A GPU without thread-block clusters or with fewer than 128 SMs never runs the cluster forward
    kernel: its shapes go back to the fused and cuBLAS loops (the direct kernel at B <= 16 stays)."""
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    assert lstm_loop_choice(batch, hidden, torch.bfloat16, 0, "cuda", clusters=False)["forward"][0] == forward
    assert lstm_loop_choice(batch, hidden, torch.bfloat16, 0, "cuda", clusters=True)["forward"][0] == "persistent"
    if hidden <= 512:  # TF32: the cluster kernel up to H = 512
        tf32 = lstm_loop_choice(batch, hidden, torch.float32, 0, "cuda", tf32=True, clusters=False)["forward"][0]
        assert tf32 == forward
        assert lstm_loop_choice(batch, hidden, torch.float32, 0, "cuda", tf32=True, clusters=True)["forward"][0] == (
            "persistent")
        # without TF32 (three TF32 MMAs per product): the fused loop up to H = 512 without clusters
        assert lstm_loop_choice(batch, hidden, torch.float32, 0, "cuda", tf32=False, clusters=False)["forward"][0] == (
            "fused")
        assert lstm_loop_choice(batch, hidden, torch.float32, 0, "cuda", tf32=False, clusters=True)["forward"][0] == (
            "persistent")


@pytest.mark.parametrize("batch,clause", [(16, "it polls dG itself, not the step flags (a block gathers 64 KiB of "
                                                "dG a step, <= 64 KiB)"),
                                          (12, "it polls dG itself, not the step flags (a block gathers 48 KiB"),
                                          (1, "it polls dG itself")])
def test_cuda_row_split_backward_follows_its_switch(monkeypatch, batch, clause):
    """The 16-bit backward at H = 1024, B <= 16 takes the persistent loop for its row-split kernel (on
    a GPU with clusters and >= 128 SMs), named with its exchange's polling rule; without such a GPU or
    under SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD=0 (diagnostic) the rule before it: the persistent loop
    while the state is <= 8 KiB (B <= 4), else the fused loop."""
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    monkeypatch.delenv("SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD", raising=False)
    monkeypatch.delenv("SEQKERNELS_LSTM_CLUSTER_POLL_DATA", raising=False)
    for dtype in (torch.bfloat16, torch.float16):
        loop, why = lstm_loop_choice(batch, 1024, dtype, 0, "cuda", clusters=True)["backward"]
        assert loop == "persistent" and "the row-split backward kernel" in why and clause in why
        before = "persistent" if batch <= 4 else "fused"
        assert lstm_loop_choice(batch, 1024, dtype, 0, "cuda", clusters=False)["backward"][0] == before
        monkeypatch.setenv("SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD", "0")
        loop, why = lstm_loop_choice(batch, 1024, dtype, 0, "cuda", clusters=True)["backward"]
        assert loop == before and "row-split backward" not in why
        monkeypatch.delenv("SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD")
    # float32 (TF32) keeps its own backward rules
    assert "row-split backward" not in lstm_loop_choice(batch, 1024, torch.float32, 0, "cuda", tf32=True,
                                                         clusters=True)["backward"][1]


# (B, H, dtype, T, forward, backward, equal batch sizes' forward, backward): a ragged packed sequence's
# loops. The first five are tests/test_lstm_backends.py's test_ragged_16_bit_takes_the_fused_loop (T < 16:
# the cuBLAS loop does not replay its steps), whose loops ran on an H200 (2026-11-29); from T = 16 the
# replayed cuBLAS loop takes the padded rules' calls (test_replayed_cublas_loop_ragged_matches_reference).
_RAGGED_CHOICES = [
    (48, 768, torch.float16, 3, "fused", "fused", "cublas", "cublas"),
    (72, 512, torch.bfloat16, 4, "fused", "fused", "cublas", "cublas"),
    (128, 768, torch.float16, 3, "cublas", "fused", "cublas", "cublas"),  # forward B*H = 98304 > 65536
    (100, 1024, torch.bfloat16, 3, "cublas", "cublas", "cublas", "cublas"),  # B*H > 98304
    (48, 512, torch.float16, 3, "persistent", "persistent", "persistent", "persistent"),  # the one-cluster kernels
    (48, 768, torch.float16, 16, "cublas", "cublas", "cublas", "cublas"),  # replayed: the padded rules
    (128, 768, torch.float16, 256, "cublas", "cublas", "cublas", "cublas"),
    (24, 1024, torch.bfloat16, 256, "fused", "cublas", "persistent", "cublas"),  # not the cluster (row-split) kernel
    (24, 1024, torch.bfloat16, 8, "fused", "fused", "persistent", "cublas"),
    (8, 1024, torch.float16, 256, "persistent", "fused", "persistent", "persistent"),  # not the row-split backward
    (40, 768, torch.float32, 8, "fused", "cublas", "fused", "cublas"),  # TF32: the padded rules
]


@pytest.mark.parametrize("batch,hidden,dtype,steps,forward,backward,forward_equal,backward_equal", _RAGGED_CHOICES)
def test_cuda_ragged_choice_mirrors_choose_loop(monkeypatch, batch, hidden, dtype, steps, forward, backward,
                                                forward_equal, backward_equal):
    """ragged=True: the kernels that take equal batch sizes only drop out, and below T = 16 (where the
    cuBLAS loop does not replay the steps) the 16-bit fused limits widen to B*H = 65536 (forward) and
    98304 (backward)."""
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    monkeypatch.delenv("SEQKERNELS_LSTM_ONE_CLUSTER_WAVES", raising=False)
    choice = lstm_loop_choice(batch, hidden, dtype, 0, "cuda", tf32=True, steps=steps, clusters=True, ragged=True)
    assert (choice["forward"][0], choice["backward"][0]) == (forward, backward), choice
    equal = lstm_loop_choice(batch, hidden, dtype, 0, "cuda", tf32=True, steps=steps, clusters=True)
    assert (equal["forward"][0], equal["backward"][0]) == (forward_equal, backward_equal), equal
    if forward == "persistent" and hidden == 1024:
        assert "the direct forward kernel" in choice["forward"][1]
    if forward == "fused" and batch * hidden > 32 * 1024:  # beyond the padded fused forward's limit
        assert "ragged" in choice["forward"][1]


@pytest.mark.parametrize("batch", [33, 48, 64])
def test_cuda_one_cluster_waves_follow_their_switch(monkeypatch, batch):
    """16-bit, H = 512, 32 < B <= 64: the backward takes the persistent loop for the one-cluster kernel,
    whose clusters, where not all are resident at once, run two batch groups each, else in waves; under
    SEQKERNELS_LSTM_ONE_CLUSTER_WAVES=0 (diagnostic) the cuBLAS loop, as before the waves (B > 32: not the
    fused backward's), and the forward names no waves."""
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    monkeypatch.delenv("SEQKERNELS_LSTM_ONE_CLUSTER_WAVES", raising=False)
    monkeypatch.delenv("SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS", raising=False)
    pairs = f"{-(-batch // 16)} of two batch groups each (equal batch sizes)"
    for dtype in (torch.bfloat16, torch.float16):
        choice = lstm_loop_choice(batch, 512, dtype, 0, "cuda", clusters=True)
        assert choice["backward"][0] == "persistent"
        assert f"not all its clusters are resident at once: {pairs}, else in waves)" in choice["backward"][1]
        assert f"if all are resident at once, else {pairs}, else in waves;" in choice["forward"][1]
        monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER_WAVES", "0")
        choice = lstm_loop_choice(batch, 512, dtype, 0, "cuda", clusters=True)
        assert choice["backward"][0] == "cublas"
        assert f"if all are resident at once, else {pairs};" in choice["forward"][1]
        assert "waves" not in choice["forward"][1]
        monkeypatch.delenv("SEQKERNELS_LSTM_ONE_CLUSTER_WAVES")
    assert "waves" not in str(lstm_loop_choice(batch, 256, torch.bfloat16, 0, "cuda", clusters=True))


@pytest.mark.parametrize("batch,hidden,mode,pairs", [
    (64, 512, "", "4 of two batch groups"), (33, 512, "", "3 of two batch groups"), (32, 512, "", None),
    (64, 512, "0", None), (8, 512, "1", "1 of two batch groups"), (64, 256, "1", None)])
def test_cuda_one_cluster_pairs_follow_their_switch(monkeypatch, batch, hidden, mode, pairs):
    """paired_groups: two batch groups a cluster at H = 512 above B = 32 (where one group a cluster cannot
    have all its clusters resident); SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS=0 never, =1 from B = 1 (first)."""
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    monkeypatch.delenv("SEQKERNELS_LSTM_ONE_CLUSTER_WAVES", raising=False)
    monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS", mode)
    forward = lstm_loop_choice(batch, hidden, torch.float16, 0, "cuda", clusters=True)["forward"]
    assert forward[0] == "persistent"
    if pairs is None:
        assert "two batch groups" not in forward[1]
    else:
        assert f"else {pairs} each (equal batch sizes)" in forward[1]


@pytest.mark.parametrize("batch,forward_with_tf32_operands", [(32, "persistent"), (40, "cublas"), (64, "cublas")])
def test_cuda_tf32_cluster_forward_follows_half_switch(monkeypatch, batch, forward_with_tf32_operands):
    """float32 with TF32 at H = 1024: the cluster forward kernel on scaled fp16 operands up to B = 64;
    on TF32 operands (SEQKERNELS_LSTM_CLUSTER_HALF=0, diagnostic) only up to B = 32, the cuBLAS loop
    beyond (B*H > 32768)."""
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    monkeypatch.delenv("SEQKERNELS_LSTM_CLUSTER_HALF", raising=False)
    forward = lstm_loop_choice(batch, 1024, torch.float32, 0, "cuda", tf32=True, clusters=True)["forward"]
    assert forward[0] == "persistent" and "scaled fp16 operands" in forward[1]
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_HALF", "0")
    assert lstm_loop_choice(batch, 1024, torch.float32, 0, "cuda", tf32=True, clusters=True)["forward"][0] == (
        forward_with_tf32_operands)


def test_cuda_choice_follows_the_environment(monkeypatch):
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "fused")
    assert lstm_loop_choice(1, 256, torch.bfloat16, 0, "cuda")["forward"][0] == "fused"
    assert lstm_loop_choice(1, 256, torch.float64, 0, "cuda")["forward"][0] == "cublas"  # no fused float64
    assert lstm_loop_choice(1, 256, torch.float32, 0, "cuda", tf32=False)["backward"][0] == "fused"  # 3xTF32
    assert lstm_loop_choice(1, 256, torch.float32, 0, "cpu")["forward"][0] == "gemm"  # no CPU fused loop
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    assert lstm_loop_choice(256, 1024, torch.bfloat16, 0, "cuda")["forward"][0] == "cublas"  # B > 64
    assert lstm_loop_choice(16, 1024, torch.bfloat16, 0, "cuda")["backward"][0] == "persistent"
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    assert lstm_loop_choice(1, 256, torch.bfloat16, 0, "cuda")["forward"][0] == "cublas"


# (CLI arguments, texts its stdout holds, texts it does not): the loop `auto` picks and why.
_CLI_CHOICES = [
    (["--batch", "16", "--hidden", "512", "--device", "cpu"],
     ["LSTM time loop for T=256, B=16, H=512, float32, proj_size=0 on cpu",
      "forward: persistent (auto: float32, no projection, B = 16 <= 256, T = 256 >= 4; products on"], []),
    (["--batch", "1", "--hidden", "512", "--steps", "1", "--device", "cpu"],
     ["forward: gemm (auto: T = 1 < 8 steps at B = 1"], []),
    (["--batch", "40", "--hidden", "640", "--dtype", "bfloat16", "--device", "cuda"],
     ["forward: fused", "backward (training): cublas"], []),
    (["--batch", "32", "--hidden", "512", "--dtype", "bfloat16", "--device", "cuda"],
     ["forward: persistent (auto: 16 < B = 32 <= 64 and H = 512 in {256, 512, 1024} (the one-cluster forward "
      "kernel: B = 32 <= 64 and H = 512 in {128, 256, 512}, packed: at most 64 batch sizes, sm_90, 4 clusters of 16 "
      "blocks if "
      "all are resident at once; warp pairs split K; else the cluster forward kernel",
      "backward (training): persistent (auto: backward, 16-bit, 16 < B = 32 <= 64 at H = 256 or 32 at H = 512 "
      "(H = 512): the one-cluster backward kernel"], []),
    (["--batch", "64", "--hidden", "1024", "--dtype", "float16", "--device", "cuda", "--ragged", "--steps", "8"],
     ["proj_size=0, a ragged PackedSequence on cuda", "forward: fused (auto: a ragged packed sequence of T = 8 < 16 "
      "(its cuBLAS steps are not replayed), B*H = 65536 <= 65536", "backward (training): fused (auto: a ragged "
      "packed sequence of T = 8"], []),
    (["--batch", "64", "--hidden", "1024", "--dtype", "float16", "--device", "cuda", "--ragged"],
     ["proj_size=0, a ragged PackedSequence on cuda", "forward: cublas (auto: B*H = 65536 > 32768",
      "backward (training): cublas"], []),
    (["--batch", "64", "--hidden", "512", "--dtype", "float16", "--device", "cuda"],
     ["8 clusters of 16 blocks if all are resident at once, else 4 of two batch groups each (equal batch sizes), "
      "else in waves; warp pairs split K; else the cluster forward kernel", "backward (training): persistent (auto: backward, 16-bit, 16 < B = 64 <= 64 at H = 256 or 64 "
      "at H = 512 (H = 512): the one-cluster backward kernel", "(where not all its clusters are resident at once: 4 of two batch groups each (equal batch sizes), else in "
      "waves)"], []),
    (["--batch", "16", "--hidden", "512", "--dtype", "bfloat16", "--device", "cuda"],
     ["forward: persistent (auto: B = 16 <= 16 and H = 512 <= 1024 (the one-cluster forward kernel: B = 16 <= 64",
      "packed: at most 64 batch sizes, sm_90, 2 clusters of 16 blocks if all are resident at once; warp pairs split "
      "K)"], []),
    (["--batch", "12", "--hidden", "640", "--dtype", "bfloat16", "--device", "cuda"],
     ["forward: persistent (auto: B = 12 <= 16 and H = 640 <= 1024 (the direct forward kernel)"], []),
    (["--batch", "8", "--hidden", "512", "--dtype", "float16", "--device", "cuda"],
     ["forward: persistent (auto: B = 8 <= 16 and H = 512 <= 1024 (the one-cluster forward kernel: B = 8",
      "packed: at most 64 batch sizes, sm_90, 1 cluster of 16 blocks if all are resident at once; warp pairs split "
      "K)"], []),
    (["--batch", "8", "--hidden", "256", "--dtype", "bfloat16", "--device", "cuda"],
     ["(the one-cluster forward kernel: B = 8 <= 64 and H = 256"], ["split K"]),
    (["--batch", "16", "--hidden", "1024", "--dtype", "bfloat16", "--device", "cuda"],
     ["forward: persistent (auto: B = 16 <= 16 and H = 1024 <= 1024 (the row-split forward kernel: 16-bit types, "
      "H = 1024, equal batch sizes, sm_90 with >= 128 SMs; the pair splits the batch rows, each block all of K, "
      "each warp gathering its own K eighth; it polls h_{t-1} itself, not the step flags (a block gathers 16 KiB "
      "of h_{t-1} a step, <= 32 KiB))"],
     ["cluster forward kernel"]),
    (["--batch", "3", "--hidden", "1024", "--dtype", "bfloat16", "--device", "cuda"],
     ["forward: persistent (auto: B = 3 <= 16 and H = 1024 <= 1024 (the row-split forward kernel"],
     ["cluster forward kernel", "direct forward kernel"]),
    (["--batch", "8", "--hidden", "1024", "--dtype", "float32", "--device", "cuda"],
     ["forward: persistent (auto: TF32, B = 8 <= 16", "(the row-split forward kernel: float32 with TF32 on scaled "
      "fp16 operands, H = 1024, equal batch sizes, sm_90 with >= 128 SMs; the pair splits the batch rows"],
     ["cluster forward kernel", "direct forward kernel"]),
    (["--batch", "9", "--hidden", "1024", "--dtype", "float32", "--device", "cuda"],
     ["it polls h_{t-1} itself, not the step flags (a block gathers 10 KiB of h_{t-1} a step, <= 32 KiB))"],
     ["cluster forward kernel"]),
    (["--batch", "1", "--hidden", "1024", "--dtype", "bfloat16", "--device", "cuda"],
     ["forward: persistent (auto: B = 1 <= 16 and H = 1024 <= 1024 (the row-split forward kernel"],
     ["cluster forward kernel", "direct forward kernel"]),
    (["--batch", "32", "--hidden", "1024", "--dtype", "bfloat16", "--device", "cuda"],
     ["(the row-split forward kernel: 16-bit types, H = 1024, equal batch sizes, sm_90 with >= 128 SMs; the pair "
      "splits the batch rows, each block all of K, each warp gathering its own K eighth; 2 n8 tiles of rows a "
      "block; it polls h_{t-1} itself, not the step flags (a block gathers 32 KiB of h_{t-1} a step, <= 32 KiB))"],
     ["waits", "cluster forward kernel"]),
    (["--batch", "48", "--hidden", "1024", "--dtype", "bfloat16", "--device", "cuda"],
     ["the row-split forward kernel", "3 n8 tiles of rows a block; it waits for the step flags (a block gathers "
      "48 KiB of h_{t-1} a step, > 32 KiB)"], ["polls h_{t-1} itself", "cluster forward kernel"]),
    (["--batch", "24", "--hidden", "1024", "--dtype", "float32", "--device", "cuda"],
     ["(the row-split forward kernel: float32 with TF32 on scaled fp16 operands", "2 n8 tiles of rows a block"],
     ["cluster forward kernel"]),
    (["--batch", "64", "--hidden", "512", "--dtype", "float32", "--device", "cuda"],
     ["it polls h_{t-1} itself, not the step flags (a block gathers 32 KiB of h_{t-1} a step, <= 32 KiB)"],
     ["waits"]),
    (["--batch", "8", "--hidden", "512", "--dtype", "bfloat16", "--device", "cuda"],
     ["backward (training): persistent (auto: state B*H*2 bytes = 8 KiB <= 8 KiB (the one-cluster backward kernel "
      "where its clusters are resident, packed: at most 64 batch sizes, sm_90; else the split or general kernel)"],
     []),
    (["--batch", "16", "--hidden", "512", "--dtype", "float16", "--device", "cuda"],
     ["backward (training): persistent", "(the one-cluster backward kernel where its clusters are resident, packed: "
      "at most 64 batch sizes, sm_90; else the split backward kernel in clusters)"], []),
    (["--batch", "8", "--hidden", "640", "--dtype", "float16", "--device", "cuda"],
     ["backward (training): persistent", "(the split backward kernel in clusters)"], ["one-cluster backward"]),
    (["--batch", "5", "--hidden", "1024", "--dtype", "float16", "--device", "cuda"],
     ["forward: persistent (auto: B = 5 <= 16 and H = 1024 <= 1024 (the row-split forward kernel"], []),
    (["--batch", "2", "--hidden", "1024", "--dtype", "float32", "--device", "cuda"],
     ["KiB (the row-split forward kernel: float32 with TF32"], ["cluster forward kernel"]),
    (["--batch", "1", "--hidden", "1024", "--dtype", "float32", "--device", "cuda"],
     ["KiB (the row-split forward kernel: float32 with TF32"], ["direct forward kernel"]),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("setting,batch,kernel", [
    ("0", 8, "(the cluster forward kernel in one m16 tile: H = 1024 and B >= 2"),
    ("0", 3, "(the cluster forward kernel in one m16 tile: H = 1024 and B >= 2"),
    ("0", 1, "(the direct forward kernel)"),
    ("1", 1, "(the row-split forward kernel")])
def test_cli_follows_the_row_split_switch(monkeypatch, setting, batch, kernel, dtype):
    """SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT (diagnostic): 0 gives 16-bit operands at H = 1024 (16-bit types,
    float32 with TF32 on scaled fp16 operands) the last rule's kernels (the cluster kernel from B = 2,
    the direct kernel at B = 1); anything else the row split (from B = 1)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", setting)
    out = run_cli("--batch", str(batch), "--hidden", "1024", "--dtype", dtype, "--device", "cuda")
    assert out.returncode == 0, out.stderr
    assert kernel in out.stdout


@pytest.mark.parametrize("setting,batch,present,absent", [
    ("", 64, "(the row-split forward kernel: 16-bit types, H = 1024, equal batch sizes, sm_90 with >= 128 SMs; the "
             "pair splits the batch rows, each block all of K, each warp gathering its own K eighth; 4 n8 tiles of "
             "rows a block; it waits for the step flags (a block gathers 64 KiB",
     "cluster forward kernel"),
    ("1", 24, "2 n8 tiles of rows a block; it polls h_{t-1} itself", "cluster forward kernel"),
    ("0", 24, "(the cluster forward kernel: sm_90", "row-split")])
def test_cli_follows_the_wide_row_split_switch(monkeypatch, setting, batch, present, absent):
    """The row split takes 16 < B <= 64 at H = 1024 (16-bit) too, unless SEQKERNELS_LSTM_ROW_SPLIT_WIDE=0
    (diagnostic) gives that back to the cluster kernel."""
    monkeypatch.setenv("SEQKERNELS_LSTM_ROW_SPLIT_WIDE", setting)
    out = run_cli("--batch", str(batch), "--hidden", "1024", "--dtype", "float16", "--device", "cuda")
    assert out.returncode == 0, out.stderr
    assert present in out.stdout and absent not in out.stdout


@pytest.mark.parametrize("hidden,tf32,clause", [
    (512, False, "it waits for the step flags (a block gathers 64 KiB of h_{t-1} a step, > 32 KiB)"),
    (512, True, "it polls h_{t-1} itself, not the step flags (a block gathers 32 KiB of h_{t-1} a step, <= 32 KiB)"),
    (256, False, "it polls h_{t-1} itself, not the step flags (a block gathers 32 KiB of h_{t-1} a step, <= 32 KiB)")])
def test_cluster_polls_by_the_bytes_a_block_gathers(monkeypatch, hidden, tf32, clause):
    """cluster_polls_data's rule at float32 B = 64: a block's K half of 64 rows, float operands
    without TF32 (4 bytes), scaled fp16 operands with it (2 bytes)."""
    monkeypatch.delenv("SEQKERNELS_LSTM_CLUSTER_POLL_DATA", raising=False)
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    forward = lstm_loop_choice(64, hidden, torch.float32, 0, "cuda", tf32=tf32, clusters=True)["forward"]
    assert forward[0] == "persistent" and clause in forward[1], forward


@pytest.mark.parametrize("setting,clause", [("0", "it waits for the step flags (SEQKERNELS_LSTM_CLUSTER_POLL_DATA=0)"),
                                            ("1", "it polls h_{t-1} itself, not the step flags "
                                                  "(SEQKERNELS_LSTM_CLUSTER_POLL_DATA=1)")])
def test_cli_follows_the_poll_data_switch(monkeypatch, setting, clause):
    """SEQKERNELS_LSTM_CLUSTER_POLL_DATA (diagnostic) overrides the 32 KiB rule either way: at B = 64,
    H = 1024 (64 KiB a block, the step flags by the rule) and at B = 16 (the row split's 16 KiB)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_POLL_DATA", setting)
    for batch in (64, 16):
        out = run_cli("--batch", str(batch), "--hidden", "1024", "--dtype", "bfloat16", "--device", "cuda")
        assert out.returncode == 0, out.stderr
        assert clause in out.stdout, batch


@pytest.mark.parametrize("args,present,absent", _CLI_CHOICES, ids=[" ".join(a) for a, _, _ in _CLI_CHOICES])
def test_cli_prints_the_choice_and_why(args, present, absent):
    out = run_cli(*args)
    assert out.returncode == 0, out.stderr
    for text in present:
        assert text in out.stdout
    for text in absent:
        assert text not in out.stdout


def test_cli_rejects_half_a_shape():
    out = run_cli("--batch", "4")
    assert out.returncode == 2 and "--batch and --hidden go together" in out.stderr


@pytest.mark.parametrize("setting,batch,hidden,parts", [
    ("", 1, 1024, "fp16"), ("", 8, 600, "fp16"), ("", 9, 1024, "TF32"), ("", 4, 512, "TF32"), ("0", 4, 1024, "TF32")])
def test_direct_x3_parts_follow_the_switch(monkeypatch, setting, batch, hidden, parts):
    """float32 without TF32 at B <= 16: the direct kernel's products on fp16 parts to B = 8 at H > 512
    unless SEQKERNELS_LSTM_DIRECT_X3_HALF=0 (diagnostic), on TF32 parts otherwise."""
    monkeypatch.setenv("SEQKERNELS_LSTM_DIRECT_X3_HALF", setting)
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    forward = lstm_loop_choice(batch, hidden, torch.float32, 0, "cuda", tf32=False, clusters=True)["forward"]
    assert forward[0] == "persistent" and f"its products on {parts} parts" in forward[1], forward


def test_backward_choice_candidates_set_switches_the_extension_reads():
    """scripts/lstm_backward_choice.py's candidates (--loops) set SEQKERNELS_LSTM_BACKEND to a loop and
    only diagnostic switches that csrc/ reads under those names (a renamed switch fails here, where
    the script would silently time the default twice)."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "scripts"))
    try:
        import lstm_backward_choice as choice
    finally:
        sys.path.remove(str(root / "scripts"))
    sources = "".join(p.read_text() for p in (root / "csrc").rglob("*") if p.suffix in (".cpp", ".h", ".cu", ".cuh"))
    for name in choice.LOOPS + tuple(choice.VARIANTS):
        env = choice.candidate_env(name)
        assert env["SEQKERNELS_LSTM_BACKEND"] in choice.LOOPS
        for var in env:
            assert f'"{var}"' in sources, var
    assert choice.candidate_env("fused") == {"SEQKERNELS_LSTM_BACKEND": "fused"}
    with pytest.raises(ValueError, match="unknown candidate"):
        choice.candidate_env("persistent-fast")
