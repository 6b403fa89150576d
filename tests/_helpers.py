"""Test helpers shared by several test modules (import as ``from _helpers import ...``:
pytest puts this directory on sys.path, as it does for conftest.py)."""
from __future__ import annotations

import copy

import torch

def cpu_has_amx() -> bool:
    """Whether this CPU lists every flag the CPU LSTM's AMX products need (False off x86 Linux)."""
    from seqkernels._config import CPU_AMX_FLAGS, _cpu_flags

    return set(CPU_AMX_FLAGS) <= _cpu_flags()


def check_cuda_graph_replays(model: torch.nn.Module, static_x: torch.Tensor) -> None:
    """Captures inference and a training step (forward + backward of the mean square of the
    output) of ``model`` on ``static_x`` in two CUDA graphs, after a warm-up on a side stream
    (lazy initialisation stays out of the capture); then, twice, copies fresh data into
    ``static_x``, replays both and checks outputs, final states and every parameter gradient
    against eager calls of an identical copy of the model. ``model(x)`` returns
    ``(y, (h, c))``."""
    twin = copy.deepcopy(model)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            with torch.no_grad():
                model(static_x)
            y, _ = model(static_x)
            y.float().square().mean().backward()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    g_inf = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_inf), torch.no_grad():
        inf_out, (inf_h, inf_c) = model(static_x)
    model.zero_grad(set_to_none=True)
    g_train = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_train):
        y, _ = model(static_x)
        y.float().square().mean().backward()
    tol = dict(rtol=2e-2, atol=2e-2) if static_x.dtype != torch.float32 else dict(rtol=1e-4, atol=1e-5)
    for trial in range(2):
        static_x.copy_(torch.randn_like(static_x))
        g_inf.replay()
        g_train.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            e_out, (e_h, e_c) = twin(static_x)
        torch.testing.assert_close(inf_out, e_out, **tol)
        torch.testing.assert_close(inf_h, e_h, **tol)
        torch.testing.assert_close(inf_c, e_c, **tol)
        twin.zero_grad(set_to_none=True)
        ey, _ = twin(static_x)
        ey.float().square().mean().backward()
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **tol, msg=lambda m: f"grad {name} trial {trial}: {m}")


def bytes_freed_by_release() -> int:
    """CUDA memory that seqkernels.release_step_graphs() gives back to PyTorch's allocator
    (every thread's kept step graphs and buffers), measured after the queued work is done."""
    import seqkernels

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    seqkernels.release_step_graphs()
    torch.cuda.synchronize()
    return before - torch.cuda.memory_allocated()


def lstm_training_results(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """One training call of an LSTM module on a fresh copy of ``x`` (loss: sum of the output
    plus the square of h_n): the output, h_n, c_n, the input's gradient and every parameter's
    gradient, for comparing calls bit for bit."""
    model.zero_grad(set_to_none=True)
    xx = x.clone().requires_grad_(True)
    y, (h, c) = model(xx)
    (y.float().sum() + h.float().square().sum()).backward()
    return [y, h, c, xx.grad] + [p.grad for p in model.parameters()]


def max_abs(t: torch.Tensor) -> float:
    """max |t| in float64 (0 for an empty tensor)."""
    return t.detach().double().abs().max().item() if t.numel() else 0.0


def assert_low_precision_close(actual: dict, ref64: dict, baseline: dict, dtype: torch.dtype, what: str, *,
                               sums: dict, small_tensor: int, ulps: float, sum_ulps: float) -> None:
    """flash-attention's rule for bf16/fp16 results: every entry's max error against the
    float64 reference is at most twice the error of the same computation run by the
    reference in ``dtype`` (``baseline``), plus eps = ``ulps`` units of ``dtype`` at the
    entry's magnitude (+1e-6). For tensors under ``small_tensor`` elements the baseline error
    is at least the baseline's largest error over all entries (a handful of elements is a
    small sample of the error); for reduced gradients (keys of ``sums``: the sum of their
    terms' magnitudes) eps is at least ``sum_ulps`` units of that sum."""
    assert baseline is not None and baseline.keys() == ref64.keys()
    unit = torch.finfo(dtype).eps
    pooled = max(max_abs(baseline[k].double() - ref64[k]) for k in ref64)
    for key, ref in ref64.items():
        got = actual[key]
        assert got.shape == ref.shape, f"{what}: {key}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
        assert got.dtype == dtype, f"{what}: {key}: dtype {got.dtype} != {dtype}"
        assert torch.isfinite(got).all(), f"{what}: {key}: non-finite values"
        err = max_abs(got.double() - ref)
        err_base = max_abs(baseline[key].double() - ref)
        if ref.numel() < small_tensor:
            err_base = max(err_base, pooled)
        eps = ulps * unit * max_abs(ref) + 1e-6
        if key in sums:
            eps = max(eps, sum_ulps * unit * sums[key])
        assert err <= 2 * err_base + eps, (
            f"{what}: {key} ({dtype}): max error {err:.3g} vs float64 reference exceeds 2 * {err_base:.3g} "
            f"(the low-precision reference's error) + {eps:.3g}"
        )


def gradients_of_gradients(loss, leaves: list, order: int = 2) -> list[tuple]:
    """The gradients of loss(*leaves) with respect to every leaf (create_graph=True), then, for
    each further order, the gradients of a nonlinear function of the last ones (a seeded
    random weighting through sin, so that no term vanishes by symmetry). Returns every order's
    gradients."""
    generator = torch.Generator().manual_seed(7)
    orders = [torch.autograd.grad(loss(*leaves), leaves, create_graph=True)]
    for k in range(1, order):
        weights = [torch.randn(g.shape, generator=generator, dtype=g.dtype).to(g.device) for g in orders[-1]]
        inner = sum((g * w).sin().sum() for g, w in zip(orders[-1], weights))
        orders.append(torch.autograd.grad(inner, leaves, create_graph=k + 1 < order, allow_unused=True))
    return orders


def assert_orders_close(got: list[tuple], expected: list[tuple], names: list[str], assert_close) -> None:
    """gradients_of_gradients' results against a reference's, order by order and leaf by leaf,
    with the test file's assert_close(actual, expected, dtype, name) in float64."""
    for k, (g_order, e_order) in enumerate(zip(got, expected), start=1):
        for name, g, e in zip(names, g_order, e_order):
            assert (g is None) == (e is None), f"order {k}, {name}: {g is None} against {e is None}"
            if g is not None:
                assert_close(g, e, torch.float64, f"order {k} d/d{name}")
