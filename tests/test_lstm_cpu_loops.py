"""The CPU time loops of the LSTM (csrc/cpu/lstm.cpp), each forced: the persistent loop with
the kernels its rule picks on this CPU, with its products on AMX tiles (SEQKERNELS_CPU_AMX=1,
where the CPU has AMX), with its AVX-512 kernels (SEQKERNELS_CPU_AMX=0) and with its AVX2
kernels (SEQKERNELS_CPU_AVX512=0), and the BLAS loop (SEQKERNELS_LSTM_BACKEND=gemm), in float32;
the bfloat16 loops on AMX (test_bf16_amx_loop_matches_reference), and float16 and bfloat16 on the
float32 loop (test_half_types_on_float_loop_match_reference). With a projection the float32
forward takes the persistent loop too (test_projected_loop_matches_reference), the backward the
BLAS loop; float64 always takes the BLAS loop (tests/test_lstm.py covers it).

Ground truth: seqkernels.reference in float64 with the same inputs; outputs and every
gradient within 3e-5 of max(1, max|expected|).

The cases reach each blocking edge of the kernels: B = 1 (the input projection as one GEMM
before the loop, one row per tile pass), B >= 4 (the projection inside the loop), B = 67
(AVX-512: 8 blocks of 8 rows on the gate-pair kernel and 3 rows on the four-gate kernel),
every row count from 1 to 15 (AVX-512: blocks of 8 while 5 or more rows remain, 1-4 rows on
the four-gate kernel; AVX2: blocks of 6 rows, remainders rebalanced), hidden sizes that are no multiple of the 16- or 8-unit
tiles (36, 80, 130, 44) or of the backward's 16- and 64-unit blocks, and packed sequences
that end at different steps, in both directions.

Shape legend: T steps, B batch, I input, H hidden, N packed rows.
"""
from __future__ import annotations

import pytest
import torch

from _helpers import cpu_has_amx
from seqkernels import lstm_layer
from seqkernels._config import _cpu_flags, lstm_loop_choice
from test_lstm_backends import _reference, layer_case, run_layer

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
    # N = 1090 rows at B = 8, H = 392 (no multiple of 16): under `auto` on an AMX CPU the
    # whole-sequence products (input projection, dx) run on AMX and the step products on
    # AVX-512 (amx_sequence_products).
    ([8] * 130 + [5] * 10, 20, 392, True, True),
]


def use_cpu_kernels(monkeypatch, kernels: str) -> None:
    """Force the persistent loop's kernels: "amx" (skips without AMX), "avx512" or "avx2"; or
    "auto", the ones the rule picks on this CPU."""
    if kernels == "auto":
        monkeypatch.delenv("SEQKERNELS_CPU_AMX", raising=False)
        monkeypatch.delenv("SEQKERNELS_CPU_AVX512", raising=False)
        return
    if kernels == "amx" and not cpu_has_amx():
        pytest.skip("this CPU has no AMX-BF16")
    if kernels == "avx512" and "avx512f" not in _cpu_flags():
        pytest.skip("this CPU has no AVX-512")
    monkeypatch.setenv("SEQKERNELS_CPU_AMX", "1" if kernels == "amx" else "0")
    if kernels == "avx2":
        monkeypatch.setenv("SEQKERNELS_CPU_AVX512", "0")
    else:
        monkeypatch.delenv("SEQKERNELS_CPU_AVX512", raising=False)


@pytest.fixture(params=["persistent-auto", "persistent-amx", "persistent-avx512", "persistent-avx2", "gemm"])
def cpu_loop(request, monkeypatch):
    loop, _, kernels = request.param.partition("-")
    use_cpu_kernels(monkeypatch, kernels or "auto")
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", loop)
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



# (batch sizes per step, I, H, P, reverse, bias): the projected forward and backward
# (forward_persistent_projected, backward_persistent_projected, csrc/cpu/lstm.cpp) at one row, packed
# rows in both directions (rows that end early, or start late in reverse, carry their h over both
# phases of a forward step, and keep dL/dh, dL/dc in the backward), the input projection inside the
# loop (B = 67), P = H - 1, a single column (P = 1: one part of a dL/dh phase, the others idle), and
# hidden sizes that are no multiple of the tiles.
PROJ_CASES = [
    ([1] * 9, 20, 36, 5, False, True),
    ([5, 5, 4, 2, 2, 1, 1, 1, 1], 20, 36, 35, True, True),
    ([67, 67, 67, 40, 3], 33, 80, 16, False, False),
    ([8, 8, 8, 8], 16, 130, 64, True, True),
    ([14, 13, 9, 8, 7, 6, 5, 4, 3, 2, 1], 12, 44, 1, False, True),
]


