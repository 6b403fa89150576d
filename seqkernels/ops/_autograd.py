"""Autograd plumbing shared by the ops' registrations (seqkernels/ops/<cell>.py)."""
from __future__ import annotations

import torch
from torch import Tensor


def records_grad(*args) -> bool:
    """Whether autograd records a call on these arguments: grad mode on and a tensor among
    them requires grad (None and non-tensor arguments are skipped)."""
    return torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args)


# op -> the autograd.Function that eager calls of the functionals record (register_autograd).
_EAGER_FUNCTIONS: dict = {}


def register_autograd(op, backward, setup_context) -> None:
    """Attach ``backward`` / ``setup_context`` to ``op`` (a ``seqkernels::<cell>_forward``
    OpOverload) twice, with the same two functions:

    - ``torch.library.register_autograd``: the op's autograd formula, used by direct calls of
      the op, torch.compile and torch.func transforms;
    - an ``autograd.Function`` that the functionals take for eager calls that autograd records
      (``call_op``). torch.library's autograd kernel re-binds every argument against the schema
      in Python on each call (``fill_defaults``, which rebuilds the argument list per argument)
      and redispatches the op from Python: about 40 us of host time per recorded call on a 2-core
      x86 host, which precedes the kernels' launch on the GPU. The Function calls the op below
      autograd directly."""
    torch.library.register_autograd(op, backward, setup_context=setup_context)

    def forward(ctx, *args):
        with torch._C._AutoDispatchBelowAutograd():
            output = op(*args)
        setup_context(ctx, args, output)
        return output

    name = op.name().replace("::", "_")
    _EAGER_FUNCTIONS[op] = type(
        f"{name}_eager", (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    )


def call_op(op, recording: bool, *args):
    """``op(*args)`` as autograd sees it, with as little host time as possible:

    - autograd records (``recording``) in an eager call: the op's eager autograd.Function
      (``register_autograd``), which runs the same formula as the op's registered one;
    - autograd records nothing (grad mode off, or no input requires grad): the op below
      autograd, where its autograd kernel would only redispatch (a few microseconds per call,
      a measurable share of a small op on a GPU: a ConvRNN of the template's shape runs in
      ~30 us);
    - torch.compile tracing or a torch.func transform active: the registered op as is."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return op(*args)
    if recording:
        # An op without an eager Function (the backward ops, recorded only by a double backward,
        # whose formula raises) records through its registered formula.
        eager = _EAGER_FUNCTIONS.get(op)
        return op(*args) if eager is None else eager.apply(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


def call_backward_op(op, *args):
    """A ``<cell>_backward`` op called from an autograd formula: below autograd, unless a
    double backward is being recorded (create_graph=True and an argument requires grad),
    where the op's own formula (``forbid_double_backward``) must run and raise. Going below
    autograd skips that formula's Python wrapper, a sizeable share of a small training call's
    host time."""
    return call_op(op, records_grad(*args), *args)


def dense_grad(grad: Tensor | None, like: Tensor) -> Tensor:
    """Autograd hands over None for unused outputs and expanded (stride-0) gradients for
    sums; kernels that take dense, contiguous gradients get zeros or a contiguous copy."""
    return torch.zeros_like(like) if grad is None else grad.contiguous()


def mark_saved_outputs(ctx, *saved: Tensor) -> None:
    """For ops that return what backward needs (saved gates, cell states) as extra outputs:
    they are not differentiable, and unused outputs (always these, often h_n and c_n) reach
    backward as None rather than as zero tensors of their size, which autograd would
    otherwise allocate in every backward (for the gates, 4x the output)."""
    ctx.mark_non_differentiable(*saved)
    ctx.set_materialize_grads(False)


def forbid_double_backward(backward_op: str, label: str) -> None:
    """Register an autograd formula for ``backward_op`` ("seqkernels::<cell>_backward") that
    raises: without one, autograd would treat the backward op's outputs as constants and a
    second backward (create_graph=True) would silently return wrong gradients."""

    def _not_differentiable(ctx, *grads):
        raise NotImplementedError(f"{label}: double backward (differentiating the gradient) is not supported")

    def _setup_context(ctx, inputs, output):
        pass

    torch.library.register_autograd(backward_op, _not_differentiable, setup_context=_setup_context)
