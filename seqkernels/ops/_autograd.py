"""Autograd plumbing shared by the ops' registrations (seqkernels/ops/<cell>.py)."""
from __future__ import annotations

import torch
from torch import Tensor
from torch._functorch.utils import unwrap_dead_wrappers
from torch.autograd import forward_ad as _forward_ad


def records_grad(*args) -> bool:
    """Whether autograd records a call on these arguments: grad mode on and a tensor among
    them requires grad (None and non-tensor arguments are skipped)."""
    return torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args)


# op -> the autograd.Function that eager calls of the functionals record (register_autograd,
# register_double_backward).
_EAGER_FUNCTIONS: dict = {}
# op -> that Function's apply without autograd.Function.apply's Python (_untransformed_apply).
_EAGER_APPLY: dict = {}


def _untransformed_apply(function: type):
    """``function.apply`` for calls outside torch.func transforms: the C++ apply that
    autograd.Function.apply ends in there, without the Python in front of it. That binds the
    arguments to ``forward``'s signature (inspect.signature on every call; the forwards here take
    ``*args``, so it binds nothing) before the same C++ call: 50 against 23 us a recorded call on
    a 2-core x86 host, host time that precedes the loop's launch on a GPU. Callers unwrap dead
    functorch wrappers first, as Function.apply does."""
    return super(torch.autograd.Function, function).apply


def _op_function(op, label: str, backward, setup_context) -> type:
    """An ``autograd.Function`` running ``op`` below autograd, with ``backward`` and
    ``setup_context`` as its formula. Written with a separate ``setup_context`` (not
    ``forward(ctx, ...)``) so that torch.func transforms accept it: ``grad``, ``vjp`` and
    ``jacrev`` through its backward, ``vmap`` through a generated rule (the op's own batching
    fallback, one sample at a time), while ``jvp`` and forward-mode AD raise: the ops have no
    forward-mode formula, and without this Function a ``torch.func.jvp`` reached the op's
    torch.library kernel, which dropped the tangents (a zero derivative, silently)."""

    def forward(*args):
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)

    return _function_type(op, label, forward, setup_context, backward)


def _function_type(op, label: str, forward, setup_context, backward) -> type:
    """The ``autograd.Function`` class of ``op`` with these three methods, ``jvp`` raising
    and a generated vmap rule (``_op_function``)."""

    def jvp(ctx, *tangents):
        raise NotImplementedError(f"{label}: forward-mode AD (torch.func.jvp, forward_ad) is not supported")

    return type(
        f"{op.name().replace('::', '_')}_function",
        (torch.autograd.Function,),
        {
            "forward": staticmethod(forward),
            "setup_context": staticmethod(setup_context),
            "backward": staticmethod(backward),
            "jvp": staticmethod(jvp),
            "generate_vmap_rule": True,
        },
    )


def _label(op) -> str:
    """"seqkernels::lstm_forward" (or _backward) -> "seqkernels.lstm", the prefix of the ops'
    messages."""
    return op.name().replace("::", ".").rsplit("_", 1)[0]


def register_autograd(op, backward, setup_context) -> None:
    """Attach ``backward`` / ``setup_context`` to ``op`` (a ``seqkernels::<cell>_forward``
    OpOverload) twice, with the same two functions:

    - ``torch.library.register_autograd``: the op's autograd formula, used by direct calls of
      the op and by torch.compile;
    - an ``autograd.Function`` (``_op_function``) that the functionals take for eager calls that
      autograd records and under torch.func transforms (``call_op``). torch.library's autograd
      kernel re-binds every argument against the schema in Python on each call
      (``fill_defaults``, which rebuilds the argument list per argument) and redispatches the op
      from Python: about 40 us of host time per recorded call on a 2-core x86 host, which
      precedes the kernels' launch on the GPU. The Function calls the op below autograd
      directly. (torch.library's kernel also fails under ``torch.func.grad``: its Function
      has no separate ``setup_context``.)"""
    torch.library.register_autograd(op, backward, setup_context=setup_context)
    _set_eager_function(op, _op_function(op, _label(op), backward, setup_context))


def _set_eager_function(op, function: type) -> None:
    _EAGER_FUNCTIONS[op] = function
    _EAGER_APPLY[op] = _untransformed_apply(function)


def transformed() -> bool:
    """A torch.func transform, or a forward-mode AD level, is active."""
    return torch._C._are_functorch_transforms_active() or _forward_ad._current_level >= 0