@pytest.mark.parametrize("batch_sizes,I,H,P,reverse,bias", PROJ_CASES)
def test_projected_loop_matches_reference(cpu_loop, batch_sizes, I, H, P, reverse, bias):
    """proj_size on each forced loop: outputs and every gradient (grad_w_hr among them) against the
    float64 reference, the inference forward too; and which loops ran (the persistent loop's projected
    forward and backward unless the BLAS loop is forced)."""
    from torch.profiler import profile

    t, up = layer_case(batch_sizes, I, H, bias, seed=len(batch_sizes) * 1000 + H + P, P=P)
    with profile() as prof:
        got = run_layer(lstm_layer, t, up, batch_sizes, reverse, torch.float32, "cpu")
    for op in ("seqkernels::lstm_forward_persistent_projected", "seqkernels::lstm_backward_persistent_projected"):
        ran = any(e.name == op for e in prof.events())
        assert ran == (cpu_loop != "gemm"), (cpu_loop, op)
    ref = run_layer(_reference, t, up, batch_sizes, reverse, torch.float64, "cpu")
    with torch.no_grad():
        f32 = {k: v.float() for k, v in t.items()}
        y, h, c = lstm_layer(f32["x"], torch.tensor(batch_sizes), f32["h0"], f32["c0"], f32["w_ih"], f32["w_hh"],
                             f32.get("b_ih"), f32.get("b_hh"), f32["w_hr"], reverse=reverse)
    got.update({"y_infer": y, "h_n_infer": h, "c_n_infer": c})
    ref.update({"y_infer": ref["y"], "h_n_infer": ref["h_n"], "c_n_infer": ref["c_n"]})
    assert "grad_w_hr" in ref
    for key, expected in ref.items():
        err = (got[key].double() - expected).abs().max().item()
        bound = TOL * max(1.0, expected.abs().max().item())
        assert err <= bound, f"{cpu_loop} {key}: error {err:.3g} > {bound:.3g} (B={batch_sizes[0]} H={H} P={P})"


@pytest.mark.parametrize("batch", [1, 7, 15, 16, 20])
def test_auto_runs_the_projected_backward_below_16_rows(monkeypatch, batch):
    """Under auto a projected float32 call runs the persistent backward below B = 16 rows
    (use_persistent_backward; lstm_loop_choice says the same), the BLAS loop from B = 16; the
    projected forward runs the persistent loop at every one of these B."""
    from torch.profiler import profile

    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    t, up = layer_case([batch] * 9, 6, 20, True, seed=batch, P=7)
    with profile() as prof:
        run_layer(lstm_layer, t, up, [batch] * 9, False, torch.float32, "cpu")
    names = {e.name for e in prof.events()}
    assert "seqkernels::lstm_forward_persistent_projected" in names
    assert ("seqkernels::lstm_backward_persistent_projected" in names) == (batch < 16)
    choice = lstm_loop_choice(batch, 20, torch.float32, 7, "cpu", steps=9)
    assert choice["backward"][0] == ("persistent" if batch < 16 else "gemm"), choice


