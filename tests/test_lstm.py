"""Tests of the LSTM: the op (torch.ops.seqkernels.lstm_forward / lstm_backward through
seqkernels.lstm_layer), the modules (seqkernels.LSTM, LSTMCell, replace_lstm).

Two independent references: the pure-PyTorch loop in seqkernels.reference (run in float64
as ground truth, and in bfloat16/float16 to measure plain low-precision error) and
torch.nn.LSTM / nn.LSTMCell with the same weights.

Tolerances per dtype (design.md, "Tests"):
  float64   1e-10, relative to the largest magnitude of the expected tensor
  float32   2e-5, likewise
  bf16/fp16 err(kernel vs float64 reference) <= 2 * err(low-precision references vs the
            float64 reference) + two units in the last place at the tensor's magnitude
            (flash-attention's rule; errors are max-abs over the tensor)

Shape legend: T steps, B batch, I input, H hidden, P proj_size, Hout = P or H, G = 4H,
N packed rows, L layers, D directions.
"""
from __future__ import annotations

import copy
import io
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, note
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pack_sequence

from _helpers import assert_orders_close, cpu_has_amx, gradients_of_gradients, max_abs

import seqkernels
from seqkernels import LSTM, LSTMCell, lstm_layer, replace_lstm
from seqkernels.reference import lstm_cell_reference, lstm_layer_reference, lstm_reference

pytestmark = pytest.mark.filterwarnings(
    # nn.LSTM on the CPU says it leaves oneDNN for projections; not our concern.
    "ignore:LSTM with projections is not supported with oneDNN:UserWarning",
)

LOW_PRECISION = (torch.bfloat16, torch.float16)
ALL_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5}

_forward_op = torch.ops.seqkernels.lstm_forward
_backward_op = torch.ops.seqkernels.lstm_backward


# --------------------------------------------------------------------------------------
# Comparison helpers
# --------------------------------------------------------------------------------------
def assert_close(actual: Tensor, expected: Tensor, dtype: torch.dtype, name: str) -> None:
    """actual (computed in `dtype`, float32 or float64) against expected (same dtype or a
    float64 reference): |actual - expected| <= tol * (|expected| + max(1, max|expected|))."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(
        actual.detach().double(),
        expected.detach().double(),
        rtol=tol,
        atol=tol * max(1.0, max_abs(expected)),
        msg=lambda m: f"{name} ({dtype}): {m}",
    )


def assert_low_precision_close(
    actual: Tensor, reference64: Tensor, baselines: list[Tensor], dtype: torch.dtype, name: str, pooled_err: float = 0.0
) -> None:
    """err(actual) <= 2 * max(err(baseline)) + eps, errors measured against the float64
    reference; the baselines are references computed in the same low precision; eps is two
    units in the last place of the dtype at the reference's largest magnitude.

    The largest error of a tensor of a handful of elements is a sample of a handful: a
    low-precision reference can be lucky on it, e.g. on the single element of grad_h0 with
    B = Hout = 1, a sum of four gate terms that cancel to a tenth of their size. For
    tensors under SMALL_TENSOR elements the baseline error is therefore at least
    pooled_err, the baselines' largest error over all outputs and gradients of the same
    run (see compare_low_precision). Logic errors are caught in float32/float64, with
    tight tolerances; this rule is about precision."""
    assert actual.shape == reference64.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(reference64.shape)}"
    assert actual.dtype == dtype, f"{name}: dtype {actual.dtype} != {dtype}"
    assert torch.isfinite(actual).all(), f"{name}: non-finite values"
    ref = reference64.detach().double()
    scale = max_abs(ref)
    err = max_abs(actual.double() - ref)
    err_baseline = max(max_abs(b.double() - ref) for b in baselines)
    if ref.numel() < SMALL_TENSOR:
        err_baseline = max(err_baseline, pooled_err)
    eps = 2 * torch.finfo(dtype).eps * scale + 1e-6
    assert err <= 2 * err_baseline + eps, (
        f"{name} ({dtype}): max error {err:.3g} vs float64 reference exceeds 2 * {err_baseline:.3g} "
        f"(the low-precision references' error) + {eps:.3g}"
    )


SMALL_TENSOR = 32


def compare_results(actual: dict, expected: dict, dtype: torch.dtype, what: str) -> None:
    """Compare two result dicts of the same dtype (or expected in float64) key by key."""
    assert actual.keys() == expected.keys(), f"{what}: {sorted(actual)} != {sorted(expected)}"
    for key in expected:
        assert_close(actual[key], expected[key], dtype, f"{what}: {key}")


def compare_low_precision(actual: dict, reference64: dict, baselines: list[dict], dtype, what: str) -> None:
    assert actual.keys() == reference64.keys(), f"{what}: {sorted(actual)} != {sorted(reference64)}"
    pooled_err = max(max_abs(b[key].double() - reference64[key]) for key in reference64 for b in baselines)
    for key in reference64:
        assert_low_precision_close(
            actual[key], reference64[key], [b[key] for b in baselines], dtype, f"{what}: {key}", pooled_err
        )


def forward_backward(
    fn: Callable[[dict, dict], dict], inputs: dict, params: dict, upstream: dict | None = None
) -> tuple[dict, dict]:
    """Run fn(inputs, params) -> {name: output}, backpropagate sum(output * upstream) and
    return ({outputs..., grad_<input>..., grad_<param>...}, upstream). Inputs are cloned
    into fresh leaves; params must already be leaves that require grad (module parameters
    are used as they are). upstream: fixed random output gradients (made in float64 on
    the first call, cast to each run's dtype), so that every run gets the same ones."""
    inputs = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items()}
    outputs = fn(inputs, params)
    if upstream is None:
        upstream = {k: torch.randn(o.shape, dtype=torch.float64, device=o.device) for k, o in outputs.items()}
    loss = sum((o * upstream[k].to(o.dtype)).sum() for k, o in outputs.items())
    leaves = list(inputs.values()) + list(params.values())
    grads = torch.autograd.grad(loss, leaves)
    result = {k: o.detach() for k, o in outputs.items()}
    for name, g in zip(list(inputs) + list(params), grads):
        result[f"grad_{name}"] = g
    return result, upstream


def module_params(module: nn.Module) -> dict:
    return dict(module.named_parameters())


def leaf_params(module: nn.Module, dtype: torch.dtype) -> dict:
    """Detached copies of a module's parameters in `dtype`, as fresh leaves."""
    return {k: p.detach().to(dtype).requires_grad_(True) for k, p in module.named_parameters()}


def make_lstms(config: dict, dtype: torch.dtype, device: str) -> tuple[nn.LSTM, LSTM]:
    """An nn.LSTM (nn.LSTM's init, then cast to dtype) and a seqkernels.LSTM loaded with
    its state dict."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # dropout with one layer
        ref = nn.LSTM(**config).to(device=device, dtype=dtype)
        ours = LSTM(**config, device=device, dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def lstm_module_fn(module: nn.Module) -> Callable[[dict, dict], dict]:
    """forward_backward's fn for an LSTM module: inputs x [, h0, c0]; params unused (the
    module's own parameters are the leaves)."""

    def fn(inputs, _params):
        hx = (inputs["h0"], inputs["c0"]) if "h0" in inputs else None
        out, (h, c) = module(inputs["x"], hx)
        return {"output": out, "h_n": h, "c_n": c}

    return fn


def lstm_reference_fn(config: dict) -> Callable[[dict, dict], dict]:
    """forward_backward's fn for the pure-PyTorch reference of an nn.LSTM config; params
    are named like nn.LSTM's, in _flat_weights order."""

    def fn(inputs, params):
        hx = (inputs["h0"], inputs["c0"]) if "h0" in inputs else None
        out, (h, c) = lstm_reference(
            inputs["x"],
            hx,
            list(params.values()),
            num_layers=config["num_layers"],
            bidirectional=config["bidirectional"],
            batch_first=config["batch_first"],
            has_biases=config["bias"],
            proj_size=config["proj_size"],
        )
        return {"output": out, "h_n": h, "c_n": c}

    return fn


def check_against_references(
    config: dict, inputs: dict, dtype: torch.dtype, device: str, ours_fn, nn_fn, ref_fn
) -> None:
    """The shared body of the module-level comparisons: run seqkernels (ours_fn), nn (nn_fn)
    and the pure reference (ref_fn) and compare everything (outputs and all gradients).

    ours_fn / nn_fn: (module) -> fn for forward_backward; the modules are built here."""
    ref_module, ours = make_lstms(config, dtype, device)
    got, upstream = forward_backward(ours_fn(ours), inputs, module_params(ours))
    from_nn, _ = forward_backward(nn_fn(ref_module), inputs, module_params(ref_module), upstream)
    inputs64 = {k: v.double() for k, v in inputs.items()}
    ref64, _ = forward_backward(ref_fn, inputs64, leaf_params(ref_module, torch.float64), upstream)
    if dtype in LOW_PRECISION:
        ref_lp, _ = forward_backward(ref_fn, inputs, leaf_params(ref_module, dtype), upstream)
        compare_low_precision(got, ref64, [ref_lp, from_nn], dtype, "seqkernels vs float64 reference")
    else:
        compare_results(got, from_nn, dtype, "seqkernels vs nn.LSTM")
        compare_results(got, ref64, dtype, "seqkernels vs float64 reference")
        if dtype == torch.float64:
            # The reference itself must agree with nn.LSTM, or the comparisons above prove little.
            compare_results(ref64, from_nn, dtype, "reference vs nn.LSTM")


# --------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------
# Sizes: small ones plus a few awkward ones around SIMD widths (8 floats in AVX2, 16 in AVX-512).
dtypes = st.sampled_from(ALL_DTYPES)


def hidden_sizes(dtype: torch.dtype):
    """Small sizes plus a few awkward ones. In bf16/fp16 at least 4 (and a projection of
    at least 2): with a recurrent state of one or two units, each gradient is a sum of a
    few gate terms that cancel, and whether the kernel or the low-precision reference
    lands nearer the float64 value is a coin toss, not a property (float32/float64 test
    those sizes with tight tolerances)."""
    low = 4 if dtype in LOW_PRECISION else 1
    return st.one_of(st.integers(low, 9), st.sampled_from([16, 17, 31, 33]))


def min_proj(dtype: torch.dtype) -> int:
    return 2 if dtype in LOW_PRECISION else 1


@st.composite
def lstm_configs(draw, dtype: torch.dtype, max_layers: int = 3) -> dict:
    hidden = draw(hidden_sizes(dtype))
    proj = draw(st.integers(min_proj(dtype), hidden - 1)) if hidden > min_proj(dtype) and draw(st.booleans()) else 0
    return dict(
        input_size=draw(st.one_of(st.integers(1, 6), st.sampled_from([9, 17]))),
        hidden_size=hidden,
        num_layers=draw(st.integers(1, max_layers)),
        bias=draw(st.booleans()),
        batch_first=draw(st.booleans()),
        bidirectional=draw(st.booleans()),
        proj_size=proj,
    )


@st.composite
def batch_sizes_lists(draw, max_steps: int = 7, max_batch: int = 5) -> list[int]:
    """A non-increasing list of positive batch sizes (PackedSequence.batch_sizes)."""
    steps = draw(st.integers(1, max_steps))
    first = draw(st.integers(1, max_batch))
    sizes = [first]
    for _ in range(steps - 1):
        sizes.append(draw(st.integers(1, sizes[-1])))
    return sizes


def states(config: dict, batch: int, dtype, device) -> dict:
    num_directions = 2 if config["bidirectional"] else 1
    real_hidden = config["proj_size"] or config["hidden_size"]
    layers = config["num_layers"] * num_directions
    return {
        "h0": torch.randn(layers, batch, real_hidden, device=device).to(dtype),
        "c0": torch.randn(layers, batch, config["hidden_size"], device=device).to(dtype),
    }


# --------------------------------------------------------------------------------------
# The op: seqkernels.lstm_layer against the reference loop
# --------------------------------------------------------------------------------------
def layer_tensors(sizes, input_size, hidden, proj, bias, dtype, device, scale=1.0) -> tuple[dict, dict]:
    """Random inputs (x, h0, c0) and weights of one layer (nn.LSTM's init range)."""
    n, batch = sum(sizes), sizes[0]
    hout = proj or hidden
    bound = hidden**-0.5

    def uniform(*shape):
        return (torch.rand(*shape, device=device, dtype=torch.float64) * 2 - 1).mul(bound).to(dtype)

    inputs = {
        "x": (torch.randn(n, input_size, device=device, dtype=torch.float64) * scale).to(dtype),
        "h0": torch.randn(batch, hout, device=device, dtype=torch.float64).to(dtype),
        "c0": torch.randn(batch, hidden, device=device, dtype=torch.float64).to(dtype),
    }
    params = {"w_ih": uniform(4 * hidden, input_size), "w_hh": uniform(4 * hidden, hout)}
    if bias:
        params["b_ih"] = uniform(4 * hidden)
        params["b_hh"] = uniform(4 * hidden)
    if proj:
        params["w_hr"] = uniform(proj, hidden)
    return inputs, params


def layer_fn(layer, batch_sizes: Tensor, reverse: bool):
    def fn(inputs, params):
        y, h, c = layer(inputs["x"], batch_sizes, inputs["h0"], inputs["c0"], reverse=reverse, **params)
        return {"y": y, "h_n": h, "c_n": c}

    return fn


