"""Shared test configuration: hypothesis profiles and the device parametrisation.

Hypothesis profiles (pick one with HYPOTHESIS_PROFILE=<name>):
  ci        few examples, derandomised, no deadline; chosen automatically when $CI is set
  dev       the default for local runs: a moderate number of examples
  thorough  many examples, for a long local run before a release
Nothing here touches CUDA at import time: the "cuda" device parameter checks for a GPU only
when a test that uses it runs.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

_COMMON = dict(
    deadline=None,  # kernel timings vary with the machine's load; correctness is what counts
    # `device` is a function-scoped fixture but holds a constant string, and examples may
    # draw a few MB of tensors.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("ci", max_examples=8, derandomize=True, **_COMMON)
settings.register_profile("dev", max_examples=30, **_COMMON)
settings.register_profile("thorough", max_examples=400, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request):
    """The device a test runs on: "cpu" always, "cuda" when a GPU is present (marked
    `cuda`). On CUDA, TF32 and reduced-precision reductions are switched off for the
    test (for the kernel and the references alike) and restored afterwards, so float32
    comparisons are float32 and half-type references are as accurate as they can be."""
    if request.param == "cpu":
        yield "cpu"
        return
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    matmul = torch.backends.cuda.matmul
    saved = (
        matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        matmul.allow_fp16_reduced_precision_reduction,
        matmul.allow_bf16_reduced_precision_reduction,
    )
    matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    matmul.allow_fp16_reduced_precision_reduction = False
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield "cuda"
    finally:
        (
            matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            matmul.allow_fp16_reduced_precision_reduction,
            matmul.allow_bf16_reduced_precision_reduction,
        ) = saved
