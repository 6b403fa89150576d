// lstm_padded: seqkernels.LSTM's common call where autograd records it (an eager training call)
// as one operator whose autograd node is C++. Why: on a GPU the host work between the forward's
// loop launch and the backward's (the loss, autograd's engine, the backward formula, the backward
// op's set-up) is issued while the forward loop runs, and at small batch it outlasts that loop, so
// the GPU waits for it. A Python autograd.Function added its Python to both ends: the forward's
// reshapes, zero state and batch sizes before the loop's launch, and in backward the saved
// tensors' unpacking, the views and the gradients' zeros before the backward loop's. Here they
// are made in C++, below autograd, with the same lstm_forward / lstm_backward calls as lstm_layer's
// path (so the same results bitwise).
//
// Shape legend (csrc/registration.cpp): input [T, B, I] ([B, T, I] if batch_first), h0 / c0
// [1, B, H] or both None (zeros), w_ih [G, I], w_hh [G, H], b_ih / b_hh [G] (both or neither);
// N = T·B rows, time-major.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <tuple>

#include "seqkernels/lstm_infer.h"

namespace seqkernels {
namespace {

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ForwardSignature = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptionalTensor&,
    const OptionalTensor&, const OptionalTensor&, bool, bool);
using Gradients = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
using BackwardSignature = Gradients(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptionalTensor&,
                                    const Tensor&, const Tensor&, const Tensor&, bool, bool);
// lstm_backward's arguments, then b_ih and b_hh (what its double-backward formula reads).
using RecordedBackwardSignature = Gradients(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                            const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                            const OptionalTensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                                            bool, const OptionalTensor&, const OptionalTensor&);

template <class Signature>
c10::TypedOperatorHandle<Signature> operator_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

OptionalTensor given(const Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; }

// lstm_forward through the dispatcher (this file serves every backend).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> dispatched_forward(
    const Tensor& x, const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
    const Tensor& w_hh, const OptionalTensor& b_ih, const OptionalTensor& b_hh, const OptionalTensor& w_hr,
    bool reverse, bool training) {
  static const auto forward_op = operator_handle<ForwardSignature>("seqkernels::lstm_forward");
  return forward_op.call(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse, training);
}

// The gradients autograd leaves out (unused outputs arrive undefined: set_materialize_grads(false))
// as zeros; given ones made contiguous (a sum's gradient arrives expanded). h_n's and c_n's, both
// left out where a loss reads only the output (the common case), come from one allocation and one
// fill: on a GPU each zeros tensor is a launch in the host work before the backward loop.
//   grads: output's [T, B, H] (as [N, H] rows), h_n's and c_n's [B, H] (h_n[0], c_n[0])
void dense_gradients(std::array<Tensor, 3>& grads, int64_t N, int64_t B, int64_t H,
                     const at::TensorOptions& options) {
  Tensor& output = grads[0];
  output = output.defined() ? output.contiguous() : at::zeros({N, H}, options);
  if (!grads[1].defined() && !grads[2].defined()) {
    const Tensor zeros = at::zeros({2, B, H}, options);
    grads[1] = zeros[0];
    grads[2] = zeros[1];
    return;
  }
  for (Tensor* state : {&grads[1], &grads[2]}) {
    *state = state->defined() ? state->contiguous() : at::zeros({B, H}, options);
  }
}

}  // namespace