@given(
    sizes=batch_sizes_lists(max_steps=9, max_batch=6),
    input_size=st.integers(1, 7),
    use_proj=st.booleans(),
    bias=st.booleans(),
    reverse=st.booleans(),
    dtype=dtypes,
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_lstm_layer_matches_reference(device, sizes, input_size, use_proj, bias, reverse, dtype, seed, data):
    """The op (packed variable batch sizes, both directions, proj, bias) against the loop
    reference: y, h_n, c_n and every gradient."""
    torch.manual_seed(seed)
    hidden = data.draw(hidden_sizes(dtype), label="hidden")
    proj = max(min_proj(dtype), hidden // 2) if use_proj and hidden > min_proj(dtype) else 0
    inputs, params = layer_tensors(sizes, input_size, hidden, proj, bias, dtype, device)
    batch_sizes = torch.tensor(sizes, dtype=torch.int64)
    note(f"batch_sizes={sizes} I={input_size} H={hidden} P={proj} bias={bias} reverse={reverse} {dtype}")

    def leaves(dt):
        return {k: v.detach().to(dt).requires_grad_(True) for k, v in params.items()}

    got, upstream = forward_backward(layer_fn(lstm_layer, batch_sizes, reverse), inputs, leaves(dtype))
    inputs64 = {k: v.double() for k, v in inputs.items()}
    reference = layer_fn(lstm_layer_reference, batch_sizes, reverse)
    ref64, _ = forward_backward(reference, inputs64, leaves(torch.float64), upstream)
    # Inference (training=False: nothing saved) must compute the same forward.
    with torch.no_grad():
        y, h, c = lstm_layer(inputs["x"], batch_sizes, inputs["h0"], inputs["c0"], reverse=reverse, **params)
    inference = {"y": y, "h_n": h, "c_n": c}
    ref64_forward = {k: ref64[k] for k in inference}
    if dtype in LOW_PRECISION:
        ref_lp, _ = forward_backward(reference, inputs, leaves(dtype), upstream)
        compare_low_precision(got, ref64, [ref_lp], dtype, "lstm_layer vs reference")
        compare_low_precision(inference, ref64_forward, [ref_lp], dtype, "lstm_layer (no grad) vs reference")
    else:
        compare_results(got, ref64, dtype, "lstm_layer vs float64 reference")
        compare_results(inference, ref64_forward, dtype, "lstm_layer (no grad) vs float64 reference")


def test_lstm_layer_reverse_packed_semantics(device):
    """Hand-checkable reverse semantics: in reverse, each sequence starts at its own last
    element from h0, so a length-1 sequence's output equals one cell step from h0 on its
    only element, and its h_n equals that output."""
    torch.manual_seed(0)
    sizes = [3, 2, 1]  # lengths 3, 2, 1
    inputs, params = layer_tensors(sizes, 3, 4, 0, True, torch.float64, device)
    batch_sizes = torch.tensor(sizes)
    y, h_n, c_n = lstm_layer(inputs["x"], batch_sizes, inputs["h0"], inputs["c0"], reverse=True, **params)
    # Sequence 2 has one element: row 2 of step 0.
    weights = (params["w_ih"], params["w_hh"], params["b_ih"], params["b_hh"])
    h_one, c_one = lstm_cell_reference(inputs["x"][2:3], inputs["h0"][2:3], inputs["c0"][2:3], *weights)
    assert_close(y[2:3], h_one, torch.float64, "y of the length-1 sequence")
    assert_close(h_n[2:3], h_one, torch.float64, "h_n of the length-1 sequence")
    assert_close(c_n[2:3], c_one, torch.float64, "c_n of the length-1 sequence")
    # Sequence 1 (length 2) starts at step 1 (row 4) from h0[1].
    h_a, c_a = lstm_cell_reference(inputs["x"][4:5], inputs["h0"][1:2], inputs["c0"][1:2], *weights)
    assert_close(y[4:5], h_a, torch.float64, "first reverse step of the length-2 sequence")


@pytest.mark.parametrize(
    "sizes, proj, bias, reverse",
    [
        ([3, 3, 3], 0, True, False),
        ([3, 2, 2, 1], 2, True, True),
        ([2, 1], 0, False, True),
        ([4, 4, 1], 2, False, False),
        ([1], 0, True, True),
    ],
)
def test_gradcheck_lstm_layer(device, sizes, proj, bias, reverse):
    torch.manual_seed(1)
    inputs, params = layer_tensors(sizes, 3, 4, proj, bias, torch.float64, device)
    batch_sizes = torch.tensor(sizes)
    names = list(inputs) + list(params)
    tensors = tuple(t.detach().requires_grad_(True) for t in list(inputs.values()) + list(params.values()))

    def fn(*ts):
        kw = dict(zip(names, ts))
        return lstm_layer(kw.pop("x"), batch_sizes, kw.pop("h0"), kw.pop("c0"), reverse=reverse, **kw)

    assert torch.autograd.gradcheck(fn, tensors, eps=1e-6, atol=1e-7, rtol=1e-5)


# --------------------------------------------------------------------------------------
# opcheck
# --------------------------------------------------------------------------------------
OPCHECK_CASES = [
    # (batch_sizes, I, H, P, bias, reverse)
    pytest.param([3, 3, 3, 3], 5, 4, 0, True, False, id="padded"),
    pytest.param([4, 3, 3, 1], 3, 6, 0, True, True, id="packed-reverse"),
    pytest.param([2, 2, 1], 4, 5, 3, True, False, id="proj"),
    pytest.param([3, 1], 2, 3, 0, False, True, id="no-bias-reverse"),
    pytest.param([2, 2, 2], 3, 4, 2, False, True, id="proj-no-bias-reverse"),
]


def _forward_args(sizes, input_size, hidden, proj, bias, reverse, training, dtype, device, requires_grad):
    inputs, params = layer_tensors(sizes, input_size, hidden, proj, bias, dtype, device)
    tensors = {k: v.requires_grad_(requires_grad) for k, v in {**inputs, **params}.items()}
    return (
        tensors["x"],
        torch.tensor(sizes, dtype=torch.int64),
        tensors["h0"],
        tensors["c0"],
        tensors["w_ih"],
        tensors["w_hh"],
        tensors.get("b_ih"),
        tensors.get("b_hh"),
        tensors.get("w_hr"),
        reverse,
        training,
    )


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("sizes, input_size, hidden, proj, bias, reverse", OPCHECK_CASES)
def test_opcheck_lstm_forward(device, sizes, input_size, hidden, proj, bias, reverse, training):
    torch.manual_seed(2)
    # Gradients exist only for training=True (inference saves nothing for backward).
    args = _forward_args(sizes, input_size, hidden, proj, bias, reverse, training, torch.float32, device, training)
    torch.library.opcheck(_forward_op.default, args)


def opcheck_backward(forward_args: tuple, reverse: bool, bias: bool) -> None:
    """opcheck of the backward op on what the forward op saves for these (training) arguments."""
    x, batch_sizes, h0, c0, w_ih, w_hh, _, _, w_hr = forward_args[:9]
    y, h_n, c_n, gates, cells = _forward_op(*forward_args)
    backward_args = (
        torch.randn_like(y), torch.randn_like(h_n), torch.randn_like(c_n),
        x, batch_sizes, h0, c0, w_ih, w_hh, w_hr, y, gates, cells, reverse, bias,
    )  # fmt: skip
    torch.library.opcheck(_backward_op.default, backward_args)


@pytest.mark.parametrize("sizes, input_size, hidden, proj, bias, reverse", OPCHECK_CASES)
def test_opcheck_lstm_backward(device, sizes, input_size, hidden, proj, bias, reverse):
    torch.manual_seed(3)
    opcheck_backward(_forward_args(sizes, input_size, hidden, proj, bias, reverse, True, torch.float32, device, False),
                     reverse, bias)


@pytest.mark.parametrize("sizes, input_size, hidden, proj, bias, reverse", OPCHECK_CASES)
def test_opcheck_lstm_layer_op(device, sizes, input_size, hidden, proj, bias, reverse):
    """torch.ops.seqkernels.lstm_layer, the functional's recorded eager call with a C++ autograd node:
    schema, fake function, autograd registration and AOT dispatch, gradients included."""
    torch.manual_seed(6)
    args = _forward_args(sizes, input_size, hidden, proj, bias, reverse, True, torch.float32, device, True)[:-1]
    torch.library.opcheck(torch.ops.seqkernels.lstm_layer.default, args)


@pytest.mark.parametrize("sizes, input_size, hidden, proj, bias, reverse", OPCHECK_CASES)
def test_lstm_layer_node_matches_the_function_path(device, sizes, input_size, hidden, proj, bias, reverse):
    """lstm_layer where autograd records, eagerly, is one C++ node (LstmLayerFunction) with
    lstm_forward's autograd.Function's op calls: its outputs and every gradient (losses on y, h_n and
    c_n) are that Function's bitwise; y may not be changed in place before backward (it is saved);
    a second backward under retain_graph gives the same gradients."""
    from seqkernels.ops._autograd import call_op

    torch.manual_seed(7)
    args = _forward_args(sizes, input_size, hidden, proj, bias, reverse, True, torch.float32, device, True)
    x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr = args[:9]
    leaves = [t for t in (x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr) if t is not None]

    def run(call):
        for t in leaves:
            t.grad = None
        y, h_n, c_n = call()
        (y.sin().sum() + h_n.cos().sum() + (c_n * c_n).sum()).backward(retain_graph=True)
        return [y, h_n, c_n] + [t.grad for t in leaves]

    node = lambda: lstm_layer(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse)  # noqa: E731
    function = lambda: call_op(_forward_op.default, True, *args)[:3]  # noqa: E731
    got, expected = run(node), run(function)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    y, h_n, _ = node()
    assert y.grad_fn.name() == "torch::autograd::CppNode<seqkernels::LstmLayerFunction>"
    assert h_n.grad_fn is y.grad_fn
    loss = y.sin().sum() + h_n.sum()
    first = torch.autograd.grad(loss, leaves, retain_graph=True)
    second = torch.autograd.grad(loss, leaves)
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    y, _, _ = node()
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_lstm_layer_node_gradgradcheck(device):
    """The node's gradients' own gradients (its backward under create_graph goes through
    lstm_backward_recorded's double-backward formula), with projection, packed and reversed."""
    torch.manual_seed(8)
    _gradcheck_both_orders(lstm_layer, _forward_args([3, 2, 2, 1], 3, 4, 2, True, True, True, torch.float64, device,
                                                     True)[:-1])


@pytest.mark.parametrize("recording", [False, True])
def test_lstm_layer_op_rejects_bad_arguments(device, recording):
    """Direct calls of the lstm_layer op with mismatched sizes raise lstm_forward's RuntimeError (its
    node's and its no-autograd kernel's), never crash."""
    args = list(_forward_args([3, 2], 4, 5, 0, True, False, True, torch.float32, device, recording)[:-1])
    torch.ops.seqkernels.lstm_layer(*args)  # the unmutated call is valid
    for index, bad in ((2, args[2][:1]), (0, args[0][:, :3]), (1, torch.tensor([2, 3])), (4, args[4][:, :2])):
        mutated = list(args)
        mutated[index] = bad
        with pytest.raises(RuntimeError):
            torch.ops.seqkernels.lstm_layer(*mutated)


def test_forward_op_outputs(device):
    """Output shapes of the raw op: saved buffers are empty in inference."""
    torch.manual_seed(4)
    sizes, input_size, hidden, proj = [3, 2], 4, 5, 2
    for training in (True, False):
        args = _forward_args(sizes, input_size, hidden, proj, True, False, training, torch.float32, device, False)
        y, h_n, c_n, gates, cells = _forward_op(*args)
        n = sum(sizes) if training else 0
        assert y.shape == (5, proj) and h_n.shape == (3, proj) and c_n.shape == (3, hidden)
        assert gates.shape == (n, 4 * hidden) and cells.shape == (n, hidden)


# --------------------------------------------------------------------------------------
# Bad arguments to the raw ops raise (RuntimeError for shapes and sizes, TypeError for
# dtypes), never crash
# --------------------------------------------------------------------------------------
def _valid_forward_kwargs(device="cpu", proj=0):
    torch.manual_seed(5)
    sizes = [3, 2, 2, 1]
    inputs, params = layer_tensors(sizes, 4, 5, proj, True, torch.float32, device)
    return dict(
        x=inputs["x"], batch_sizes=torch.tensor(sizes), h0=inputs["h0"], c0=inputs["c0"],
        w_ih=params["w_ih"], w_hh=params["w_hh"], b_ih=params["b_ih"], b_hh=params["b_hh"],
        w_hr=params.get("w_hr"), reverse=False, training=True,
    )  # fmt: skip


def _noncontig(t: Tensor) -> Tensor:
    out = t.t().contiguous().t() if t.dim() == 2 else t.repeat_interleave(2)[::2]
    assert not out.is_contiguous() and torch.equal(out, t)
    return out


# name -> (mutation of the valid kwargs, expected exception type)
BAD_FORWARD = {
    "x-1d": (lambda a: a.update(x=a["x"].reshape(-1)), RuntimeError),
    "x-3d": (lambda a: a.update(x=a["x"].unsqueeze(0)), RuntimeError),
    "x-int": (lambda a: a.update(x=a["x"].to(torch.int32)), TypeError),
    "x-noncontiguous": (lambda a: a.update(x=_noncontig(a["x"])), RuntimeError),
    "x-wrong-features": (lambda a: a.update(x=torch.randn(8, 3)), RuntimeError),
    "mixed-dtypes-x-float64": (lambda a: a.update(x=a["x"].double()), TypeError),
    "w_hh-float64": (lambda a: a.update(w_hh=a["w_hh"].double()), TypeError),
    "h0-float64": (lambda a: a.update(h0=a["h0"].double()), TypeError),
    "c0-bfloat16": (lambda a: a.update(c0=a["c0"].bfloat16()), TypeError),
    "b_ih-float16": (lambda a: a.update(b_ih=a["b_ih"].half()), TypeError),
    "empty-x-and-batch_sizes": (
        lambda a: a.update(x=torch.randn(0, 4), batch_sizes=torch.tensor([], dtype=torch.int64)),
        RuntimeError,
    ),
    "empty-batch_sizes": (lambda a: a.update(batch_sizes=torch.tensor([], dtype=torch.int64)), RuntimeError),
    "batch_sizes-zero": (lambda a: a.update(batch_sizes=torch.tensor([3, 2, 3, 0])), RuntimeError),
    "batch_sizes-zero-sum-ok": (lambda a: a.update(batch_sizes=torch.tensor([3, 3, 2, 0])), RuntimeError),
    "batch_sizes-negative": (lambda a: a.update(batch_sizes=torch.tensor([3, 3, 3, -1])), RuntimeError),
    "batch_sizes-increasing": (lambda a: a.update(batch_sizes=torch.tensor([1, 2, 2, 3])), RuntimeError),
    "batch_sizes-sum-too-small": (lambda a: a.update(batch_sizes=torch.tensor([3, 2, 1, 1])), RuntimeError),
    "batch_sizes-sum-too-large": (lambda a: a.update(batch_sizes=torch.tensor([3, 3, 3, 3])), RuntimeError),
    "batch_sizes-int32": (lambda a: a.update(batch_sizes=a["batch_sizes"].int()), TypeError),
    "batch_sizes-float": (lambda a: a.update(batch_sizes=a["batch_sizes"].float()), TypeError),
    "batch_sizes-2d": (lambda a: a.update(batch_sizes=a["batch_sizes"].reshape(2, 2)), RuntimeError),
    "h0-wrong-batch": (lambda a: a.update(h0=torch.randn(2, 5)), RuntimeError),
    "h0-1d": (lambda a: a.update(h0=torch.randn(5)), RuntimeError),
    "c0-wrong-hidden": (lambda a: a.update(c0=torch.randn(3, 4)), RuntimeError),
    "c0-noncontiguous": (lambda a: a.update(c0=_noncontig(a["c0"])), RuntimeError),
    "w_ih-not-4H": (lambda a: a.update(w_ih=torch.randn(19, 4)), RuntimeError),
    "w_ih-wrong-input": (lambda a: a.update(w_ih=torch.randn(20, 3)), RuntimeError),
    "w_ih-noncontiguous": (lambda a: a.update(w_ih=_noncontig(a["w_ih"])), RuntimeError),
    "w_ih-1d": (lambda a: a.update(w_ih=a["w_ih"].reshape(-1)), RuntimeError),
    "w_hh-wrong-shape": (lambda a: a.update(w_hh=torch.randn(20, 4)), RuntimeError),
    "w_hh-noncontiguous": (lambda a: a.update(w_hh=_noncontig(a["w_hh"])), RuntimeError),
    "only-b_ih": (lambda a: a.update(b_hh=None), RuntimeError),
    "only-b_hh": (lambda a: a.update(b_ih=None), RuntimeError),
    "b_ih-wrong-size": (lambda a: a.update(b_ih=torch.randn(16)), RuntimeError),
    "b_hh-2d": (lambda a: a.update(b_hh=a["b_hh"].reshape(4, 5)), RuntimeError),
    "b_hh-noncontiguous": (lambda a: a.update(b_hh=_noncontig(a["b_hh"])), RuntimeError),
    "w_hr-with-w_hh-of-H": (lambda a: a.update(w_hr=torch.randn(2, 5)), RuntimeError),
    "w_hr-wrong-H": (lambda a: a.update(w_hr=torch.randn(5, 4), w_hh=torch.randn(20, 5)), RuntimeError),
    "w_hr-empty": (lambda a: a.update(w_hr=torch.randn(0, 5)), RuntimeError),
    "w_hr-1d": (lambda a: a.update(w_hr=torch.randn(5)), RuntimeError),
    "x-none": (lambda a: a.update(x=None), (RuntimeError, TypeError)),
    "batch_sizes-none": (lambda a: a.update(batch_sizes=None), (RuntimeError, TypeError)),
}


@pytest.mark.parametrize("case", sorted(BAD_FORWARD))
def test_forward_op_rejects_bad_arguments(case):
    mutate, expected = BAD_FORWARD[case]
    kwargs = _valid_forward_kwargs()
    _forward_op(**kwargs)  # the unmutated call is valid
    mutate(kwargs)
    with pytest.raises(expected):
        _forward_op(**kwargs)


def test_forward_op_accepts_noncontiguous_batch_sizes():
    kwargs = _valid_forward_kwargs()
    expected = _forward_op(**kwargs)
    kwargs["batch_sizes"] = torch.tensor([3, 9, 2, 9, 2, 9, 1, 9])[::2]  # [3, 2, 2, 1], stride 2
    assert not kwargs["batch_sizes"].is_contiguous()
    for a, b in zip(_forward_op(**kwargs), expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _valid_backward_kwargs(proj=0):
    fwd = _valid_forward_kwargs(proj=proj)
    y, h_n, c_n, gates, cells = _forward_op(**fwd)
    return dict(
        grad_y=torch.randn_like(y), grad_h_n=torch.randn_like(h_n), grad_c_n=torch.randn_like(c_n),
        x=fwd["x"], batch_sizes=fwd["batch_sizes"], h0=fwd["h0"], c0=fwd["c0"], w_ih=fwd["w_ih"],
        w_hh=fwd["w_hh"], w_hr=fwd["w_hr"], y=y, gates=gates, cells=cells, reverse=False, has_bias=True,
    )  # fmt: skip


BAD_BACKWARD = {
    "gates-not-saved": (lambda a: a.update(gates=torch.randn(0, 20), cells=torch.randn(0, 5)), RuntimeError),
    "grad_y-wrong-shape": (lambda a: a.update(grad_y=torch.randn(8, 4)), RuntimeError),
    "grad_y-float64": (lambda a: a.update(grad_y=a["grad_y"].double()), TypeError),
    "grad_y-noncontiguous": (lambda a: a.update(grad_y=_noncontig(a["grad_y"])), RuntimeError),
    "grad_h_n-wrong-batch": (lambda a: a.update(grad_h_n=torch.randn(2, 5)), RuntimeError),
    "grad_c_n-wrong-hidden": (lambda a: a.update(grad_c_n=torch.randn(3, 6)), RuntimeError),
    "y-wrong-rows": (lambda a: a.update(y=torch.randn(7, 5)), RuntimeError),
    "gates-wrong-width": (lambda a: a.update(gates=torch.randn(8, 16)), RuntimeError),
    "cells-wrong-shape": (lambda a: a.update(cells=torch.randn(8, 4)), RuntimeError),
    "cells-float16": (lambda a: a.update(cells=a["cells"].half()), TypeError),
    "batch_sizes-sum-mismatch": (lambda a: a.update(batch_sizes=torch.tensor([3, 3, 3])), RuntimeError),
    "batch_sizes-increasing": (lambda a: a.update(batch_sizes=torch.tensor([1, 2, 2, 3])), RuntimeError),
    "batch_sizes-zero": (lambda a: a.update(batch_sizes=torch.tensor([4, 4, 0, 0])), RuntimeError),
    "batch_sizes-empty": (lambda a: a.update(batch_sizes=torch.tensor([], dtype=torch.int64)), RuntimeError),
    "batch_sizes-int32": (lambda a: a.update(batch_sizes=a["batch_sizes"].int()), TypeError),
    "x-3d": (lambda a: a.update(x=a["x"].unsqueeze(0)), RuntimeError),
    "w_hh-wrong-shape": (lambda a: a.update(w_hh=torch.randn(20, 4)), RuntimeError),
    "w_hr-unexpected": (lambda a: a.update(w_hr=torch.randn(2, 5)), RuntimeError),
    "h0-float64": (lambda a: a.update(h0=a["h0"].double()), TypeError),
}


@pytest.mark.parametrize("case", sorted(BAD_BACKWARD))
def test_backward_op_rejects_bad_arguments(case):
    mutate, expected = BAD_BACKWARD[case]
    kwargs = _valid_backward_kwargs()
    _backward_op(**kwargs)  # the unmutated call is valid
    mutate(kwargs)
    with pytest.raises(expected):
        _backward_op(**kwargs)


def test_backward_op_matches_autograd_of_reference():
    """The raw backward op against autograd through the reference (float64), incl. proj."""
    kwargs = _valid_backward_kwargs(proj=3)
    kwargs = {k: v.double() if isinstance(v, Tensor) and v.is_floating_point() else v for k, v in kwargs.items()}
    fwd = _forward_op(kwargs["x"], kwargs["batch_sizes"], kwargs["h0"], kwargs["c0"], kwargs["w_ih"],
                      kwargs["w_hh"], None, None, kwargs["w_hr"], False, True)  # fmt: skip
    kwargs.update(y=fwd[0], gates=fwd[3], cells=fwd[4], has_bias=False)
    grads = _backward_op(**kwargs)
    leaves = [kwargs[k].detach().clone().requires_grad_() for k in ("x", "h0", "c0", "w_ih", "w_hh", "w_hr")]
    x, h0, c0, w_ih, w_hh, w_hr = leaves
    y, h, c = lstm_layer_reference(x, kwargs["batch_sizes"], h0, c0, w_ih, w_hh, None, None, w_hr)
    assert_close(fwd[0], y, torch.float64, "y")
    loss = (y * kwargs["grad_y"]).sum() + (h * kwargs["grad_h_n"]).sum() + (c * kwargs["grad_c_n"]).sum()
    expected = torch.autograd.grad(loss, leaves)
    got = [grads[0], grads[1], grads[2], grads[3], grads[4], grads[6]]
    for name, a, e in zip(("x", "h0", "c0", "w_ih", "w_hh", "w_hr"), got, expected):
        assert_close(a, e, torch.float64, f"grad_{name}")
    assert grads[5].numel() == 0  # no bias


# --------------------------------------------------------------------------------------
# seqkernels.LSTM against nn.LSTM and the reference
# --------------------------------------------------------------------------------------
@given(
    steps=st.integers(1, 7),
    batch=st.one_of(st.integers(1, 5), st.just(9)),
    with_state=st.booleans(),
    dtype=dtypes,
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_lstm_matches_nn_lstm(device, steps, batch, with_state, dtype, seed, data):
    """Padded input, every flag: output, h_n, c_n and the gradients of the input, h0, c0
    and every parameter, against nn.LSTM with the same weights and the float64 reference."""
    torch.manual_seed(seed)
    config = data.draw(lstm_configs(dtype), label="config")
    note(f"config={config} T={steps} B={batch} state={with_state} {dtype}")
    shape = (batch, steps, config["input_size"]) if config["batch_first"] else (steps, batch, config["input_size"])
    inputs = {"x": torch.randn(*shape, device=device).to(dtype)}
    if with_state:
        inputs.update(states(config, batch, dtype, device))
    check_against_references(config, inputs, dtype, device, lstm_module_fn, lstm_module_fn, lstm_reference_fn(config))


def _packed_fn(enforce_sorted: bool, with_lengths: Tensor):
    """forward_backward fn: padded x [T, B, I] -> PackedSequence -> module; outputs are the
    packed data and h_n, c_n (in the caller's batch order)."""

    def make(module):
        def fn(inputs, _params):
            packed = pack_padded_sequence(inputs["x"], with_lengths, enforce_sorted=enforce_sorted)
            hx = (inputs["h0"], inputs["c0"]) if "h0" in inputs else None
            out, (h, c) = module(packed, hx)
            assert isinstance(out, PackedSequence)
            assert torch.equal(out.batch_sizes, packed.batch_sizes)
            for a, b in ((out.sorted_indices, packed.sorted_indices), (out.unsorted_indices, packed.unsorted_indices)):
                assert (a is None and b is None) or torch.equal(a, b)
            return {"output": out.data, "h_n": h, "c_n": c}

        return fn

    return make


def _packed_reference_fn(config: dict, enforce_sorted: bool, lengths: Tensor):
    def fn(inputs, params):
        packed = pack_padded_sequence(inputs["x"], lengths, enforce_sorted=enforce_sorted)
        hx = None
        if "h0" in inputs:
            perm = packed.sorted_indices
            hx = (inputs["h0"], inputs["c0"]) if perm is None else (inputs["h0"][:, perm], inputs["c0"][:, perm])
        out, (h, c) = lstm_reference(
            packed.data, hx, list(params.values()), num_layers=config["num_layers"],
            bidirectional=config["bidirectional"], has_biases=config["bias"], proj_size=config["proj_size"],
            batch_sizes=packed.batch_sizes,
        )  # fmt: skip
        if packed.unsorted_indices is not None:
            h, c = h[:, packed.unsorted_indices], c[:, packed.unsorted_indices]
        return {"output": out, "h_n": h, "c_n": c}

    return fn


@given(
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=6),
    enforce_sorted=st.booleans(),
    with_state=st.booleans(),
    dtype=dtypes,
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_packed_sequence_matches_nn_lstm(device, lengths, enforce_sorted, with_state, dtype, seed, data):
    """PackedSequence with random lengths (sorted or not), incl. bidirectional and h0:
    PackedSequence out with nn.LSTM's batch_sizes and indices, values and gradients."""
    torch.manual_seed(seed)
    config = {**data.draw(lstm_configs(dtype, max_layers=2), label="config"), "batch_first": False}
    if enforce_sorted:
        lengths = sorted(lengths, reverse=True)
    note(f"config={config} lengths={lengths} sorted={enforce_sorted} state={with_state} {dtype}")
    lengths_t = torch.tensor(lengths, dtype=torch.int64)
    inputs = {"x": torch.randn(max(lengths), len(lengths), config["input_size"], device=device).to(dtype)}
    if with_state:
        inputs.update(states(config, len(lengths), dtype, device))
    make = _packed_fn(enforce_sorted, lengths_t)
    check_against_references(
        config, inputs, dtype, device, make, make, _packed_reference_fn(config, enforce_sorted, lengths_t)
    )


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("proj_size", [0, 2])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_unbatched_input_matches_nn_lstm(device, bidirectional, proj_size, with_state, batch_first):
    torch.manual_seed(6)
    config = dict(input_size=3, hidden_size=5, num_layers=2, bias=True, batch_first=batch_first,
                  bidirectional=bidirectional, proj_size=proj_size)  # fmt: skip
    inputs = {"x": torch.randn(6, 3, device=device, dtype=torch.float64)}
    if with_state:
        inputs.update({k: v.squeeze(1) for k, v in states(config, 1, torch.float64, device).items()})
    ref_module, ours = make_lstms(config, torch.float64, device)
    got, upstream = forward_backward(lstm_module_fn(ours), inputs, module_params(ours))
    expected, _ = forward_backward(lstm_module_fn(ref_module), inputs, module_params(ref_module), upstream)
    compare_results(got, expected, torch.float64, "unbatched")
    d = 2 if bidirectional else 1
    assert got["output"].shape == (6, d * (proj_size or 5)) and got["h_n"].shape == (2 * d, proj_size or 5)


def test_returned_state_supports_in_place_ops(device):
    """h_n / c_n of a one-layer, one-direction LSTM are views of the op's outputs (no copy):
    in-place updates of them (a common way of carrying state between chunks) give nn.LSTM's
    values and gradients, and a second call does not see them."""
    torch.manual_seed(8)
    config = dict(input_size=4, hidden_size=6, num_layers=1, bias=True, batch_first=False, bidirectional=False,
                  proj_size=0)  # fmt: skip
    ref_module, ours = make_lstms(config, torch.float64, device)
    x = torch.randn(5, 3, 4, device=device, dtype=torch.float64)
    results = []
    for module in (ours, ref_module):
        xg = x.clone().requires_grad_()
        y, (h, c) = module(xg)
        h.mul_(2.0)
        c.add_(0.5)
        (y.sum() + (h * h).sum() + (c * c).sum()).backward()
        y2, (h2, _) = module(x)
        results.append((y.detach(), h.detach(), c.detach(), xg.grad, module.weight_hh_l0.grad, h2.detach()))
    for name, a, e in zip(("y", "h_n", "c_n", "grad x", "grad w_hh", "h_n of a second call"), *results):
        assert_close(a, e, torch.float64, name)


def test_inference_and_noncontiguous_input(device):
    """no_grad (the op's inference path) and a non-contiguous batch_first input view."""
    torch.manual_seed(7)
    config = dict(
        input_size=4, hidden_size=6, num_layers=2, bias=True, batch_first=True, bidirectional=True, proj_size=0
    )
    ref_module, ours = make_lstms(config, torch.float32, device)
    x = torch.randn(5, 3, 4, device=device).transpose(0, 1)  # [B=3, T=5, I] view, not contiguous
    assert not x.is_contiguous()
    with torch.no_grad():
        out, (h, c) = ours(x)
        out_ref, (h_ref, c_ref) = ref_module(x)
    for name, a, e in (("output", out, out_ref), ("h_n", h, h_ref), ("c_n", c, c_ref)):
        assert_close(a, e, torch.float32, name)


# The loops a test forces per device (SEQKERNELS_LSTM_BACKEND); "persistent-avx2": the CPU's
# AVX2 kernels on an AVX-512 machine too (SEQKERNELS_CPU_AVX512=0); "persistent-amx": its
# products on AMX tiles at any batch (SEQKERNELS_CPU_AMX=1; skipped without AMX).
LOOPS = {"cpu": ("persistent", "gemm", "persistent-avx2", "persistent-amx"), "cuda": ("persistent", "fused", "cublas")}


def _force_loop(device: str, monkeypatch, loop_index: int) -> str:
    """Forces LOOPS[device][loop_index] (SEQKERNELS_LSTM_BACKEND and the CPU's kernel switches) and
    returns its name; skips where the device has fewer loops or the CPU no AMX."""
    if loop_index >= len(LOOPS[device]):
        pytest.skip(f"{device} has {len(LOOPS[device])} loops to force")
    loop = LOOPS[device][loop_index]
    backend = loop
    if loop == "persistent-avx2":
        monkeypatch.setenv("SEQKERNELS_CPU_AVX512", "0")
        backend = "persistent"
    if loop == "persistent-amx":
        if not cpu_has_amx():
            pytest.skip("this CPU has no AMX-BF16")
        monkeypatch.setenv("SEQKERNELS_CPU_AMX", "1")
        backend = "persistent"
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", backend)
    return loop


@pytest.mark.parametrize("loop_index", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", ["float32", "tf32", "bfloat16"])
@pytest.mark.parametrize("batch, hidden", [(3, 16), (12, 64), (12, 600)])
def test_nan_in_the_input_propagates_like_nn_lstm(device, monkeypatch, loop_index, precision, batch, hidden):
    """A NaN in one input element makes its batch row's outputs NaN from that step on and
    leaves the other rows finite, as in nn.LSTM: no loop clamps, flushes or spreads it
    (activation approximations, TF32 / 16-bit conversions, the persistent kernels' exchange
    formats: on CUDA B = 12 runs the direct kernel with two rows per lane, float32 without TF32
    with h as 30-bit values). The CPU's vectorised exp once clamped NaN to a finite value."""
    _force_loop(device, monkeypatch, loop_index)
    if precision == "tf32":
        if device == "cpu":
            pytest.skip("TF32 is a CUDA precision")
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    T, nan_step, nan_row = 8, 3, 1
    config = dict(input_size=hidden, hidden_size=hidden, num_layers=1, bias=True, batch_first=False,
                  bidirectional=False, proj_size=0)
    torch.manual_seed(batch + hidden)
    ref_module, ours = make_lstms(config, dtype, device)
    x = torch.randn(T, batch, hidden, device=device, dtype=dtype)
    x[nan_step, nan_row, 0] = float("nan")
    with torch.no_grad():
        out, (h, c) = ours(x)
        out_ref, (h_ref, c_ref) = ref_module(x)
    want = torch.zeros(T, batch, hidden, dtype=torch.bool, device=device)
    want[nan_step:, nan_row] = True
    for name, got, ref in (("output", out, out_ref), ("h_n", h[0], h_ref[0]), ("c_n", c[0], c_ref[0])):
        expected = want if name == "output" else want[-1]
        assert torch.equal(torch.isnan(ref), expected), f"nn.LSTM's {name}: not the NaN pattern assumed"
        assert torch.equal(torch.isnan(got), expected), f"{name}: NaN where nn.LSTM has none, or the reverse"


@pytest.mark.parametrize("loop_index", [0, 1, 2, 3])
@pytest.mark.parametrize("batch, hidden", [(3, 16), (12, 64), (3, 600), (12, 600)])
def test_inf_in_h0_saturates_like_nn_lstm(device, monkeypatch, loop_index, batch, hidden):
    """float32 (TF32 off): an inf in h0 reaches the first step's pre-activations as in nn.LSTM's
    float32 GEMM, so its row's gates saturate and every output stays finite, within float32's
    bound of nn.LSTM. No loop may split it into inf - inf = NaN (the CPU's AMX parts, the CUDA
    direct kernel's x3 parts: B = 3, H = 600 on fp16 parts, the other shapes on TF32 parts)."""
    loop = _force_loop(device, monkeypatch, loop_index)
    if device == "cuda" and loop == "fused":
        pytest.skip("the fused loop's split products turn an inf in h0 into NaN (docs/precision.md)")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    config = dict(input_size=hidden, hidden_size=hidden, num_layers=1, bias=True, batch_first=False,
                  bidirectional=False, proj_size=0)
    torch.manual_seed(3 * batch + hidden)
    ref_module, ours = make_lstms(config, torch.float32, device)
    x = torch.randn(6, batch, hidden, device=device)
    h0 = torch.randn(1, batch, hidden, device=device)
    c0 = torch.randn(1, batch, hidden, device=device)
    h0[0, batch - 1, hidden // 2] = float("inf")
    with torch.no_grad():
        got = ours(x, (h0, c0))
        want = ref_module(x, (h0, c0))
    for name, a, e in (("output", got[0], want[0]), ("h_n", got[1][0], want[1][0]), ("c_n", got[1][1], want[1][1])):
        assert torch.isfinite(e).all(), f"nn.LSTM's {name}: not finite, not the case assumed"
        assert torch.isfinite(a).all(), f"{name}: not finite where nn.LSTM's is"
        assert_close(a, e, torch.float32, name)


def test_empty_batch_like_nn_lstm():
    """B = 0 gives nn.LSTM's (empty) shapes. CPU only: cuDNN's handling of B = 0 is not
    what is under test."""
    config = dict(
        input_size=3, hidden_size=4, num_layers=2, bias=True, batch_first=False, bidirectional=True, proj_size=2
    )
    ref_module, ours = make_lstms(config, torch.float32, "cpu")
    x = torch.randn(5, 0, 3)
    out, (h, c) = ours(x)
    out_ref, (h_ref, c_ref) = ref_module(x)
    assert out.shape == out_ref.shape and h.shape == h_ref.shape and c.shape == c_ref.shape


def test_long_sequence_beyond_65535_steps(device):
    """T = 70000 > 65535 (a limit of CUDA grid dimensions and of 16-bit counters), both
    directions. Forward: output, h_n and c_n against nn.LSTM (float32: nn.LSTM's CPU
    float64 path and its backward take minutes over 70000 steps). Gradients: every
    gradient's directional derivative against central differences of the float64 forward,
    which is independent of the backward kernel."""
    torch.manual_seed(8)
    steps = 70000
    config = dict(
        input_size=2, hidden_size=4, num_layers=1, bias=True, batch_first=False, bidirectional=True, proj_size=0
    )
    ref_module, ours = make_lstms(config, torch.float32, device)
    x = torch.randn(steps, 1, 2, device=device)
    # The reference runs on the CPU: cuDNN rejects this length (CUDNN_STATUS_NOT_SUPPORTED).
    # (Not under no_grad: nn.LSTM's CPU inference path takes ~45 s for this sequence.)
    got = ours(x)
    expected = ref_module.cpu()(x.cpu())
    expected = (expected[0].to(device), tuple(t.to(device) for t in expected[1]))
    assert_close(got[0], expected[0], torch.float32, "output")
    assert_close(got[1][0], expected[1][0], torch.float32, "h_n")
    assert_close(got[1][1], expected[1][1], torch.float32, "c_n")

    ours = ours.double()
    leaves = {
        "x": x.double(),
        "h0": torch.randn(2, 1, 4, device=device, dtype=torch.float64),
        "c0": torch.randn(2, 1, 4, device=device, dtype=torch.float64),
        **{k: v.detach().clone() for k, v in ours.named_parameters()},
    }
    upstream = [torch.randn(steps, 1, 8, device=device, dtype=torch.float64),
                torch.randn(2, 1, 4, device=device, dtype=torch.float64),
                torch.randn(2, 1, 4, device=device, dtype=torch.float64)]  # fmt: skip

    def loss(t: dict) -> Tensor:
        params = {k: v for k, v in t.items() if k not in ("x", "h0", "c0")}
        out, (h, c) = torch.func.functional_call(ours, params, (t["x"], (t["h0"], t["c0"])))
        return (out * upstream[0]).sum() + (h * upstream[1]).sum() + (c * upstream[2]).sum()

    leaves = {k: v.requires_grad_(True) for k, v in leaves.items()}
    grads = dict(zip(leaves, torch.autograd.grad(loss(leaves), list(leaves.values()))))
    eps = 1e-6
    with torch.no_grad():
        for name, leaf in leaves.items():
            direction = torch.randn_like(leaf)
            plus = loss({**leaves, name: leaf + eps * direction})
            minus = loss({**leaves, name: leaf - eps * direction})
            numeric = ((plus - minus) / (2 * eps)).item()
            analytic = (grads[name] * direction).sum().item()
            assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(analytic)), (name, numeric, analytic)


# --------------------------------------------------------------------------------------
# Dropout
# --------------------------------------------------------------------------------------
def test_dropout_eval_is_identity(device):
    torch.manual_seed(9)
    config = dict(input_size=3, hidden_size=5, num_layers=3, bias=True, batch_first=False, bidirectional=True,
                  proj_size=0, dropout=0.4)  # fmt: skip
    ref_module, ours = make_lstms(config, torch.float64, device)
    ref_module.eval()
    ours.eval()
    x = torch.randn(6, 2, 3, device=device, dtype=torch.float64)
    out, (h, c) = ours(x)
    out_ref, (h_ref, c_ref) = ref_module(x)
    for name, a, e in (("output", out, out_ref), ("h_n", h, h_ref), ("c_n", c, c_ref)):
        assert_close(a, e, torch.float64, name)


def test_dropout_train_masks_between_layers(device):
    """In training, dropout applies to the (packed) output of every layer but the last:
    reproduce it exactly from the reference with the same seed, and check the mask is
    random and of plausible density."""
    p = 0.5
    config = dict(input_size=3, hidden_size=16, num_layers=2, bias=True, batch_first=False, bidirectional=True,
                  proj_size=0, dropout=p)  # fmt: skip
    torch.manual_seed(10)
    ref_module, ours = make_lstms(config, torch.float64, device)
    ours.train()
    x = torch.randn(7, 4, 3, device=device, dtype=torch.float64)
    torch.manual_seed(123)
    out_train, (h_train, _) = ours(x)
    out_eval, _ = ours.eval()(x)
    ours.train()
    assert not torch.allclose(out_train, out_eval), "dropout had no effect in training"
    torch.manual_seed(124)
    assert not torch.allclose(ours(x)[0], out_train), "dropout masks do not change with the seed"

    # Reference: layer 0 (both directions), dropout with the same seed, layer 1.
    w = list(ref_module._flat_weights)
    packed = x.reshape(28, 3)
    bs = torch.full((7,), 4, dtype=torch.int64)
    h0 = torch.zeros(4, 16, device=device, dtype=torch.float64)
    y0 = torch.cat([lstm_layer_reference(packed, bs, h0, h0, *w[0:4])[0],
                    lstm_layer_reference(packed, bs, h0, h0, *w[4:8], reverse=True)[0]], dim=1)  # fmt: skip
    torch.manual_seed(123)
    y0_dropped = F.dropout(y0, p, training=True)
    zero_fraction = (y0_dropped == 0).double().mean().item()
    assert 0.3 < zero_fraction < 0.7, zero_fraction
    y1 = torch.cat([lstm_layer_reference(y0_dropped, bs, h0, h0, *w[8:12])[0],
                    lstm_layer_reference(y0_dropped, bs, h0, h0, *w[12:16], reverse=True)[0]], dim=1)  # fmt: skip
    assert_close(out_train, y1.reshape(7, 4, 32), torch.float64, "output with dropout")
    # Gradients flow through the dropout.
    x_leaf = x.clone().requires_grad_()
    ours(x_leaf)[0].sum().backward()
    assert x_leaf.grad is not None and torch.isfinite(x_leaf.grad).all()


# --------------------------------------------------------------------------------------
# state_dict, pickling, functional_call, replace_lstm
# --------------------------------------------------------------------------------------
STATE_DICT_CONFIGS = [
    dict(num_layers=1, bias=True, bidirectional=False, proj_size=0),
    dict(num_layers=2, bias=False, bidirectional=True, proj_size=0),
    dict(num_layers=2, bias=True, bidirectional=True, proj_size=3),
    dict(num_layers=3, bias=False, bidirectional=False, proj_size=2),
]


@pytest.mark.parametrize("extra", STATE_DICT_CONFIGS)
def test_state_dict_round_trip(device, extra):
    torch.manual_seed(11)
    kw = dict(input_size=4, hidden_size=5, batch_first=True, **extra)
    original = nn.LSTM(**kw).to(device)
    ours = LSTM(**kw, device=device)
    assert [(k, v.shape) for k, v in ours.state_dict().items()] == [
        (k, v.shape) for k, v in original.state_dict().items()
    ]
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in original.named_parameters()]
    ours.load_state_dict(original.state_dict())  # nn.LSTM -> seqkernels
    back = nn.LSTM(**kw).to(device)
    back.load_state_dict(ours.state_dict())  # seqkernels -> nn.LSTM
    x = torch.randn(3, 6, 4, device=device)
    expected = original(x)
    for name, module in (("seqkernels", ours), ("nn.LSTM round trip", back)):
        out, (h, c) = module(x)
        assert_close(out, expected[0], torch.float32, f"{name} output")
        assert_close(h, expected[1][0], torch.float32, f"{name} h_n")
        assert_close(c, expected[1][1], torch.float32, f"{name} c_n")


def test_module_identity_and_copies():
    m = LSTM(3, 4, 2, True, True, 0.0, True, 2)  # nn.LSTM's positional form
    assert not isinstance(m, nn.LSTM) and isinstance(m, nn.RNNBase)
    assert (m.num_layers, m.bias, m.batch_first, m.bidirectional, m.proj_size) == (2, True, True, True, 2)
    assert repr(m) == repr(nn.LSTM(3, 4, 2, True, True, 0.0, True, 2))
    x = torch.randn(2, 5, 3)
    expected = m(x)[0]
    buffer = io.BytesIO()
    torch.save(m, buffer)
    buffer.seek(0)
    for clone in (copy.deepcopy(m), torch.load(buffer, weights_only=False)):
        assert type(clone) is LSTM
        torch.testing.assert_close(clone(x)[0], expected, rtol=0, atol=0)
    # dtype conversion after construction (RNNBase._apply) keeps working
    assert_close(m.double()(x.double())[0], expected.double(), torch.float32, "after .double()")


def test_functional_call_matches_nn_lstm():
    torch.manual_seed(12)
    config = dict(
        input_size=3, hidden_size=4, num_layers=2, bias=True, batch_first=False, bidirectional=True, proj_size=0
    )
    ref_module, ours = make_lstms(config, torch.float64, "cpu")
    params = {k: torch.randn_like(v) * 0.3 for k, v in ref_module.named_parameters()}
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    got = torch.func.functional_call(ours, params, (x,))
    expected = torch.func.functional_call(ref_module, params, (x,))
    assert_close(got[0], expected[0], torch.float64, "output")
    assert not torch.allclose(got[0], ours(x)[0]), "functional_call's parameters were ignored"


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.LSTM(4, 6, num_layers=2, bidirectional=True)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(12, 5), nn.LSTM(5, 7, batch_first=True, proj_size=3))])
        self.cell = nn.LSTMCell(3, 5, bias=False)
        self.head = nn.Linear(5, 2)

    def forward(self, x):
        y, _ = self.encoder(x)  # [T, B, 12]
        z = self.blocks[0][0](y).transpose(0, 1)  # [B, T, 5]
        z, _ = self.blocks[0][1](z)  # [B, T, 3]
        h, c = self.cell(z[:, -1])
        return self.head(h + c)


def test_replace_lstm():
    torch.manual_seed(13)
    model = _Model().double().eval()
    model.encoder.weight_ih_l0.requires_grad_(False)
    x = torch.randn(6, 2, 4, dtype=torch.float64)
    expected = model(x)
    assert replace_lstm(model) is model
    assert type(model.encoder) is LSTM and type(model.blocks[0][1]) is LSTM and type(model.cell) is LSTMCell
    assert type(model.blocks[0][0]) is nn.Linear
    assert not any(type(m) in (nn.LSTM, nn.LSTMCell) for m in model.modules())
    assert not model.encoder.training
    assert model.encoder.weight_ih_l0.dtype == torch.float64
    assert not model.encoder.weight_ih_l0.requires_grad and model.encoder.weight_hh_l0.requires_grad
    assert (model.blocks[0][1].batch_first, model.blocks[0][1].proj_size, model.cell.bias) == (True, 3, False)
    assert_close(model(x), expected, torch.float64, "model output after replace_lstm")


def test_replace_lstm_on_the_module_itself_and_shared():
    lstm = nn.LSTM(3, 4, dropout=0.0).train()
    new = replace_lstm(lstm)
    assert type(new) is LSTM and new.training
    x = torch.randn(5, 2, 3)
    assert_close(new(x)[0], lstm(x)[0], torch.float32, "output")
    cell = nn.LSTMCell(3, 4)
    assert type(replace_lstm(cell)) is LSTMCell
    shared = nn.LSTM(3, 4)
    seq = nn.Sequential(shared, nn.Identity())
    seq.append(shared)
    replace_lstm(seq)
    assert seq[0] is seq[2] and type(seq[0]) is LSTM


# --------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------
class _Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(5, 6)
        self.lstm = LSTM(6, 8, num_layers=2, batch_first=True, bidirectional=True, proj_size=4)
        self.head = nn.Linear(8, 3)

    def forward(self, x, hx=None):
        y, (h, c) = self.lstm(torch.tanh(self.embed(x)), hx)
        return self.head(y), h, c


class _OneLayer(nn.Module):
    """One layer, one direction, no projection: the module's short path (LSTM._forward_short)."""

    def __init__(self):
        super().__init__()
        self.lstm = LSTM(5, 8, batch_first=True)

    def forward(self, x, hx=None):
        y, (h, c) = self.lstm(x, hx)
        return y, h, c


def test_short_path_taken_only_where_it_applies(device):
    """The module's short path (one layer, one direction, no projection, valid 3-D input and
    state) runs for the common call and declines everything else, which the general path
    validates; both are checked against nn.LSTM by the property tests above."""
    torch.manual_seed(15)
    x = torch.randn(4, 2, 3, device=device)
    state = (torch.randn(1, 2, 5, device=device), torch.randn(1, 2, 5, device=device))
    one = LSTM(3, 5, device=device)
    assert one._forward_short(x, None) is not None
    assert one._forward_short(x, state) is not None
    stack = LSTM(3, 5, num_layers=2, device=device)
    stack_state = (torch.randn(2, 2, 5, device=device), torch.randn(2, 2, 5, device=device))
    assert stack._forward_short(x, None) is not None
    assert stack._forward_short(x, stack_state) is not None
    both = LSTM(3, 5, bidirectional=True, device=device)
    assert both._forward_short(x, None) is not None
    assert both._forward_short(x, stack_state) is not None  # [L*D, B, H]: one layer, two directions
    declined = [
        (stack, x, state),  # one layer's state for two layers: the general path raises
        (both, x, state),  # one direction's state for two
        (LSTM(3, 5, proj_size=2, device=device), x, None),
        (one, x[:, 0], None),  # unbatched
        (one, x.double(), None),  # dtype mismatch: the general path raises
        (one, x, (state[0][:, :1], state[1])),  # wrong state size: the general path raises
        (one, x, list(state)),
        (one, torch.nn.utils.rnn.pack_padded_sequence(x, [4, 3]), None),
    ]
    for module, inp, hx in declined:
        assert module._forward_short(inp, hx) is None


def _op_names(fn):
    """fn's result and the names of the operators it ran (profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    return out, {e.name for e in prof.events()}


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_short_path_is_one_lstm_infer_call_where_autograd_records_nothing(device, batch_first, with_state):
    """Where autograd records nothing (no_grad, or no tensor requires grad) the short path runs the
    lstm_infer operator: the same lstm_forward as lstm_layer, so the outputs are lstm_layer's
    bitwise, and nn.LSTM's within float32's tolerance. Where autograd records, it runs lstm_layer."""
    torch.manual_seed(17)
    T, B, I, H = 5, 3, 4, 6
    ours = LSTM(I, H, batch_first=batch_first, device=device)
    ref = nn.LSTM(I, H, batch_first=batch_first, device=device)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(B, T, I, device=device) if batch_first else torch.randn(T, B, I, device=device)
    state = (torch.randn(1, B, H, device=device), torch.randn(1, B, H, device=device)) if with_state else None
    with torch.no_grad():
        (y, (h_n, c_n)), names = _op_names(lambda: ours(x, state))
        expected_y, (expected_h, expected_c) = ref(x, state)
    assert "seqkernels::lstm_infer" in names and "seqkernels::lstm_forward" not in names
    assert y.shape == expected_y.shape and y.stride() == expected_y.stride()
    h0 = state[0][0] if with_state else torch.zeros(B, H, device=device)
    c0 = state[1][0] if with_state else torch.zeros(B, H, device=device)
    seq = x.transpose(0, 1) if batch_first else x
    layer_y, layer_h, layer_c = lstm_layer(seq.reshape(T * B, I), torch.full((T,), B, dtype=torch.int64), h0, c0,
                                           ours.weight_ih_l0.detach(), ours.weight_hh_l0.detach(),
                                           ours.bias_ih_l0.detach(), ours.bias_hh_l0.detach())
    layer_y = layer_y.view(T, B, H)
    torch.testing.assert_close(y, layer_y.transpose(0, 1) if batch_first else layer_y, rtol=0, atol=0)
    torch.testing.assert_close(h_n, layer_h.unsqueeze(0), rtol=0, atol=0)
    torch.testing.assert_close(c_n, layer_c.unsqueeze(0), rtol=0, atol=0)
    for name, a, b in (("y", y, expected_y), ("h_n", h_n, expected_h), ("c_n", c_n, expected_c)):
        assert_close(a, b, torch.float32, name)
    # Parameters that require grad with grad mode on: autograd records, so lstm_layer's op runs.
    (y_grad, _), names = _op_names(lambda: ours(x, state))
    assert "seqkernels::lstm_forward" in names and "seqkernels::lstm_infer" not in names
    torch.testing.assert_close(y_grad.detach(), y, rtol=0, atol=0)


class _WithoutShortPath:
    """A module's attributes with its _forward_short declining: LSTM.forward or LSTMCell.forward on it
    runs the general path (lstm_layer)."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)

    def _forward_short(self, input, hx):
        return None


@pytest.mark.parametrize("with_state", [False, True])
def test_cell_short_path_is_one_lstm_cell_call(device, with_state):
    """LSTMCell's common call is one lstm_cell call. Where autograd records nothing it runs below
    autograd (no node): lstm_layer's results bitwise, nn.LSTMCell's within float32's tolerance;
    where autograd records, its C++ node, with the general path's outputs and gradients bitwise;
    anything unusual (unbatched input, a list state, another dtype, a wrong state shape) goes to
    the general path, which raises nn.LSTMCell's errors."""
    torch.manual_seed(19)
    B, I, H = 3, 4, 6
    ours = LSTMCell(I, H, device=device)
    ref = nn.LSTMCell(I, H, device=device)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(B, I, device=device)
    state = (torch.randn(B, H, device=device), torch.randn(B, H, device=device)) if with_state else None
    with torch.no_grad():
        (h, c), names = _op_names(lambda: ours(x, state))
        expected_h, expected_c = ref(x, state)
    assert "seqkernels::lstm_cell" in names and "seqkernels::lstm_infer" not in names
    assert h.grad_fn is None and c.grad_fn is None
    h0, c0 = state if with_state else (torch.zeros(B, H, device=device), torch.zeros(B, H, device=device))
    _, layer_h, layer_c = lstm_layer(x, torch.tensor([B]), h0, c0, ours.weight_ih.detach(), ours.weight_hh.detach(),
                                     ours.bias_ih.detach(), ours.bias_hh.detach())
    torch.testing.assert_close(h, layer_h, rtol=0, atol=0)
    torch.testing.assert_close(c, layer_c, rtol=0, atol=0)
    assert_close(h, expected_h, torch.float32, "h")
    assert_close(c, expected_c, torch.float32, "c")
    (h_grad, _), names = _op_names(lambda: ours(x, state))
    assert "seqkernels::lstm_cell" in names and "seqkernels::lstm_forward" in names
    assert "seqkernels::lstm_infer" not in names
    assert h_grad.grad_fn.name() == "torch::autograd::CppNode<seqkernels::LstmCellFunction>"
    torch.testing.assert_close(h_grad.detach(), h, rtol=0, atol=0)
    # Where autograd records, the short path's node makes the general path's lstm_layer op calls:
    # the same outputs and gradients, bitwise.
    assert ours._forward_short(x, state) is not None

    def gradients(call):
        for p in ours.parameters():
            p.grad = None
        h1, c1 = call()
        (h1.sin().sum() + c1.cos().sum()).backward()
        return [h1, c1] + [p.grad for p in ours.parameters()]

    short = gradients(lambda: ours(x, state))
    general = gradients(lambda: LSTMCell.forward(_WithoutShortPath(ours), x, state))
    for a, b in zip(short, general):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    if with_state:
        declined = [(x[0], None), (x, list(state)), (x.double(), None), (x, (state[0][:2], state[1])),
                    (x, (state[0], state[1].double()))]
        for inp, hx in declined:
            assert ours._forward_short(inp, hx) is None


def _layer_path_call(module, x, state):
    """The module's call through lstm_layer (autograd records its reshape, selects and views):
    the path lstm_padded replaces, as torch.compile and torch.func transforms still take it."""
    T, B = (x.shape[1], x.shape[0]) if module.batch_first else (x.shape[0], x.shape[1])
    seq = x.transpose(0, 1) if module.batch_first else x
    if state is None:
        zeros = x.new_zeros(2, B, module.hidden_size)
        h0, c0 = zeros[0], zeros[1]
    else:
        h0, c0 = state[0][0], state[1][0]
    y, h_n, c_n = lstm_layer(seq.reshape(T * B, -1), torch.full((T,), B, dtype=torch.int64), h0, c0,
                             module.weight_ih_l0, module.weight_hh_l0, module.bias_ih_l0 if module.bias else None,
                             module.bias_hh_l0 if module.bias else None)
    output = y.view(T, B, -1)
    return (output.transpose(0, 1) if module.batch_first else output), (h_n.unsqueeze(0), c_n.unsqueeze(0))


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("bias", [True, False])
def test_short_path_where_autograd_records_is_one_padded_node(device, batch_first, with_state, layout, bias):
    """Where autograd records in an eager call, the short path is one lstm_padded node (C++): the same
    lstm_forward and lstm_backward calls as the lstm_layer path, so outputs and every gradient
    (input, state, weights; losses on output, h_n and c_n) are that path's bitwise; its outputs are
    no views, and may be modified in place, after which backward raises as it does for lstm_layer's
    (output is saved), as it does after an in-place change of the input or the state it read."""
    torch.manual_seed(21)
    T, B, I, H = 5, 3, 4, 6
    m = LSTM(I, H, batch_first=batch_first, bias=bias, device=device)
    shape = (B, T, I) if batch_first else (T, B, I)
    if layout == "strided":  # every other feature of a wider tensor: not contiguous
        x = torch.randn(*shape[:2], 2 * I, device=device)[..., ::2].requires_grad_()
    else:
        x = torch.randn(*shape, device=device, requires_grad=True)
    state = tuple(torch.randn(1, B, H, device=device, requires_grad=True) for _ in range(2)) if with_state else None
    leaves = [x, *(state or ()), *m.parameters()]

    def run(call):
        for t in leaves:
            t.grad = None
        out, (h_n, c_n) = call()
        (out.sin().sum() + h_n.cos().sum() + (c_n * c_n).sum()).backward()
        return [out, h_n, c_n] + [t.grad for t in leaves]

    (got, names) = _op_names(lambda: run(lambda: m(x, state)))
    assert "seqkernels::lstm_forward" in names and "seqkernels::lstm_backward" in names
    expected = run(lambda: _layer_path_call(m, x, state))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    out, (h_n, c_n) = m(x, state)
    assert out.grad_fn.name() == "torch::autograd::CppNode<seqkernels::LstmPaddedFunction>"
    assert h_n.grad_fn is out.grad_fn
    assert not out._is_view() and not h_n._is_view()
    out.mul_(2)  # allowed, as on lstm_layer's output
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    if layout == "contiguous" and not batch_first:  # x is read in place: a later change is caught
        out, _ = m(x, state)
        with torch.no_grad():
            x.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
    if with_state:
        out, _ = m(x, state)
        with torch.no_grad():
            state[0].add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
@pytest.mark.parametrize("layers, bidirectional", [(3, False), (1, True), (2, True)])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_short_path_stack_matches_general_path(device, batch_first, with_state, dropout, layers, bidirectional,
                                               layout):
    """A stack without projection (several layers, or two directions) takes the short path layer by
    layer and direction by direction (one lstm_padded node each where autograd records, the second
    direction reversed): the general path's outputs and every gradient bitwise, with its strides,
    dropout between layers included (the same seed draws the same masks), and one lstm_infer call
    each where autograd records nothing."""
    T, B, I, H, L = 5, 3, 4, 6, layers
    D = 2 if bidirectional else 1
    torch.manual_seed(24)
    m = LSTM(I, H, num_layers=L, batch_first=batch_first, dropout=dropout if L > 1 else 0.0,
             bidirectional=bidirectional, device=device)
    shape = (B, T, I) if batch_first else (T, B, I)
    if layout == "strided":  # every other feature of a wider tensor: not contiguous
        x = torch.randn(*shape[:2], 2 * I, device=device)[..., ::2].requires_grad_()
    else:
        x = torch.randn(*shape, device=device, requires_grad=True)
    state = (tuple(torch.randn(L * D, B, H, device=device, requires_grad=True) for _ in range(2)) if with_state
             else None)
    leaves = [x, *(state or ()), *m.parameters()]

    def run(call):
        for t in leaves:
            t.grad = None
        torch.manual_seed(25)
        out, (h_n, c_n) = call()
        (out.sin().sum() + h_n.cos().sum() + (c_n * c_n).sum()).backward()
        return [out, h_n, c_n] + [t.grad for t in leaves]

    got, names = _op_names(lambda: run(lambda: m(x, state)))
    assert "seqkernels::lstm_padded" in names and "seqkernels::lstm_forward" in names
    expected = run(lambda: LSTM.forward(_WithoutShortPath(m), x, state))
    for a, b in zip(got, expected):
        assert a.shape == b.shape and a.stride() == b.stride()
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    out, (h_n, _) = m(x, state)
    if not bidirectional:  # else a cat joins the directions
        assert out.grad_fn.name() == "torch::autograd::CppNode<seqkernels::LstmPaddedFunction>"
    assert h_n.shape == (L * D, B, H)
    with torch.no_grad():
        torch.manual_seed(25)
        (y, (h_n, c_n)), names = _op_names(lambda: m(x, state))
    assert "seqkernels::lstm_infer" in names and "seqkernels::lstm_forward" not in names
    for a, b in zip((y, h_n, c_n), expected[:3]):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)