def call_op(op, recording: bool, *args, extra: tuple = ()):
    """``op(*args)`` as autograd sees it, with as little host time as possible:

    - torch.compile tracing: the registered op as is;
    - autograd records (``recording``) in an eager call, a torch.func transform is active, or a
      forward-mode AD level is open: the op's ``autograd.Function`` (``register_autograd``,
      ``register_double_backward``), which runs the same formula as the op's registered one,
      given ``extra`` too (inputs its formula reads that the op does not take); outside
      transforms through its C++ apply directly (``_untransformed_apply``);
    - autograd records nothing (grad mode off, or no input requires grad): the op below
      autograd, where its autograd kernel would only redispatch (a few microseconds per call,
      a measurable share of a small op on a GPU: a ConvRNN of the template's shape runs in
      ~30 us)."""
    if torch.compiler.is_compiling():
        return op(*args)
    if transformed():
        return _EAGER_FUNCTIONS[op].apply(*args, *extra)
    if recording:
        return _EAGER_APPLY[op](*unwrap_dead_wrappers(args + extra))
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


def call_backward_op(op, *args, extra: tuple = ()):
    """A ``<cell>_backward`` op called from an autograd formula: below autograd, unless a
    double backward is being recorded (create_graph=True and an argument requires grad, or a
    torch.func transform), where its Function records it (``register_double_backward``).
    ``extra``: what that Function's formula needs beyond the op's arguments (the op does not
    take them). Going below autograd skips the Function's Python wrapper, a sizeable share of
    a small training call's host time."""
    return call_op(op, records_grad(*args, *extra), *args, extra=extra)


def vmap_fold(t: Tensor, in_dim: int | None, V: int, dim: int) -> Tensor:
    """In a vmap rule: t's vmapped dimension (in_dim; None: t is shared, so repeated V times)
    merged into its batch dimension `dim`, sample v of batch entry b at b·V + v, contiguous.
    That order keeps a packed sequence's layout (the LSTM's rows: each sample's rows of a
    step stay the first ones of the step when the samples share batch_sizes)."""
    if in_dim is None:
        t = t.unsqueeze(dim + 1).expand(*t.shape[: dim + 1], V, *t.shape[dim + 1 :])
    else:
        t = t.movedim(in_dim, dim + 1)
    return t.reshape(*t.shape[:dim], t.shape[dim] * V, *t.shape[dim + 2 :]).contiguous()