@pytest.mark.parametrize("where", ["h0", "x"])
def test_amx_products_keep_inf_and_nan_as_float32(monkeypatch, where):
    """On AMX a float32 operand is split into three bfloat16 parts (amx_x3.h). A non-finite
    value must be its first part alone: an inf whose second part were inf - inf would turn its
    row NaN where a float32 product keeps it inf (the gates saturate, the row stays finite). The
    NaN of another row stays in that row. Against the float64 reference: the same NaN pattern,
    and float32's bound elsewhere."""
    use_cpu_kernels(monkeypatch, "amx")
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    batch_sizes, I, H = [18] * 5, 24, 40
    t, _ = layer_case(batch_sizes, I, H, bias=True, seed=17)
    if where == "h0":
        t["h0"][1, 5] = float("inf")
        t["h0"][2, 7] = float("-inf")
    else:
        t["x"][1, 7] = float("inf")  # step 0, row 1
        t["x"][18 + 3, 11] = float("nan")  # step 1, row 3
    bs = torch.tensor(batch_sizes)
    args = [t[k] for k in ("x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh")]
    ref = _reference(args[0], bs, *args[1:], reverse=False)
    with torch.no_grad():
        got = lstm_layer(args[0].float(), bs, *[a.float() for a in args[1:]], reverse=False)
    for name, g, r in zip(("y", "h_n", "c_n"), got, ref):
        g, r = g.double(), r.double()
        assert torch.equal(torch.isnan(g), torch.isnan(r)), f"{name}: NaN where the reference has none, or not"
        ok = ~torch.isnan(r)
        err = (g[ok] - r[ok]).abs().max().item()
        assert err <= TOL * max(1.0, r[ok].abs().max().item()), f"{name}: error {err:.3g}"


def test_amx_products_keep_float32_accuracy(monkeypatch):
    """Three bfloat16 parts per operand reach float32's accuracy: the AMX loop's outputs and
    gradients are within 3x the AVX-512 float32 loop's error of the float64 reference (plus
    1e-7). Two parts would leave ~2^-17 of every product, ~1e-5 here: 30x float32's."""
    batch_sizes, I, H = [16] * 24, 256, 256
    t, up = layer_case(batch_sizes, I, H, bias=True, seed=23)
    ref = run_layer(_reference, t, up, batch_sizes, False, torch.float64, "cpu")
    errors = {}
    for kernels in ("amx", "avx512"):
        use_cpu_kernels(monkeypatch, kernels)
        monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
        got = run_layer(lstm_layer, t, up, batch_sizes, False, torch.float32, "cpu")
        errors[kernels] = {k: (got[k].double() - e).abs().max().item() for k, e in ref.items()}
    for key, err in errors["amx"].items():
        bound = 3 * errors["avx512"][key] + 1e-7
        assert err <= bound, f"{key}: AMX error {err:.3g} > {bound:.3g} (float32 loop: {errors['avx512'][key]:.3g})"


# bfloat16 on AMX (csrc/cpu/lstm.cpp, amx_bf16_loop_applies): the forward's loop where H is a
# multiple of 16, the backward's where it is a multiple of 64. (batch sizes per step, I, H,
# reverse, bias): H = 16 (the forward on AMX, the backward on the BLAS loop), 64 (both on AMX),
# 128 (two parts of 64 units on two threads); B = 33 (row blocks of 16, 16 and 1); I = 20 and
# 40 (no multiple of the tiles' 32 k: zero-padded); sequences that end at different steps.
BF16_CASES = [
    ([5] * 12, 20, 16, False, True),
    ([33, 33, 30, 17, 16, 9, 1, 1], 40, 64, True, True),
    ([8] * 20 + [3] * 4, 24, 128, False, False),
    ([2] * 10, 64, 64, True, True),
]


def check_half_loop(monkeypatch, dtype, batch_sizes, I, H, reverse, bias, seed, blas_env, loop_env, scopes, what):
    """A half-type loop (the environment `loop_env`) against the float64 reference by the
    low-precision rule of tests/test_lstm.py (error at most twice that of the reference run in
    `dtype` or of the BLAS loop (`blas_env`), plus two units), outputs and every gradient, and
    the inference forward; `scopes` maps each RecordFunction scope to whether the profiler must
    show it."""
    from test_lstm import compare_low_precision

    t, up = layer_case(batch_sizes, I, H, bias, seed=seed)
    ref64 = run_layer(_reference, t, up, batch_sizes, reverse, torch.float64, "cpu")
    ref_lp = run_layer(_reference, t, up, batch_sizes, reverse, dtype, "cpu")
    for name, value in blas_env.items():
        monkeypatch.setenv(name, value)
    blas = run_layer(lstm_layer, t, up, batch_sizes, reverse, dtype, "cpu")
    for name, value in loop_env.items():
        monkeypatch.setenv(name, value)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = run_layer(lstm_layer, t, up, batch_sizes, reverse, dtype, "cpu")
    ran = {e.name for e in prof.events()}
    for scope, expected in scopes.items():
        assert (scope in ran) == expected, f"{what}: {scope} {'did not run' if expected else 'ran'}"
    compare_low_precision(got, ref64, [ref_lp, blas], dtype, f"{what} H={H}")
    with torch.no_grad():
        args = {k: v.to(dtype) for k, v in t.items()}
        y, h, c = lstm_layer(args["x"], torch.tensor(batch_sizes), args["h0"], args["c0"], args["w_ih"], args["w_hh"],
                             args.get("b_ih"), args.get("b_hh"), reverse=reverse)
    inference = {"y": y, "h_n": h, "c_n": c}
    compare_low_precision(inference, {k: ref64[k] for k in inference}, [ref_lp, blas], dtype,
                          f"{what} (no grad) H={H}")