def test_short_path_stack_records_only_the_layers_that_need_it(device):
    """A stack whose first layer is frozen and whose input needs no gradient: the first layer is an
    lstm_infer call, the second an lstm_padded node, and the gradients of the second layer's
    weights are the general path's bitwise."""
    torch.manual_seed(26)
    m = LSTM(4, 6, num_layers=2, device=device)
    for p in (m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0, m.bias_hh_l0):
        p.requires_grad_(False)
    x = torch.randn(5, 3, 4, device=device)
    trained = [m.weight_ih_l1, m.weight_hh_l1, m.bias_ih_l1, m.bias_hh_l1]

    def run(call):
        for p in trained:
            p.grad = None
        out, _ = call()
        out.pow(2).sum().backward()
        return [out] + [p.grad for p in trained]

    got, names = _op_names(lambda: run(lambda: m(x)))
    assert "seqkernels::lstm_infer" in names and "seqkernels::lstm_padded" in names
    expected = run(lambda: LSTM.forward(_WithoutShortPath(m), x, None))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_short_path_keeps_no_batch_first_input_alive(device):
    """lstm_padded copies a batch-first input time-major before its node (as lstm_layer's path does)
    and saves that copy: the caller's tensor is not kept alive until backward (a sin of it is, the
    control), and the gradients still reach it."""
    import gc
    import weakref

    torch.manual_seed(23)
    m = LSTM(4, 6, batch_first=True, device=device)
    src = torch.randn(3, 5, 4, device=device, requires_grad=True)
    x = src * 2
    alive = weakref.ref(x)
    out, _ = m(x)
    del x
    gc.collect()
    assert alive() is None
    control = src * 2
    alive = weakref.ref(control)
    kept = control.sin()  # SinBackward0 saves its input
    del control
    gc.collect()
    assert alive() is not None and kept is not None
    out.sum().backward()
    got = src.grad.clone()
    src.grad = None
    expected, _ = _layer_path_call(m, src * 2, None)
    expected.sum().backward()
    torch.testing.assert_close(got, src.grad, rtol=0, atol=0)