def vmap_unfold(t: Tensor, V: int, dim: int) -> Tensor:
    """vmap_fold's inverse for an output whose batch dimension `dim` holds V samples: the
    vmapped dimension first, each sample contiguous (the backward ops, which vmap runs one
    sample at a time, take saved outputs only contiguous). A 1-D empty output (nothing
    saved) becomes [V, 0]."""
    if t.dim() == 1 and t.numel() == 0:
        return t.new_empty(V, 0)
    t = t.reshape(*t.shape[:dim], t.shape[dim] // V, V, *t.shape[dim + 1 :])
    return t.movedim(dim + 1, 0).contiguous()


def vmap_per_sample(op, V: int, in_dims, args) -> tuple:
    """In a vmap rule: op called once per sample (for arguments no rule can fold, such as
    per-sample weights), its outputs stacked, the vmapped dimension first."""
    calls = [op(*(a.select(d, v) if d is not None else a for a, d in zip(args, in_dims))) for v in range(V)]
    return tuple(torch.stack(outs) for outs in zip(*calls)), (0,) * len(calls[0])


def check_same_device(label: str, x: Tensor, **tensors: Tensor | None) -> None:
    """In a forward op's fake function: every tensor on x's device, as the kernels check
    (lstm_checks.cpp and the conv ops' checks, with their messages). The fake function is
    also the op's Meta kernel, which the dispatcher picks whenever one argument is on the meta
    device: without this a meta input beside real weights returned a meta output instead of
    nn.LSTM's RuntimeError."""
    for name, t in tensors.items():
        if t is not None:
            torch._check(t.device == x.device, lambda: f"{label}: {name} is on {t.device} but x is on {x.device}")


def dense_grad(grad: Tensor | None, like: Tensor) -> Tensor:
    """Autograd hands over None for unused outputs and expanded (stride-0) gradients for
    sums; kernels that take dense, contiguous gradients get zeros or a contiguous copy."""
    return torch.zeros_like(like) if grad is None else grad.contiguous()


def dense_grads(*pairs: tuple[Tensor | None, Tensor]) -> tuple[Tensor, ...]:
    """``dense_grad`` of each (grad, like) pair, on a GPU the missing gradients' zeros from one
    allocation and one fill: a launch per zero tensor is host time between a training call's
    forward and its backward loop (15-48 us for a zeros_like on an H200 host), where unused h_n
    and c_n are the common case. Each zero tensor starts 64 elements after the last at least
    (aligned as an allocation's rows). On the CPU, where a fill launches nothing, one zeros_like
    each is cheaper than the views."""
    missing = [like for grad, like in pairs if grad is None]
    first = missing[0] if missing else None
    if len(missing) < 2 or first.device.type == "cpu" or any(t.dtype != first.dtype or t.device != first.device
                                                              for t in missing):
        return tuple(dense_grad(grad, like) for grad, like in pairs)
    row = -(-max(t.numel() for t in missing) // 64) * 64
    flat = first.new_zeros(len(missing) * row)
    out, k = [], 0
    for grad, like in pairs:
        if grad is None:
            out.append(flat.narrow(0, k * row, like.numel()).view(like.shape))
            k += 1
        else:
            out.append(grad.contiguous())
    return tuple(out)


def mark_saved_outputs(ctx, *saved: Tensor) -> None:
    """For ops that return what backward needs (saved gates, cell states) as extra outputs:
    they are not differentiable, and unused outputs (always these, often h_n and c_n) reach
    backward as None rather than as zero tensors of their size, which autograd would
    otherwise allocate in every backward (for the gates, 4x the output)."""
    ctx.mark_non_differentiable(*saved)
    ctx.set_materialize_grads(False)


def reference_vjp(reference, primals: dict, cotangents) -> dict:
    """The vector-Jacobian product of ``reference(**primals)`` with ``cotangents`` (the shape of
    its outputs), by torch.func.vjp: name -> the gradient of each primal that is a tensor (None
    entries are passed as they are: torch.func.vjp takes tensors only). A ``first_order`` of
    ``register_double_backward`` in one call."""
    names = [k for k, v in primals.items() if v is not None]

    def call(*values):
        return reference(**{**primals, **dict(zip(names, values))})

    _, vjp = torch.func.vjp(call, *(primals[k] for k in names))
    return dict(zip(names, vjp(cotangents)))


def register_double_backward(backward_op: str, first_order, saved_outputs: tuple[str, ...]) -> None:
    """Double backward (gradients of gradients: create_graph=True, torch.func.grad of
    torch.func.grad, Hessian-vector products) of ``backward_op`` ("seqkernels::<cell>_backward"),
    as nn.LSTM gives it on the CPU: the first-order gradients keep coming from the native
    backward op; only their own derivatives are computed, in PyTorch ops, at a Python loop's
    speed.

    ``first_order(*args, *extra)`` takes the backward op's arguments and the ``extra`` inputs
    that ``call_backward_op`` passes (tensors the op does not take, such as the biases) and
    returns the op's outputs in PyTorch ops, as a differentiable function of them (an empty
    tensor where the op returns one; torch.func.vjp inside works within torch.func transforms
    too): either the pure-PyTorch reference's forward, recomputed from the inputs and
    differentiated (``reference_vjp``), or the backward recurrence itself from the saved
    outputs. This Function's formula is the vector-Jacobian product of that function: the
    derivatives of the gradients with respect to each input it reads, and to the incoming
    gradients; autograd carries them on through the inputs' histories (a saved output's
    through the forward's own backward). The backward op's ``saved_outputs`` that
    ``first_order`` does not read because the reference recomputes them (e.g. the LSTM's y,
    gates, cells) get none: their gradient would be zeros, sent through the forward's history
    for nothing. torch.func keeps the formula's own derivatives apart from the inputs'
    histories, and autograd records them where the outer call does (create_graph), so higher
    orders go through the same ops.

    Direct calls of the backward op and torch.compile get torch.library's formula for it, which
    raises (AOTAutograd does not differentiate a backward either): without one, autograd would
    treat the op's outputs as constants and a second backward would return wrong gradients,
    silently."""
    op = getattr(torch.ops.seqkernels, backward_op.split("::")[1]).default
    label = _label(op)

    def not_differentiable(ctx, *grads):
        raise NotImplementedError(
            f"{label}: double backward through a direct call of the backward op (or under torch.compile) "
            "is not supported"
        )

    torch.library.register_autograd(backward_op, not_differentiable, setup_context=lambda ctx, inputs, output: None)
    names = [a.name for a in op._schema.arguments]
    skipped = {names.index(name) for name in saved_outputs}

    def forward(*args):
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args[: len(names)])

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*(a if isinstance(a, Tensor) else None for a in inputs))
        ctx.constants = tuple(None if isinstance(a, Tensor) else a for a in inputs)

    def backward(ctx, *grads):
        inputs = [c if t is None else t for t, c in zip(ctx.saved_tensors, ctx.constants)]
        wanted = [i for i, needed in enumerate(ctx.needs_input_grad) if needed and i not in skipped]
        present = [k for k, g in enumerate(grads) if g is not None]
        result: list = [None] * len(inputs)
        if not wanted or not present:
            return tuple(result)

        def gradients(*values):  # the present first-order gradients as a function of the wanted inputs
            args = list(inputs)
            for i, v in zip(wanted, values):
                args[i] = v
            firsts = first_order(*args)
            return tuple(firsts[k] for k in present)

        _, vjp = torch.func.vjp(gradients, *(inputs[i] for i in wanted))
        for i, g in zip(wanted, vjp(tuple(grads[k] for k in present))):
            result[i] = g
        return tuple(result)

    _set_eager_function(op, _function_type(op, label, forward, setup_context, backward))