@pytest.mark.parametrize("batch_sizes,I,H,reverse,bias", BF16_CASES)
def test_bf16_amx_loop_matches_reference(monkeypatch, batch_sizes, I, H, reverse, bias):
    """The bfloat16 loops on AMX (check_half_loop; the BLAS loop with SEQKERNELS_CPU_AMX=0 as
    the second baseline): the forward on AMX, the backward where H % 64 == 0."""
    use_cpu_kernels(monkeypatch, "amx")  # skips without AMX
    check_half_loop(monkeypatch, torch.bfloat16, batch_sizes, I, H, reverse, bias, H * 100 + len(batch_sizes),
                    {"SEQKERNELS_LSTM_BACKEND": "persistent", "SEQKERNELS_CPU_AMX": "0"}, {"SEQKERNELS_CPU_AMX": "1"},
                    {"seqkernels::lstm_forward_amx_bf16": True, "seqkernels::lstm_backward_amx_bf16": H % 64 == 0},
                    "AMX bf16 loop")


# Half types on the float32 persistent loop (lstm.cpp, half_via_float_loop): float16 always,
# bfloat16 where the AMX loop does not apply (H no multiple of 16, or SEQKERNELS_CPU_AMX=0).
HALF_CASES = [
    (torch.float16, [5] * 12, 20, 36, False, True),
    (torch.float16, [33, 33, 30, 17, 16, 9, 1, 1], 40, 64, True, True),
    (torch.bfloat16, [8] * 10 + [3] * 4, 24, 40, False, False),
    (torch.bfloat16, [2] * 10, 16, 64, True, True),
]


@pytest.mark.parametrize("dtype,batch_sizes,I,H,reverse,bias", HALF_CASES)
def test_half_types_on_float_loop_match_reference(monkeypatch, dtype, batch_sizes, I, H, reverse, bias):
    """float16 and bfloat16 on the float32 loop (check_half_loop; AMX off, the BLAS loop forced as
    the second baseline), forward and backward."""
    check_half_loop(monkeypatch, dtype, batch_sizes, I, H, reverse, bias, H * 10 + len(batch_sizes),
                    {"SEQKERNELS_CPU_AMX": "0", "SEQKERNELS_LSTM_BACKEND": "gemm"},
                    {"SEQKERNELS_LSTM_BACKEND": "persistent"},
                    {"seqkernels::lstm_forward_half_via_float": True, "seqkernels::lstm_backward_half_via_float": True},
                    f"{dtype} on the float32 loop")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reverse", [False, True])
def test_opcheck_half_type_loops(monkeypatch, dtype, reverse):
    """torch.library.opcheck of the forward (training and not) and backward ops on the half-type
    loops (bfloat16: the AMX loops where the CPU has AMX, H = 64 taking both; float16: the float32
    loop), forced: fake tensors, schema and autograd registration agree with what they return."""
    from test_lstm import _forward_args, opcheck_backward

    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    sizes, I, H = [5, 5, 4, 2, 2, 1], 12, 64
    torch.manual_seed(4)
    for training in (True, False):
        args = _forward_args(sizes, I, H, 0, True, reverse, training, dtype, "cpu", training)
        torch.library.opcheck(torch.ops.seqkernels.lstm_forward.default, args)
    opcheck_backward(_forward_args(sizes, I, H, 0, True, reverse, True, dtype, "cpu", False), reverse, True)