@pytest.mark.parametrize("batch_first", [False, True])
def test_short_path_double_backward_matches_layer_path(device, batch_first):
    """create_graph through lstm_padded: the gradients' own gradients (input, state, weights) are
    the lstm_layer path's (float64; the same first-order op and double-backward formula)."""
    torch.manual_seed(22)
    m = LSTM(3, 4, batch_first=batch_first, device=device, dtype=torch.float64)
    x = torch.randn(2, 3, 3, device=device, dtype=torch.float64, requires_grad=True)
    state = tuple(torch.randn(1, 2 if batch_first else 3, 4, device=device, dtype=torch.float64,
                              requires_grad=True) for _ in range(2))
    leaves = [x, *state, *m.parameters()]

    def second(call):
        out, (h_n, _) = call()
        grads = torch.autograd.grad(out.pow(2).sum() + h_n.sum(), [x, *state], create_graph=True)
        return torch.autograd.grad(sum(g.sin().sum() for g in grads), leaves, allow_unused=True)

    got = second(lambda: m(x, state))
    expected = second(lambda: _layer_path_call(m, x, state))
    for a, b in zip(got, expected):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_dense_grads_gives_zeros_for_missing_gradients(device):
    """The backward formulas' dense_grads: a missing gradient becomes zeros of its tensor's shape
    (on a GPU several share one allocation, each in memory of its own, contiguous), a given one
    a contiguous tensor of its values."""
    from seqkernels.ops._autograd import dense_grads

    y, h, c = (torch.randn(*s, device=device) for s in ((7, 5), (3, 5), (2, 3, 4)))
    expanded = torch.randn(1, 5, device=device).expand(7, 5)
    got = dense_grads((expanded, y), (None, h), (None, c), (None, y))
    assert [g.shape for g in got] == [y.shape, h.shape, c.shape, y.shape]
    assert all(g.is_contiguous() for g in got)
    torch.testing.assert_close(got[0], expanded, rtol=0, atol=0)
    for g in got[1:]:
        assert torch.count_nonzero(g) == 0
    spans = sorted((g.data_ptr(), g.data_ptr() + g.numel() * g.element_size()) for g in got[1:])
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # no overlap
    got[1].fill_(1)  # each its own memory
    assert torch.count_nonzero(got[2]) == 0 and torch.count_nonzero(got[3]) == 0


