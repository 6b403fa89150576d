"""The CPU time loops of the LSTM (csrc/cpu/lstm.cpp), each forced: the persistent loop with
its AVX-512 kernels and with its AVX2 kernels (SEQKERNELS_CPU_AVX512=0), and the BLAS loop
(SEQKERNELS_LSTM_BACKEND=gemm). float32 only: the other dtypes and projection always take
the BLAS loop (tests/test_lstm.py covers them).

Ground truth: seqkernels.reference in float64 with the same inputs; outputs and every
gradient within 3e-5 of max(1, max|expected|).

The cases reach each blocking edge of the kernels: B = 1 (the input projection as one GEMM
before the loop, one row per tile pass), B >= 4 (the projection inside the loop), B = 67
(AVX-512: 16 blocks of 4 rows and a block of 3), every row count from 1 to 15 (AVX2: blocks
of 6 rows, remainders rebalanced), hidden sizes that are no multiple of the 16- or 8-unit
tiles (36, 80, 130, 44) or of the backward's 16- and 64-unit blocks, and packed sequences
that end at different steps, in both directions.

Shape legend: T steps, B batch, I input, H hidden, N packed rows.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from seqkernels import lstm_layer
from test_lstm_backends import _reference, layer_case, run_layer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from harness import cpu_flags  # noqa: E402

TOL = 3e-5

# (batch sizes per step, I, H, reverse, bias)
CASES = [
    ([1] * 6, 20, 36, False, True),
    ([5, 5, 4, 2, 2, 1], 20, 36, True, True),
    ([67, 67, 67, 40, 3], 33, 80, False, False),
    ([8, 8, 8, 8], 16, 130, True, True),
    ([3, 3, 1], 7, 5, False, True),
    # Every row-block split of the AVX2 kernels (blocks of 6; 8 -> 4 + 4, 9 -> 5 + 4; 1 and 2
    # rows on the four-gate kernel) and a hidden size with a partial 16-unit backward block.
    ([14, 13, 9, 8, 7, 6, 5, 4, 3, 2, 1], 12, 44, False, True),
    ([15, 15, 12, 11, 10], 9, 24, True, True),
]


@pytest.fixture(params=["persistent-avx512", "persistent-avx2", "gemm"])
def cpu_loop(request, monkeypatch):
    loop, _, kernels = request.param.partition("-")
    if kernels == "avx512" and not cpu_flags(["avx512f"]):
        pytest.skip("this CPU has no AVX-512")
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", loop)
    if kernels == "avx2":
        monkeypatch.setenv("SEQKERNELS_CPU_AVX512", "0")
    else:
        monkeypatch.delenv("SEQKERNELS_CPU_AVX512", raising=False)
    return request.param


@pytest.mark.parametrize("batch_sizes,I,H,reverse,bias", CASES)
def test_loop_matches_reference(cpu_loop, batch_sizes, I, H, reverse, bias):
    t, up = layer_case(batch_sizes, I, H, bias, seed=len(batch_sizes) * 1000 + H)
    got = run_layer(lstm_layer, t, up, batch_sizes, reverse, torch.float32, "cpu")
    ref = run_layer(_reference, t, up, batch_sizes, reverse, torch.float64, "cpu")
    with torch.no_grad():  # the inference forward (nothing saved) computes the same outputs
        f32 = {k: v.float() for k, v in t.items()}
        y, h, c = lstm_layer(f32["x"], torch.tensor(batch_sizes), f32["h0"], f32["c0"], f32["w_ih"], f32["w_hh"],
                             f32.get("b_ih"), f32.get("b_hh"), reverse=reverse)
    got.update({"y_infer": y, "h_n_infer": h, "c_n_infer": c})
    ref.update({"y_infer": ref["y"], "h_n_infer": ref["h_n"], "c_n_infer": ref["c_n"]})
    for key, expected in ref.items():
        err = (got[key].double() - expected).abs().max().item()
        bound = TOL * max(1.0, expected.abs().max().item())
        assert err <= bound, f"{cpu_loop} {key}: error {err:.3g} > {bound:.3g} (B={batch_sizes[0]} H={H})"