// The node. Its outputs are made below ADInplaceOrView, so they are not views in autograd's sense
// and a caller may modify them in place (as lstm_layer's). Such aliases share no version counter
// with what they alias, so the node saves the tensors it reads as given (seq, h0, c0, its output),
// whose version counters catch an in-place change before backward, and remakes its views of them in
// backward; only the zero state, its own, is saved as made. (Outside the anonymous namespace, so
// that the node's name, grad_fn.name(), reads torch::autograd::CppNode<seqkernels::LstmPaddedFunction>.)
struct LstmPaddedFunction : public torch::autograd::Function<LstmPaddedFunction> {
  // seq: the input time-major and contiguous [T, B, I] (lstm_padded_autograd copies it so).
  static variable_list forward(AutogradContext* ctx, const Tensor& seq, const OptionalTensor& h0,
                               const OptionalTensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                               const OptionalTensor& b_ih, const OptionalTensor& b_hh, bool batch_first) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const PaddedCall call = padded_call("seqkernels.lstm_padded", seq, h0, c0, w_hh, /*batch_first=*/false);
    const auto [y, h_n, c_n, gates, cells] =
        dispatched_forward(seq.view({call.T * call.B, call.I}), call.batch_sizes, call.h0, call.c0, w_ih.contiguous(),
                        w_hh.contiguous(), contiguous_if_given(b_ih), contiguous_if_given(b_hh), std::nullopt,
                        /*reverse=*/false, /*training=*/true);
    Tensor output = y.view({call.T, call.B, y.size(1)});
    if (batch_first) output = output.transpose(0, 1);
    ctx->saved_data["batch_first"] = batch_first;
    ctx->saved_data["has_bias"] = b_ih.has_value();
    ctx->saved_data["has_state"] = h0.has_value();
    ctx->saved_data["batch_sizes"] = call.batch_sizes;
    const bool zero_state = !h0.has_value();
    ctx->save_for_backward({seq, h0.value_or(Tensor()), c0.value_or(Tensor()), w_ih, w_hh, b_ih.value_or(Tensor()),
                            b_hh.value_or(Tensor()), output, gates, cells, zero_state ? call.h0 : Tensor(),
                            zero_state ? call.c0 : Tensor()});
    ctx->set_materialize_grads(false);
    return {output, h_n.unsqueeze(0), c_n.unsqueeze(0)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op = operator_handle<BackwardSignature>("seqkernels::lstm_backward");
    static const auto recorded_backward_op =
        operator_handle<RecordedBackwardSignature>("seqkernels::lstm_backward_recorded");
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &seq = saved[0], &h0 = saved[1], &c0 = saved[2], &w_ih = saved[3], &w_hh = saved[4],
                 &b_ih = saved[5], &b_hh = saved[6], &output = saved[7], &gates = saved[8], &cells = saved[9];
    const bool batch_first = ctx->saved_data["batch_first"].toBool();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const bool has_state = ctx->saved_data["has_state"].toBool();
    const Tensor batch_sizes = ctx->saved_data["batch_sizes"].toTensor();
    const int64_t T = seq.size(0), B = seq.size(1), I = seq.size(2), N = T * B;
    // Under create_graph these views record, so that the gradients' own gradients reach seq, h0
    // and c0 (the double-backward formula of lstm_backward's Function).
    const Tensor x = seq.view({N, I});
    const Tensor h0_rows = has_state ? h0[0].contiguous() : saved[10];
    const Tensor c0_rows = has_state ? c0[0].contiguous() : saved[11];
    const Tensor y = (batch_first ? output.transpose(0, 1) : output).reshape({N, -1});  // lstm_forward's y
    const int64_t H = y.size(1);
    std::array<Tensor, 3> dense = {
        grads[0].defined() ? (batch_first ? grads[0].transpose(0, 1) : grads[0]).reshape({N, H}) : Tensor(),
        grads[1].defined() ? grads[1][0] : Tensor(), grads[2].defined() ? grads[2][0] : Tensor()};
    dense_gradients(dense, N, B, H, y.options());
    // create_graph: lstm_backward through its autograd.Function (seqkernels/ops/lstm.py), which
    // records the double-backward formula; else below autograd, where that Function has nothing to do.
    const auto [dx, dh0, dc0, dw_ih, dw_hh, dbias, unused_dw_hr] =
        c10::GradMode::is_enabled()
            ? recorded_backward_op.call(dense[0], dense[1], dense[2], x, batch_sizes, h0_rows, c0_rows,
                                        w_ih.contiguous(), w_hh.contiguous(), std::nullopt, y, gates, cells,
                                        /*reverse=*/false, has_bias, given(b_ih), given(b_hh))
            : [&] {
                at::AutoDispatchBelowADInplaceOrView below_autograd;
                return backward_op.call(dense[0], dense[1], dense[2], x, batch_sizes, h0_rows, c0_rows,
                                        w_ih.contiguous(), w_hh.contiguous(), std::nullopt, y, gates, cells,
                                        /*reverse=*/false, has_bias);
              }();
    const Tensor db = has_bias ? dbias : Tensor();
    return {dx.view(seq.sizes()),
            has_state ? dh0.unsqueeze(0) : Tensor(),
            has_state ? dc0.unsqueeze(0) : Tensor(),
            dw_ih,
            dw_hh,
            db,
            db,
            Tensor()};
  }
};

namespace {

std::tuple<Tensor, Tensor, Tensor> lstm_padded_autograd(const Tensor& input, const OptionalTensor& h0,
                                                        const OptionalTensor& c0, const Tensor& w_ih,
                                                        const Tensor& w_hh, const OptionalTensor& b_ih,
                                                        const OptionalTensor& b_hh, bool batch_first) {
  TORCH_CHECK(input.defined() && input.dim() == 3, "seqkernels.lstm_padded: input must be 3-D [T, B, I], got ",
              std::to_string(input.defined() ? input.dim() : 0), "-D");
  // A batch-first or otherwise non-contiguous input is copied time-major here, where autograd
  // records the copy (as lstm_layer's path's reshape), so that the node saves the copy and not
  // the caller's tensor.
  Tensor seq = batch_first ? input.transpose(0, 1) : input;
  if (!seq.is_contiguous()) seq = seq.contiguous();
  const variable_list out = LstmPaddedFunction::apply(seq, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first);
  return {out[0], out[1], out[2]};
}

// Below autograd (nothing records): the outputs alone, nothing saved.
std::tuple<Tensor, Tensor, Tensor> lstm_padded_outputs(const Tensor& input, const OptionalTensor& h0,
                                                       const OptionalTensor& c0, const Tensor& w_ih,
                                                       const Tensor& w_hh, const OptionalTensor& b_ih,
                                                       const OptionalTensor& b_hh, bool batch_first) {
  return padded_forward("seqkernels.lstm_padded", input, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first,
                        &dispatched_forward);
}

}  // namespace
}  // namespace seqkernels

TORCH_LIBRARY_IMPL(seqkernels, Autograd, m) { m.impl("lstm_padded", &seqkernels::lstm_padded_autograd); }

TORCH_LIBRARY_IMPL(seqkernels, CompositeExplicitAutograd, m) {
  m.impl("lstm_padded", &seqkernels::lstm_padded_outputs);
}