def test_short_paths_under_inference_mode(device):
    """torch.inference_mode (grad mode off, inference tensors): the module takes lstm_infer and the
    cell lstm_cell there too, with no_grad's results bitwise."""
    torch.manual_seed(20)
    lstm, cell = LSTM(4, 6, device=device), LSTMCell(4, 6, device=device)
    x = torch.randn(5, 3, 4, device=device)
    state = (torch.randn(1, 3, 6, device=device), torch.randn(1, 3, 6, device=device))
    with torch.no_grad():
        expected = lstm(x, state), cell(x[0], (state[0][0], state[1][0]))
    with torch.inference_mode():
        got, names = _op_names(lambda: lstm(x, state))
        cell_got, cell_names = _op_names(lambda: cell(x[0], (state[0][0], state[1][0])))
    got = (got, cell_got)
    assert "seqkernels::lstm_infer" in names and "seqkernels::lstm_forward" not in names
    assert "seqkernels::lstm_cell" in cell_names and "seqkernels::lstm_infer" not in cell_names
    for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _infer_args(device, bias=True, state=True, batch_first=False, dtype=torch.float32, reverse=False):
    T, B, I, H = 4, 3, 5, 6
    x = torch.randn(B, T, I, device=device, dtype=dtype) if batch_first else torch.randn(T, B, I, device=device,
                                                                                          dtype=dtype)
    h0 = torch.randn(1, B, H, device=device, dtype=dtype) if state else None
    c0 = torch.randn(1, B, H, device=device, dtype=dtype) if state else None
    w_ih = torch.randn(4 * H, I, device=device, dtype=dtype)
    w_hh = torch.randn(4 * H, H, device=device, dtype=dtype)
    b_ih = torch.randn(4 * H, device=device, dtype=dtype) if bias else None
    b_hh = torch.randn(4 * H, device=device, dtype=dtype) if bias else None
    return x, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first, reverse


# (bias, state, batch_first, reverse)
OP_CASES = [(True, True, False, False), (False, True, True, False), (True, False, True, False),
            (False, False, False, False), (True, True, True, True), (False, False, False, True)]


@pytest.mark.parametrize("bias, state, batch_first, reverse", OP_CASES)
def test_opcheck_lstm_infer(device, bias, state, batch_first, reverse):
    torch.manual_seed(18)
    torch.library.opcheck(torch.ops.seqkernels.lstm_infer.default,
                          _infer_args(device, bias, state, batch_first, reverse=reverse))


BAD_INFER = {
    "input-2d": (lambda a: a.__setitem__(0, a[0][0]), RuntimeError, "3-D"),
    "empty-batch": (lambda a: a.__setitem__(0, a[0][:, :0]), RuntimeError, "empty"),
    "h0-without-c0": (lambda a: a.__setitem__(2, None), RuntimeError, "both h0 and c0"),
    "h0-2d": (lambda a: a.__setitem__(1, a[1][0]), RuntimeError, "h0 and c0 must have shape"),
    "c0-wrong-batch": (lambda a: a.__setitem__(2, a[2][:, :2]), RuntimeError, "h0 and c0 must have shape"),
    "w_hh-1d": (lambda a: a.__setitem__(4, a[4].reshape(-1)), RuntimeError, "w_hh must be 2-D"),
    "w_ih-wrong-input": (lambda a: a.__setitem__(3, a[3][:, :4].contiguous()), RuntimeError, "w_ih must have shape"),
    "h0-float64": (lambda a: a.__setitem__(1, a[1].double()), TypeError, "dtype"),
    "only-b_ih": (lambda a: a.__setitem__(6, None), RuntimeError, None),
    "input-requires-grad": (lambda a: a.__setitem__(0, a[0].requires_grad_()), RuntimeError, "computes no gradients"),
    "w_hh-requires-grad": (lambda a: a.__setitem__(4, a[4].requires_grad_()), RuntimeError, "computes no gradients"),
}


@pytest.mark.parametrize("case", sorted(BAD_INFER))
def test_lstm_infer_rejects_bad_arguments(device, case):
    """Direct calls of lstm_infer with bad arguments raise (its own checks, then lstm_forward's),
    and with a tensor that requires grad under grad mode (it has no autograd formula)."""
    mutate, expected, match = BAD_INFER[case]
    args = list(_infer_args(device))
    torch.ops.seqkernels.lstm_infer(*args)  # the unmutated call is valid
    mutate(args)
    with pytest.raises(expected, match=match):
        torch.ops.seqkernels.lstm_infer(*args)


def _padded_args(device, bias, state, batch_first, dtype=torch.float64, reverse=False):
    """_infer_args with the input, the state and the weights requiring grad."""
    args = list(_infer_args(device, bias, state, batch_first, dtype, reverse))
    for i in (0, 1, 2, 3, 4, 5, 6):
        if args[i] is not None:
            args[i].requires_grad_()
    return tuple(args)


@pytest.mark.parametrize("bias, state, batch_first, reverse", OP_CASES)
def test_opcheck_lstm_padded(device, bias, state, batch_first, reverse):
    """lstm_padded, the module's recorded call as one operator with a C++ autograd node: its schema,
    fake function, autograd registration and AOT dispatch (gradients included)."""
    torch.manual_seed(24)
    torch.library.opcheck(torch.ops.seqkernels.lstm_padded.default,
                          _padded_args(device, bias, state, batch_first, reverse=reverse))


def _gradcheck_both_orders(op, args: tuple) -> None:
    """gradcheck and gradgradcheck of op(*args) with respect to every tensor argument (the others,
    None or flags, held fixed)."""
    tensors = [i for i, a in enumerate(args) if isinstance(a, Tensor)]

    def call(*values):
        full = list(args)
        for i, v in zip(tensors, values):
            full[i] = v
        return op(*full)

    inputs = tuple(args[i] for i in tensors)
    assert torch.autograd.gradcheck(call, inputs)
    assert torch.autograd.gradgradcheck(call, inputs)


@pytest.mark.parametrize("bias, state, batch_first, reverse", [(True, True, True, False), (False, False, False, False),
                                                               (True, True, False, True)])
def test_lstm_padded_gradcheck(device, bias, state, batch_first, reverse):
    """The C++ node's gradients (every input) by finite differences, and the gradients' own
    gradients (its backward under create_graph: lstm_backward_recorded's double-backward formula),
    forward and reversed."""
    torch.manual_seed(25)
    _gradcheck_both_orders(torch.ops.seqkernels.lstm_padded,
                           _padded_args(device, bias, state, batch_first, reverse=reverse))


@pytest.mark.parametrize("case", sorted(k for k in BAD_INFER if "requires-grad" not in k))
def test_lstm_padded_rejects_bad_arguments(device, case):
    """Direct calls of lstm_padded with bad arguments raise, recording or not (its own checks,
    then lstm_forward's)."""
    mutate, expected, match = BAD_INFER[case]
    for recording in (False, True):
        args = list(_padded_args(device, True, True, False, torch.float32) if recording else _infer_args(device))
        torch.ops.seqkernels.lstm_padded(*args)  # the unmutated call is valid
        mutate(args)
        with pytest.raises(expected, match=match):
            torch.ops.seqkernels.lstm_padded(*args)


def test_lstm_padded_node_backward_twice_with_retain_graph(device):
    """The C++ node keeps what it saved under retain_graph (a second backward gives the same
    gradients, nn.LSTM's), and a backward after the graph was freed raises autograd's error."""
    torch.manual_seed(27)
    m = LSTM(4, 6, device=device, dtype=torch.float64)
    ref = nn.LSTM(4, 6, device=device, dtype=torch.float64)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(5, 3, 4, device=device, dtype=torch.float64)
    out, (_, c_n) = m(x)
    loss = out.sin().sum() + c_n.sum()
    first = torch.autograd.grad(loss, list(m.parameters()), retain_graph=True)
    second = torch.autograd.grad(loss, list(m.parameters()))
    ref_out, (_, ref_c_n) = ref(x)
    expected = torch.autograd.grad(ref_out.sin().sum() + ref_c_n.sum(), list(ref.parameters()))
    for a, b, want in zip(first, second, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert_close(a, want, torch.float64, "grad")
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(loss, list(m.parameters()))


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_lstm_padded_without_autograd_is_lstm_infer(device, batch_first, reverse):
    """Where nothing records (grad mode off, or below autograd with tensors that require grad),
    lstm_padded returns lstm_infer's outputs bitwise, and its output is no view of its input."""
    torch.manual_seed(26)
    args = _padded_args(device, True, True, batch_first, torch.float32, reverse)
    with torch.no_grad():
        expected = torch.ops.seqkernels.lstm_infer(*args)
        got = torch.ops.seqkernels.lstm_padded(*args)
    with torch._C._AutoDispatchBelowAutograd():
        below = torch.ops.seqkernels.lstm_padded(*args)
    for a, b, c in zip(got, below, expected):
        torch.testing.assert_close(a, c, rtol=0, atol=0)
        torch.testing.assert_close(b, c, rtol=0, atol=0)
        assert a.grad_fn is None


def _cell_args(device, bias=True, state=True, dtype=torch.float64, requires_grad=True):
    B, I, H = 3, 5, 6
    args = [torch.randn(B, I, device=device, dtype=dtype),
            torch.randn(B, H, device=device, dtype=dtype) if state else None,
            torch.randn(B, H, device=device, dtype=dtype) if state else None,
            torch.randn(4 * H, I, device=device, dtype=dtype), torch.randn(4 * H, H, device=device, dtype=dtype),
            torch.randn(4 * H, device=device, dtype=dtype) if bias else None,
            torch.randn(4 * H, device=device, dtype=dtype) if bias else None]
    return tuple(a.requires_grad_() if a is not None and requires_grad else a for a in args)


@pytest.mark.parametrize("bias, state", [(True, True), (False, False), (True, False)])
def test_opcheck_lstm_cell(device, bias, state):
    """lstm_cell, LSTMCell's recorded step as one operator with a C++ autograd node: its schema,
    fake function, autograd registration and AOT dispatch (gradients included)."""
    torch.manual_seed(28)
    torch.library.opcheck(torch.ops.seqkernels.lstm_cell.default, _cell_args(device, bias, state))


@pytest.mark.parametrize("bias, state", [(True, True), (False, False)])
def test_lstm_cell_op_gradcheck(device, bias, state):
    """The cell node's gradients (every input) by finite differences, and their own gradients
    (create_graph: lstm_backward_recorded's double-backward formula)."""
    torch.manual_seed(29)
    _gradcheck_both_orders(torch.ops.seqkernels.lstm_cell, _cell_args(device, bias, state))


BAD_CELL = {
    "input-3d": (lambda a: a.__setitem__(0, a[0].unsqueeze(0)), RuntimeError, "2-D"),
    "h0-without-c0": (lambda a: a.__setitem__(2, None), RuntimeError, "both h0 and c0"),
    "h0-wrong-batch": (lambda a: a.__setitem__(1, a[1][:2]), RuntimeError, None),
    "w_ih-wrong-input": (lambda a: a.__setitem__(3, a[3][:, :4]), RuntimeError, "w_ih must have shape"),
    "h0-float32": (lambda a: a.__setitem__(1, a[1].float()), TypeError, "dtype"),
    "only-b_ih": (lambda a: a.__setitem__(6, None), RuntimeError, None),
}


@pytest.mark.parametrize("case", sorted(BAD_CELL))
def test_lstm_cell_op_rejects_bad_arguments(device, case):
    """Direct calls of lstm_cell with bad arguments raise, recording or not (its own checks, then
    lstm_forward's)."""
    mutate, expected, match = BAD_CELL[case]
    for recording in (False, True):
        args = list(_cell_args(device, requires_grad=recording))
        torch.ops.seqkernels.lstm_cell(*args)  # the unmutated call is valid
        mutate(args)
        with pytest.raises(expected, match=match):
            torch.ops.seqkernels.lstm_cell(*args)


def test_lstm_cell_op_without_autograd_and_in_place(device):
    """Where nothing records, lstm_cell returns the recorded call's h and c bitwise (below autograd
    too); its recorded outputs may be modified in place, the node saving neither (as lstm_layer's
    step did not): the gradients then follow the modified values; backward raises after an in-place
    change of the input or the state it read."""
    torch.manual_seed(30)
    args = _cell_args(device)
    recorded = torch.ops.seqkernels.lstm_cell(*args)
    with torch.no_grad():
        plain = torch.ops.seqkernels.lstm_cell(*args)
    with torch._C._AutoDispatchBelowAutograd():
        below = torch.ops.seqkernels.lstm_cell(*args)
    for r, p, b in zip(recorded, plain, below):
        torch.testing.assert_close(p, r.detach(), rtol=0, atol=0)
        torch.testing.assert_close(b, r.detach(), rtol=0, atol=0)
        assert p.grad_fn is None and not r._is_view()
    leaves = [a for a in args if a is not None]

    def gradients(loss):
        for t in leaves:
            t.grad = None
        loss.backward()
        return [t.grad for t in leaves]

    h, c = recorded
    h.mul_(2)
    c.add_(1)
    modified = gradients(h.sin().sum() + c.cos().sum())
    h, c = torch.ops.seqkernels.lstm_cell(*args)
    for a, b in zip(modified, gradients((h * 2).sin().sum() + (c + 1).cos().sum())):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for i in (0, 1):  # the input, the state
        h, c = torch.ops.seqkernels.lstm_cell(*args)
        with torch.no_grad():
            args[i].add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            (h.sum() + c.sum()).backward()


def test_functional_call_weights_reach_the_short_path(device):
    """torch.func.functional_call swaps the weights for one call: the one-layer call (the short
    path) must compute with the swapped weights, as nn.LSTM does with them loaded."""
    torch.manual_seed(16)
    x = torch.randn(6, 3, 4, device=device, dtype=torch.float64)
    ours = LSTM(4, 5, device=device, dtype=torch.float64)
    swapped = {name: torch.randn_like(p) for name, p in ours.named_parameters()}
    ref = nn.LSTM(4, 5, device=device, dtype=torch.float64)
    ref.load_state_dict(swapped)
    with torch.no_grad():
        y, (h, c) = torch.func.functional_call(ours, swapped, (x,))
        y_ref, (h_ref, c_ref) = ref(x)
    for got, want in ((y, y_ref), (h, h_ref), (c, c_ref)):
        assert_close(got, want, torch.float64, "functional_call")


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("model_kind", ["tagger", "one_layer"])
def test_torch_compile_fullgraph(device, backend, with_state, model_kind):
    torch.manual_seed(14)
    torch._dynamo.reset()
    model = (_Tagger() if model_kind == "tagger" else _OneLayer()).to(device)
    x = torch.randn(3, 7, 5, device=device)
    layers, hout = (4, 4) if model_kind == "tagger" else (1, 8)
    hx = (torch.randn(layers, 3, hout, device=device), torch.randn(layers, 3, 8, device=device)) if with_state else None

    def run(fn):
        xi = x.clone().requires_grad_()
        hxi = tuple(t.clone().requires_grad_() for t in hx) if hx is not None else None
        model.zero_grad()
        out, h, c = fn(xi, hxi)
        (out.square().sum() + h.sum() + (c * 0.5).sum()).backward()
        grads = [xi.grad] + ([t.grad for t in hxi] if hxi else []) + [p.grad.clone() for p in model.parameters()]
        return [out.detach(), h.detach(), c.detach()] + grads

    eager = run(model)
    compiled = run(torch.compile(model, backend=backend, fullgraph=True))
    for i, (a, e) in enumerate(zip(compiled, eager)):
        assert_close(a, e, torch.float32, f"compiled result {i}")


@pytest.mark.parametrize("model_kind", ["tagger", "one-layer"])
def test_torch_export_and_jit_trace(device, model_kind):
    """torch.export (static shapes, and batch and time as dynamic dimensions, run at other
    sizes) and torch.jit.trace of a model holding seqkernels.LSTM, against the eager model."""
    torch.manual_seed(16)
    model = (_Tagger() if model_kind == "tagger" else _OneLayer()).to(device).eval()
    x = torch.randn(3, 7, 5, device=device)
    with torch.no_grad():
        eager = model(x)
        exported = torch.export.export(model, (x,))
        for i, (a, e) in enumerate(zip(exported.module()(x), eager)):
            assert_close(a, e, torch.float32, f"exported result {i}")
        dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("steps", max=512)}
        dynamic = torch.export.export(model, (x,), dynamic_shapes=(dims,))
        for shape in ((2, 4, 5), (5, 11, 5)):
            other = torch.randn(*shape, device=device)
            for i, (a, e) in enumerate(zip(dynamic.module()(other), model(other))):
                assert_close(a, e, torch.float32, f"dynamic export {shape} result {i}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's warnings, and torch 2.13's deprecation of jit.trace
            traced = torch.jit.trace(model, (x,))
        for i, (a, e) in enumerate(zip(traced(x), eager)):
            assert_close(a, e, torch.float32, f"traced result {i}")


# --------------------------------------------------------------------------------------
# LSTMCell
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_lstm_cell_matches_nn_lstm_cell(device, dtype, batched, bias, with_state):
    torch.manual_seed(15)
    reference = nn.LSTMCell(5, 7, bias=bias).to(device=device, dtype=dtype)
    ours = LSTMCell(5, 7, bias=bias, device=device, dtype=dtype)
    ours.load_state_dict(reference.state_dict())
    lead = (3,) if batched else ()
    inputs = {"x": torch.randn(*lead, 5, device=device).to(dtype)}
    if with_state:
        inputs["h"] = torch.randn(*lead, 7, device=device).to(dtype)
        inputs["c"] = torch.randn(*lead, 7, device=device).to(dtype)

    def module_fn(module):
        def fn(inp, _params):
            hx = (inp["h"], inp["c"]) if "h" in inp else None
            h, c = module(inp["x"], hx)
            return {"h": h, "c": c}

        return fn

    def ref_fn(inp, params):
        x = inp["x"] if batched else inp["x"].unsqueeze(0)
        if "h" in inp:
            h, c = (inp["h"], inp["c"]) if batched else (inp["h"].unsqueeze(0), inp["c"].unsqueeze(0))
        else:
            h = c = x.new_zeros(x.shape[0], 7)
        weights = (params["weight_ih"], params["weight_hh"], params.get("bias_ih"), params.get("bias_hh"))
        h, c = lstm_cell_reference(x, h, c, *weights)
        return {"h": h, "c": c} if batched else {"h": h.squeeze(0), "c": c.squeeze(0)}

    got, upstream = forward_backward(module_fn(ours), inputs, module_params(ours))
    from_nn, _ = forward_backward(module_fn(reference), inputs, module_params(reference), upstream)
    inputs64 = {k: v.double() for k, v in inputs.items()}
    ref64, _ = forward_backward(ref_fn, inputs64, leaf_params(reference, torch.float64), upstream)
    assert got["h"].shape == ((3, 7) if batched else (7,))
    if dtype in LOW_PRECISION:
        ref_lp, _ = forward_backward(ref_fn, inputs, leaf_params(reference, dtype), upstream)
        compare_low_precision(got, ref64, [ref_lp, from_nn], dtype, "LSTMCell vs float64 reference")
    else:
        compare_results(got, from_nn, dtype, "LSTMCell vs nn.LSTMCell")
        compare_results(got, ref64, dtype, "LSTMCell vs float64 reference")


def test_lstm_cell_empty_batch():
    reference = nn.LSTMCell(3, 4)
    ours = LSTMCell(3, 4)
    h, c = ours(torch.randn(0, 3))
    h_ref, c_ref = reference(torch.randn(0, 3))
    assert h.shape == h_ref.shape and c.shape == c_ref.shape


# --------------------------------------------------------------------------------------
# Validation errors: the same exception types (and messages) as nn.LSTM / nn.LSTMCell
# --------------------------------------------------------------------------------------
def _assert_same_error(call_reference: Callable, call_ours: Callable, match_message: bool) -> None:
    with pytest.raises(Exception) as expected:
        call_reference()
    with pytest.raises(Exception) as got:
        call_ours()
    assert type(got.value) is type(expected.value), f"{type(got.value).__name__}: {got.value} vs {expected.value!r}"
    if match_message:
        assert str(got.value) == str(expected.value)


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


# (module kwargs, call(module) -> None, compare messages?)
LSTM_FORWARD_ERRORS = {
    "input-1d": ({}, lambda m: m(_rand(5)), True),
    "input-4d": ({}, lambda m: m(_rand(5, 2, 3, 1)), True),
    "input-features": ({}, lambda m: m(_rand(5, 2, 4)), True),
    "input-features-unbatched": ({}, lambda m: m(_rand(5, 4)), True),
    "input-dtype": ({}, lambda m: m(_rand(5, 2, 3, dtype=torch.float64)), True),
    "input-empty-sequence": ({}, lambda m: m(_rand(0, 2, 3)), True),
    "h0-batch": ({}, lambda m: m(_rand(5, 2, 3), (_rand(2, 3, 4), _rand(2, 2, 4))), True),
    "c0-hidden": ({}, lambda m: m(_rand(5, 2, 3), (_rand(2, 2, 4), _rand(2, 2, 5))), True),
    "h0-layers": ({}, lambda m: m(_rand(5, 2, 3), (_rand(1, 2, 4), _rand(2, 2, 4))), True),
    "h0-batch-first": ({"batch_first": True}, lambda m: m(_rand(5, 2, 3), (_rand(2, 2, 4), _rand(2, 2, 4))), True),
    "h0-proj": ({"proj_size": 2}, lambda m: m(_rand(5, 2, 3), (_rand(2, 2, 4), _rand(2, 2, 4))), True),
    "c0-proj": ({"proj_size": 2}, lambda m: m(_rand(5, 2, 3), (_rand(2, 2, 2), _rand(2, 2, 2))), True),
    "h0-bidirectional": ({"bidirectional": True}, lambda m: m(_rand(5, 2, 3), (_rand(2, 2, 4), _rand(4, 2, 4))), True),
    "hx-2d-for-batched": ({}, lambda m: m(_rand(5, 2, 3), (_rand(2, 4), _rand(2, 2, 4))), True),
    "hx-3d-for-unbatched": ({}, lambda m: m(_rand(5, 3), (_rand(2, 1, 4), _rand(2, 1, 4))), True),
    "hx-unbatched-size": ({}, lambda m: m(_rand(5, 3), (_rand(2, 5), _rand(2, 4))), True),
    "hx-one-tensor": ({}, lambda m: m(_rand(5, 2, 3), (_rand(2, 2, 4),)), True),
    "hx-three-tensors": ({}, lambda m: m(_rand(5, 2, 3), (_rand(2, 2, 4),) * 3), True),
    "hx-plain-3d-tensor": ({}, lambda m: m(_rand(5, 2, 3), _rand(2, 2, 4)), True),
    "hx-stacked-4d-tensor": ({}, lambda m: m(_rand(5, 2, 3), _rand(2, 2, 2, 4)), False),
    "hx-dtype": ({}, lambda m: m(_rand(5, 2, 3), (_rand(2, 2, 4, dtype=torch.float64), _rand(2, 2, 4))), False),
    "cx-dtype": ({}, lambda m: m(_rand(5, 2, 3), (_rand(2, 2, 4), _rand(2, 2, 4, dtype=torch.float64))), False),
    # A meta tensor beside CPU ones: the op's Meta kernel (its fake function) must check devices.
    "input-meta-device": ({}, lambda m: m(_rand(5, 2, 3).to("meta")), False),
    "h0-meta-device": ({}, lambda m: m(_rand(5, 2, 3), (_rand(2, 2, 4).to("meta"), _rand(2, 2, 4))), False),
    "packed-features": ({}, lambda m: m(pack_sequence([_rand(3, 5), _rand(2, 5)])), False),
    "packed-dtype": ({}, lambda m: m(pack_sequence([_rand(3, 3), _rand(2, 3)]).double()), False),
    "packed-h0-batch": (
        {},
        lambda m: m(pack_sequence([_rand(3, 3), _rand(2, 3)]), (_rand(2, 3, 4), _rand(2, 2, 4))),
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(LSTM_FORWARD_ERRORS))
def test_lstm_forward_errors_match_nn_lstm(case):
    kwargs, call, match_message = LSTM_FORWARD_ERRORS[case]
    torch.manual_seed(16)
    reference = nn.LSTM(3, 4, num_layers=2, **kwargs)
    ours = LSTM(3, 4, num_layers=2, **kwargs)
    _assert_same_error(lambda: call(reference), lambda: call(ours), match_message)


LSTM_CONSTRUCTOR_ERRORS = {
    "dropout-above-1": ((3, 4), {"dropout": 1.5}),
    "dropout-negative": ((3, 4), {"dropout": -0.1}),
    "dropout-bool": ((3, 4), {"dropout": True}),
    "dropout-string": ((3, 4), {"dropout": "0.1"}),
    "proj-equal-hidden": ((3, 4), {"proj_size": 4}),
    "proj-above-hidden": ((3, 4), {"proj_size": 5}),
    "proj-negative": ((3, 4), {"proj_size": -1}),
    "num-layers-zero": ((3, 4), {"num_layers": 0}),
    "hidden-zero": ((3, 0), {}),
    "hidden-negative": ((3, -2), {}),
    "hidden-float": ((3, 4.0), {}),
    "input-zero": ((0, 4), {}),
    "input-float": ((3.0, 4), {}),
    "bias-int": ((3, 4), {"bias": 1}),
    "batch-first-int": ((3, 4), {"batch_first": 1}),
    "unknown-kwarg": ((3, 4), {"hidden": 4}),
    "too-many-positional": ((3, 4, 1, True, False, 0.0, False, 0, None, None, 1), {}),
}


@pytest.mark.parametrize("case", sorted(LSTM_CONSTRUCTOR_ERRORS))
def test_lstm_constructor_errors_match_nn_lstm(case):
    args, kwargs = LSTM_CONSTRUCTOR_ERRORS[case]
    # Messages of Python's own argument errors name the function (LSTM.__init__ vs
    # RNNBase.__init__); compare their type only.
    match = case not in ("unknown-kwarg", "too-many-positional")
    _assert_same_error(lambda: nn.LSTM(*args, **kwargs), lambda: LSTM(*args, **kwargs), match)


def test_lstm_constructor_warns_like_nn_lstm():
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        LSTM(3, 4, dropout=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LSTM(3, 4, num_layers=2, dropout=0.5)


LSTM_CELL_ERRORS = {
    "input-3d": lambda m: m(_rand(2, 3, 1)),
    "input-0d": lambda m: m(_rand()),
    "input-features": lambda m: m(_rand(2, 4)),
    "input-features-unbatched": lambda m: m(_rand(4)),
    "h-batch": lambda m: m(_rand(2, 3), (_rand(3, 4), _rand(2, 4))),
    "c-batch": lambda m: m(_rand(2, 3), (_rand(2, 4), _rand(3, 4))),
    "h-hidden": lambda m: m(_rand(2, 3), (_rand(2, 5), _rand(2, 4))),
    "c-hidden": lambda m: m(_rand(2, 3), (_rand(2, 4), _rand(2, 5))),
    "h-3d": lambda m: m(_rand(2, 3), (_rand(2, 2, 4), _rand(2, 4))),
    "c-0d": lambda m: m(_rand(3), (_rand(4), _rand())),
    "h-1d-for-batched": lambda m: m(_rand(2, 3), (_rand(4), _rand(2, 4))),
    "c-1d-for-batched": lambda m: m(_rand(2, 3), (_rand(2, 4), _rand(4))),
    "hx-2d-for-unbatched": lambda m: m(_rand(3), (_rand(2, 4), _rand(2, 4))),
    "hx-one-tensor": lambda m: m(_rand(2, 3), (_rand(2, 4),)),
    "hx-one-tensor-unbatched": lambda m: m(_rand(3), (_rand(4),)),
    "hx-three-tensors": lambda m: m(_rand(2, 3), (_rand(2, 4),) * 3),
    "hx-plain-tensor": lambda m: m(_rand(2, 3), _rand(2, 4)),
    "input-dtype": lambda m: m(_rand(2, 3, dtype=torch.float64)),
    "h-dtype": lambda m: m(_rand(2, 3), (_rand(2, 4, dtype=torch.float64), _rand(2, 4))),
}
# nn.LSTMCell's dtype errors come from deep inside ATen (a matmul's message).
_CELL_TYPE_ONLY = {"input-dtype", "h-dtype"}


@pytest.mark.parametrize("case", sorted(LSTM_CELL_ERRORS))
def test_lstm_cell_errors_match_nn_lstm_cell(case):
    call = LSTM_CELL_ERRORS[case]
    _assert_same_error(lambda: call(nn.LSTMCell(3, 4)), lambda: call(LSTMCell(3, 4)), case not in _CELL_TYPE_ONLY)


def test_lstm_cell_rejects_mixed_dtype_cell_state():
    """A deliberate difference: nn.LSTMCell type-promotes a float64 c with float32 weights
    (returning a float64 c); the fused op needs one dtype and says so."""
    h, c = nn.LSTMCell(3, 4)(_rand(2, 3), (_rand(2, 4), _rand(2, 4, dtype=torch.float64)))
    assert c.dtype == torch.float64
    with pytest.raises(RuntimeError, match="dtype"):
        LSTMCell(3, 4)(_rand(2, 3), (_rand(2, 4), _rand(2, 4, dtype=torch.float64)))


def test_package_exports():
    assert seqkernels.LSTM is LSTM and seqkernels.LSTMCell is LSTMCell and seqkernels.lstm_layer is lstm_layer


# --------------------------------------------------------------------------------------
# Autocast
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("packed", [False, True])
def test_autocast_runs_in_the_autocast_dtype(device, packed):
    """Under autocast (bf16 on the CPU, fp16 on CUDA) the modules run in the autocast dtype:
    compared with the float64 reference, the error is that of the reference run in that
    dtype; gradients reach the float32 parameters."""
    torch.manual_seed(17)
    low = torch.bfloat16 if device == "cpu" else torch.float16
    config = dict(
        input_size=5, hidden_size=8, num_layers=2, bias=True, batch_first=False, bidirectional=True, proj_size=0
    )
    ref_module, ours = make_lstms(config, torch.float32, device)
    x = torch.randn(6, 3, 5, device=device)
    lengths = torch.tensor([6, 4, 2])
    with torch.autocast(device, dtype=low):
        if packed:
            out, (h, c) = ours(pack_padded_sequence(x, lengths))
            out = out.data
        else:
            out, (h, c) = ours(x)
        cell_h, cell_c = replace_lstm(nn.LSTMCell(5, 8).to(device))(x[0])
    assert out.dtype == low and h.dtype == low and c.dtype == low and cell_h.dtype == low
    (out.float().sum() + h.float().sum()).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in ours.parameters())

    def reference(dtype):
        params = [p.detach().to(dtype) for p in ref_module._flat_weights]
        xs = x.to(dtype)
        if packed:
            pk = pack_padded_sequence(xs, lengths)
            o, (hh, cc) = lstm_reference(
                pk.data, None, params, num_layers=2, bidirectional=True, batch_sizes=pk.batch_sizes
            )
        else:
            o, (hh, cc) = lstm_reference(xs, None, params, num_layers=2, bidirectional=True)
        return {"output": o, "h_n": hh, "c_n": cc}

    compare_low_precision(
        {"output": out, "h_n": h, "c_n": c}, reference(torch.float64), [reference(low)], low, "autocast"
    )


# --------------------------------------------------------------------------------------
# Gradients of gradients (create_graph=True): the first order from the kernels, its own
# derivatives through the reference (register_double_backward in seqkernels/ops/_autograd.py)
# --------------------------------------------------------------------------------------
DOUBLE_BACKWARD_CASES = {
    "plain": dict(),
    "proj": dict(proj_size=2),
    "bidirectional-2-layers": dict(bidirectional=True, num_layers=2),
    "no-bias": dict(bias=False),
    "batch-first": dict(batch_first=True),
}


@pytest.mark.parametrize("case", DOUBLE_BACKWARD_CASES)
def test_double_backward_matches_reference(device, case):
    """Second-order gradients (create_graph=True, then a gradient of the gradients) with respect
    to the input, the initial state and every parameter, against the float64 reference; on the
    CPU also against nn.LSTM's own double backward (cuDNN has none)."""
    flags = DOUBLE_BACKWARD_CASES[case]
    torch.manual_seed(0)
    module = LSTM(3, 4, dtype=torch.float64, device=device, **flags)
    D = 2 if module.bidirectional else 1
    Hout = module.proj_size or module.hidden_size
    T, B = 5, 2
    x = torch.randn((B, T, 3) if module.batch_first else (T, B, 3), dtype=torch.float64, device=device)
    h0 = torch.randn(module.num_layers * D, B, Hout, dtype=torch.float64, device=device)
    c0 = torch.randn(module.num_layers * D, B, 4, dtype=torch.float64, device=device)
    names = ["x", "h0", "c0", *module._flat_weights_names]
    leaves = [t.requires_grad_(True) for t in (x, h0, c0)] + [getattr(module, n) for n in module._flat_weights_names]

    def loss_of(forward):
        def loss(x, h0, c0, *params):
            out, (h, c) = forward(x, h0, c0, params)
            return out.tanh().sum() + h.square().sum() + (c * c0).sum()

        return loss

    def ours(x, h0, c0, params):
        return torch.func.functional_call(module, dict(zip(module._flat_weights_names, params)), (x, (h0, c0)))

    def reference(x, h0, c0, params):
        return lstm_reference(x, (h0, c0), params, num_layers=module.num_layers, bidirectional=module.bidirectional,
                              batch_first=module.batch_first, has_biases=module.bias, proj_size=module.proj_size)

    got = gradients_of_gradients(loss_of(ours), leaves)
    assert_orders_close(got, gradients_of_gradients(loss_of(reference), leaves), names, assert_close)
    if device == "cpu":
        peer = nn.LSTM(3, 4, dtype=torch.float64, **flags)
        peer.load_state_dict(module.state_dict())

        def nn_lstm(x, h0, c0, params):
            return torch.func.functional_call(peer, dict(zip(peer._flat_weights_names, params)), (x, (h0, c0)))

        peer_leaves = leaves[:3] + [getattr(peer, n) for n in peer._flat_weights_names]
        assert_orders_close(got, gradients_of_gradients(loss_of(nn_lstm), peer_leaves), names, assert_close)


def test_double_backward_packed_and_cell(device):
    """Second-order gradients through a PackedSequence of unsorted lengths (reverse direction
    included) and through LSTMCell, against the float64 reference."""
    torch.manual_seed(1)
    module = LSTM(3, 4, bidirectional=True, dtype=torch.float64, device=device)
    seqs = [torch.randn(n, 3, dtype=torch.float64, device=device, requires_grad=True) for n in (3, 5, 2)]
    params = [getattr(module, n) for n in module._flat_weights_names]

    def packed_loss(forward):
        def loss(*leaves):
            out, (h, c) = forward(pack_sequence(list(leaves[:3]), enforce_sorted=False), leaves[3:])
            return out.data.sin().sum() + h.square().sum() + c.sum()

        return loss

    def ours(packed, ps):
        return torch.func.functional_call(module, dict(zip(module._flat_weights_names, ps)), (packed,))

    def reference(packed, ps):
        out, (h, c) = lstm_reference(packed.data, None, ps, bidirectional=True, batch_sizes=packed.batch_sizes)
        order = packed.unsorted_indices
        return PackedSequence(out, packed.batch_sizes), (h[:, order], c[:, order])

    names = ["x0", "x1", "x2", *module._flat_weights_names]
    leaves = seqs + params
    assert_orders_close(gradients_of_gradients(packed_loss(ours), leaves),
                        gradients_of_gradients(packed_loss(reference), leaves), names, assert_close)

    cell = LSTMCell(3, 4, dtype=torch.float64, device=device)
    x = torch.randn(2, 3, dtype=torch.float64, device=device, requires_grad=True)
    h = torch.randn(2, 4, dtype=torch.float64, device=device, requires_grad=True)
    c = torch.randn(2, 4, dtype=torch.float64, device=device, requires_grad=True)
    cell_params = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]

    def cell_loss(step):
        def loss(x, h, c, *ps):
            h1, c1 = step(x, h, c, ps)
            return h1.tanh().sum() + (c1 * c).sum()

        return loss

    def cell_ours(x, h, c, ps):
        return torch.func.functional_call(cell, dict(zip(["weight_ih", "weight_hh", "bias_ih", "bias_hh"], ps)),
                                          (x, (h, c)))

    def cell_reference(x, h, c, ps):
        return lstm_cell_reference(x, h, c, *ps)

    cell_leaves = [x, h, c, *cell_params]
    assert_orders_close(gradients_of_gradients(cell_loss(cell_ours), cell_leaves),
                        gradients_of_gradients(cell_loss(cell_reference), cell_leaves),
                        ["x", "h", "c", "weight_ih", "weight_hh", "bias_ih", "bias_hh"], assert_close)


def test_third_order_and_gradgradcheck(device):
    """Third-order gradients (the formula's own derivatives, recorded where the outer call
    records) against the reference, and torch.autograd.gradgradcheck on the module (finite
    differences of the kernels' first-order gradients against the second-order formula)."""
    torch.manual_seed(2)
    module = LSTM(2, 3, proj_size=2, dtype=torch.float64, device=device)
    x = torch.randn(4, 2, 2, dtype=torch.float64, device=device, requires_grad=True)
    params = [getattr(module, n) for n in module._flat_weights_names]

    def loss_of(forward):
        return lambda x, *ps: forward(x, ps).sin().sum()

    def ours(x, ps):
        return torch.func.functional_call(module, dict(zip(module._flat_weights_names, ps)), (x,))[0]

    def reference(x, ps):
        return lstm_reference(x, None, ps, proj_size=2)[0]

    leaves = [x, *params]
    names = ["x", *module._flat_weights_names]
    assert_orders_close(gradients_of_gradients(loss_of(ours), leaves, order=3),
                        gradients_of_gradients(loss_of(reference), leaves, order=3), names, assert_close)
    assert torch.autograd.gradgradcheck(loss_of(ours), tuple(leaves))


@given(
    sizes=batch_sizes_lists(max_steps=6, max_batch=4),
    input_size=st.integers(1, 4),
    hidden=st.integers(1, 5),
    use_proj=st.booleans(),
    bias=st.booleans(),
    reverse=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_lstm_layer_double_backward_matches_reference(device, sizes, input_size, hidden, use_proj, bias, reverse,
                                                      seed):
    """The op's second-order gradients (packed variable batch sizes, both directions, proj,
    bias) with respect to x, h0, c0 and every weight, against the float64 reference."""
    torch.manual_seed(seed)
    proj = max(1, hidden // 2) if use_proj and hidden > 1 else 0
    inputs, params = layer_tensors(sizes, input_size, hidden, proj, bias, torch.float64, device)
    batch_sizes = torch.tensor(sizes, dtype=torch.int64)
    note(f"batch_sizes={sizes} I={input_size} H={hidden} P={proj} bias={bias} reverse={reverse}")
    names = [*inputs, *params]
    leaves = [t.requires_grad_(True) for t in (*inputs.values(), *params.values())]

    def loss_of(layer):
        def loss(*values):
            v = dict(zip(names, values))
            weights = {k: v[k] for k in params}
            y, h, c = layer(v["x"], batch_sizes, v["h0"], v["c0"], reverse=reverse, **weights)
            return y.sin().sum() + (h * v["h0"]).sum() + c.square().sum()

        return loss

    assert_orders_close(gradients_of_gradients(loss_of(lstm_layer), leaves),
                        gradients_of_gradients(loss_of(lstm_layer_reference), leaves), names, assert_close)


def test_direct_backward_op_call_is_not_differentiable(device):
    """The backward op called directly (not through the forward's autograd formula) has no
    second-order formula: differentiating it raises, never returns zeros."""
    T, B, I, H = 3, 2, 2, 3
    x = torch.randn(T * B, I, device=device, dtype=torch.float64)
    w_ih = torch.randn(4 * H, I, device=device, dtype=torch.float64, requires_grad=True)
    w_hh = torch.randn(4 * H, H, device=device, dtype=torch.float64)
    h0 = torch.randn(B, H, device=device, dtype=torch.float64)
    c0 = torch.randn(B, H, device=device, dtype=torch.float64)
    batch_sizes = torch.full((T,), B, dtype=torch.int64)
    y, h_n, c_n, gates, cells = _forward_op(x, batch_sizes, h0, c0, w_ih.detach(), w_hh, None, None, None, False, True)
    grads = _backward_op(torch.ones_like(y), torch.zeros_like(h_n), torch.zeros_like(c_n), x, batch_sizes, h0, c0,
                         w_ih, w_hh, None, y, gates, cells, False, False)
    with pytest.raises(NotImplementedError, match="double backward"):
        grads[0].sum().backward()


def test_direct_op_call_with_bad_sizes_raises_on_every_device(device):
    """A size mismatch reaches the C++ checks, whose message formats numbers: it must raise
    (on one GPU build, formatting an integer into the message used to segfault)."""
    T, B, I, H = 3, 2, 4, 5
    x = torch.randn(T * B, I, device=device)
    batch_sizes = torch.full((T,), B, dtype=torch.int64)
    w_ih, w_hh = torch.randn(4 * H, I, device=device), torch.randn(4 * H, H, device=device)
    with pytest.raises(RuntimeError, match=r"h0 must have shape \[2, 5\], got \[1, 5\]"):
        torch.ops.seqkernels.lstm_forward(x, batch_sizes, torch.zeros(1, H, device=device),
                                          torch.zeros(B, H, device=device), w_ih, w_hh, None, None, None, False, False)
