// The modules' calls where autograd records them (eager training calls) as operators whose autograd
// nodes are C++: lstm_padded (seqkernels.LSTM: one layer and direction of a stack, a padded
// sequence), lstm_cell (seqkernels.LSTMCell: one step) and lstm_layer (one layer and direction over
// packed rows: the modules' general path). Why: on a GPU the host work between the
// forward's loop launch and the backward's (the loss, autograd's engine, the backward formula, the
// backward op's set-up) is issued while the forward loop runs, and at small batch it outlasts that
// loop, so the GPU waits for it. A Python autograd.Function added its Python to both ends: the
// forward's reshapes, zero state and batch sizes before the loop's launch, and in backward the
// saved tensors' unpacking, the views and the gradients' zeros before the backward loop's. Here
// they are made in C++, below autograd, with the same lstm_forward / lstm_backward calls as
// lstm_layer's path (so the same results bitwise).
//
// Shape legend (csrc/registration.cpp): lstm_padded's input [T, B, I] ([B, T, I] if batch_first),
// h0 / c0 [1, B, H] or both None (zeros); lstm_cell's input [B, I], h0 / c0 [B, H] or both None;
// w_ih [G, I], w_hh [G, H], b_ih / b_hh [G] (both or neither); N = T·B rows, time-major (T = 1 for
// a cell).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <tuple>
#include <utility>

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
// as zeros; given ones made contiguous (a sum's gradient arrives expanded). The missing ones of
// the same shape come from one allocation and one fill (h_n's and c_n's, both left out where a loss
// reads only the output: the common case): on a GPU each zeros tensor is a launch in the host work
// before the backward loop.
//   grads: y's [N, Hout], h_n's [B, Hout] and c_n's [B, H] (shapes: their {rows, columns})
using GradientShapes = std::array<std::array<int64_t, 2>, 3>;
void dense_gradients(std::array<Tensor, 3>& grads, const GradientShapes& shapes, const at::TensorOptions& options) {
  std::array<bool, 3> done{};
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) {
      grads[i] = grads[i].contiguous();
      done[i] = true;
    }
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (done[i]) continue;
    int64_t same = 0;  // the missing gradients of this one's shape
    for (size_t j = i; j < grads.size(); ++j) same += !done[j] && shapes[j] == shapes[i];
    const Tensor zeros = at::zeros({same, shapes[i][0], shapes[i][1]}, options);
    int64_t k = 0;
    for (size_t j = i; j < grads.size(); ++j) {
      if (!done[j] && shapes[j] == shapes[i]) {
        grads[j] = zeros[k++];
        done[j] = true;
      }
    }
  }
}

// lstm_backward of a node's layer (run from the last step to the first if reverse; w_hr [P, H] or
// undefined; b_ih / b_hh both defined or neither), given dense gradients (dy [N, Hout], dh_n [B, Hout],
// dc_n [B, H]).
// create_graph (grad mode on in backward): through its autograd.Function (lstm_backward_recorded,
// seqkernels/ops/lstm.py), which records the double-backward formula; else below autograd, where
// that Function has nothing to do.
Gradients layer_backward(const std::array<Tensor, 3>& dense, const Tensor& x, const Tensor& batch_sizes,
                         const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                         const Tensor& w_hr, const Tensor& y, const Tensor& gates, const Tensor& cells, bool reverse,
                         const Tensor& b_ih, const Tensor& b_hh) {
  const bool has_bias = b_ih.defined();
  static const auto backward_op = operator_handle<BackwardSignature>("seqkernels::lstm_backward");
  static const auto recorded_backward_op =
      operator_handle<RecordedBackwardSignature>("seqkernels::lstm_backward_recorded");
  if (c10::GradMode::is_enabled()) {
    return recorded_backward_op.call(dense[0], dense[1], dense[2], x, batch_sizes, h0, c0, w_ih.contiguous(),
                                     w_hh.contiguous(), given(w_hr), y, gates, cells, reverse, has_bias, given(b_ih),
                                     given(b_hh));
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return backward_op.call(dense[0], dense[1], dense[2], x, batch_sizes, h0, c0, w_ih.contiguous(), w_hh.contiguous(),
                          given(w_hr), y, gates, cells, reverse, has_bias);
}

// What the nodes record in forward besides their saved tensors. (Whether a call has biases is
// whether its saved b_ih is defined, and whether a padded or cell call was given its state whether
// its saved h0 is.)
void save_flags(AutogradContext* ctx, const Tensor& batch_sizes) {
  ctx->saved_data["batch_sizes"] = batch_sizes;
  ctx->set_materialize_grads(false);
}

// lstm_cell's one lstm_forward call: the state rows (the given h0 / c0 [B, H], both or neither, or
// zeros from one allocation) and batch sizes [1] made here.
struct CellForward {
  Tensor h0, c0, batch_sizes;
  std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> out;  // y, h_n, c_n, gates, cells
};
CellForward cell_forward(const Tensor& input, const OptionalTensor& h0, const OptionalTensor& c0, const Tensor& w_ih,
                         const Tensor& w_hh, const OptionalTensor& b_ih, const OptionalTensor& b_hh, bool training) {
  TORCH_CHECK(input.defined() && input.dim() == 2, "seqkernels.lstm_cell: input must be 2-D [B, I], got ",
              std::to_string(input.defined() ? input.dim() : 0), "-D");
  TORCH_CHECK(h0.has_value() == c0.has_value(), "seqkernels.lstm_cell: give both h0 and c0, or neither");
  CellForward call;
  if (h0.has_value()) {
    call.h0 = h0->contiguous();
    call.c0 = c0->contiguous();
  } else {
    TORCH_CHECK(w_hh.defined() && w_hh.dim() == 2, "seqkernels.lstm_cell: w_hh must be 2-D [4H, H]");
    const Tensor zeros = at::zeros({2, input.size(0), w_hh.size(1)}, input.options());
    call.h0 = zeros[0];
    call.c0 = zeros[1];
  }
  call.batch_sizes = at::full({1}, input.size(0), at::TensorOptions().dtype(at::kLong));
  call.out = dispatched_forward(input.contiguous(), call.batch_sizes, call.h0, call.c0, w_ih.contiguous(),
                                w_hh.contiguous(), contiguous_if_given(b_ih), contiguous_if_given(b_hh), std::nullopt,
                                /*reverse=*/false, training);
  return call;
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
                               const OptionalTensor& b_ih, const OptionalTensor& b_hh, bool batch_first,
                               bool reverse) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const PaddedCall call = padded_call("seqkernels.lstm_padded", seq, h0, c0, w_hh, /*batch_first=*/false);
    const auto [y, h_n, c_n, gates, cells] =
        dispatched_forward(seq.view({call.T * call.B, call.I}), call.batch_sizes, call.h0, call.c0,
                           w_ih.contiguous(), w_hh.contiguous(), contiguous_if_given(b_ih), contiguous_if_given(b_hh),
                           std::nullopt, reverse, /*training=*/true);
    Tensor output = y.view({call.T, call.B, y.size(1)});
    if (batch_first) output = output.transpose(0, 1);
    ctx->saved_data["batch_first"] = batch_first;
    ctx->saved_data["reverse"] = reverse;
    save_flags(ctx, call.batch_sizes);
    const bool zero_state = !h0.has_value();
    ctx->save_for_backward({seq, h0.value_or(Tensor()), c0.value_or(Tensor()), w_ih, w_hh, b_ih.value_or(Tensor()),
                            b_hh.value_or(Tensor()), output, gates, cells, zero_state ? call.h0 : Tensor(),
                            zero_state ? call.c0 : Tensor()});
    return {output, h_n.unsqueeze(0), c_n.unsqueeze(0)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &seq = saved[0], &h0 = saved[1], &c0 = saved[2], &output = saved[7];
    const bool batch_first = ctx->saved_data["batch_first"].toBool();
    const bool has_state = h0.defined();
    const int64_t T = seq.size(0), B = seq.size(1), I = seq.size(2), N = T * B;
    // Under create_graph these views record, so that the gradients' own gradients reach seq, h0
    // and c0 (the double-backward formula of lstm_backward's Function).
    const Tensor y = (batch_first ? output.transpose(0, 1) : output).reshape({N, -1});  // lstm_forward's y
    const int64_t H = y.size(1);
    std::array<Tensor, 3> dense = {
        grads[0].defined() ? (batch_first ? grads[0].transpose(0, 1) : grads[0]).reshape({N, H}) : Tensor(),
        grads[1].defined() ? grads[1][0] : Tensor(), grads[2].defined() ? grads[2][0] : Tensor()};
    dense_gradients(dense, {{{N, H}, {B, H}, {B, H}}}, y.options());
    const auto [dx, dh0, dc0, dw_ih, dw_hh, dbias, unused_dw_hr] =
        layer_backward(dense, seq.view({N, I}), ctx->saved_data["batch_sizes"].toTensor(),
                       has_state ? h0[0].contiguous() : saved[10], has_state ? c0[0].contiguous() : saved[11],
                       saved[3], saved[4], Tensor(), y, saved[8], saved[9], ctx->saved_data["reverse"].toBool(),
                       saved[5], saved[6]);
    const Tensor db = saved[5].defined() ? dbias : Tensor();
    return {dx.view(seq.sizes()),
            has_state ? dh0.unsqueeze(0) : Tensor(),
            has_state ? dc0.unsqueeze(0) : Tensor(),
            dw_ih,
            dw_hh,
            db,
            db,
            Tensor(),
            Tensor()};
  }
};

// lstm_cell's node: one step on [B, I] rows. Like LstmPaddedFunction (above) it saves the input and
// the state as given and the zero state as made. It returns lstm_forward's h_n and c_n, as
// lstm_layer's step did, and saves y instead (for one step, the same rows as h_n): none of its
// outputs is saved, so they may be modified in place. A loss on h reaches backward as dh_n, and y's
// gradient is zeros.
struct LstmCellFunction : public torch::autograd::Function<LstmCellFunction> {
  // input: [B, I], contiguous (lstm_cell_autograd makes it so).
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const OptionalTensor& h0,
                               const OptionalTensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                               const OptionalTensor& b_ih, const OptionalTensor& b_hh) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const CellForward call = cell_forward(input, h0, c0, w_ih, w_hh, b_ih, b_hh, /*training=*/true);
    const auto& [y, h_n, c_n, gates, cells] = call.out;
    save_flags(ctx, call.batch_sizes);
    const bool zero_state = !h0.has_value();
    ctx->save_for_backward({input, h0.value_or(Tensor()), c0.value_or(Tensor()), w_ih, w_hh, b_ih.value_or(Tensor()),
                            b_hh.value_or(Tensor()), y, gates, cells, zero_state ? call.h0 : Tensor(),
                            zero_state ? call.c0 : Tensor()});
    return {h_n, c_n};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &input = saved[0], &h0 = saved[1], &c0 = saved[2], &y = saved[7];
    const bool has_state = h0.defined();
    const int64_t B = y.size(0), H = y.size(1);
    std::array<Tensor, 3> dense = {Tensor(), grads[0], grads[1]};
    dense_gradients(dense, {{{B, H}, {B, H}, {B, H}}}, y.options());
    const auto [dx, dh0, dc0, dw_ih, dw_hh, dbias, unused_dw_hr] =
        layer_backward(dense, input, ctx->saved_data["batch_sizes"].toTensor(),
                       has_state ? h0.contiguous() : saved[10], has_state ? c0.contiguous() : saved[11], saved[3],
                       saved[4], Tensor(), y, saved[8], saved[9], /*reverse=*/false, saved[5], saved[6]);
    const Tensor db = saved[5].defined() ? dbias : Tensor();
    return {dx, has_state ? dh0 : Tensor(), has_state ? dc0 : Tensor(), dw_ih, dw_hh, db, db};
  }
};

// lstm_layer's node: one layer and direction over packed rows, the functional lstm_layer's call where
// autograd records it eagerly (the modules' general path: PackedSequence, projection, autocast,
// unbatched input). It saves what lstm_forward's Python autograd.Function saves (the inputs, y,
// gates and cells) and makes the same lstm_forward / lstm_backward calls, so the same results
// bitwise; y, an output, is saved as one, so an in-place change of it before backward raises.
struct LstmLayerFunction : public torch::autograd::Function<LstmLayerFunction> {
  // x [N, I], h0 [B, Hout], c0 [B, H]: contiguous (lstm_layer_autograd makes them so, recorded).
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& batch_sizes, const Tensor& h0,
                               const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh, const OptionalTensor& b_ih,
                               const OptionalTensor& b_hh, const OptionalTensor& w_hr, bool reverse) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const auto [y, h_n, c_n, gates, cells] =
        dispatched_forward(x, batch_sizes, h0, c0, w_ih.contiguous(), w_hh.contiguous(), contiguous_if_given(b_ih),
                           contiguous_if_given(b_hh), contiguous_if_given(w_hr), reverse, /*training=*/true);
    save_flags(ctx, batch_sizes);
    ctx->saved_data["reverse"] = reverse;
    ctx->save_for_backward({x, h0, c0, w_ih, w_hh, b_ih.value_or(Tensor()), b_hh.value_or(Tensor()),
                            w_hr.value_or(Tensor()), y, gates, cells});
    return {y, h_n, c_n};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &h0 = saved[1], &c0 = saved[2], &w_hr = saved[7], &y = saved[8];
    std::array<Tensor, 3> dense = {grads[0], grads[1], grads[2]};
    dense_gradients(dense, {{{y.size(0), y.size(1)}, {h0.size(0), h0.size(1)}, {c0.size(0), c0.size(1)}}},
                    y.options());
    const auto [dx, dh0, dc0, dw_ih, dw_hh, dbias, dw_hr] =
        layer_backward(dense, x, ctx->saved_data["batch_sizes"].toTensor(), h0, c0, saved[3], saved[4], w_hr, y,
                       saved[9], saved[10], ctx->saved_data["reverse"].toBool(), saved[5], saved[6]);
    const Tensor db = saved[5].defined() ? dbias : Tensor();
    return {dx, Tensor(), dh0, dc0, dw_ih, dw_hh, db, db, w_hr.defined() ? dw_hr : Tensor(), Tensor()};
  }
};

namespace {

void check_layer_rows(const Tensor& x, const Tensor& h0, const Tensor& c0) {
  TORCH_CHECK(x.defined() && h0.defined() && c0.defined(), "seqkernels.lstm_layer: x, h0 and c0 must be given");
}

std::tuple<Tensor, Tensor, Tensor> lstm_layer_autograd(const Tensor& x, const Tensor& batch_sizes, const Tensor& h0,
                                                       const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                                                       const OptionalTensor& b_ih, const OptionalTensor& b_hh,
                                                       const OptionalTensor& w_hr, bool reverse) {
  check_layer_rows(x, h0, c0);
  // Copies of non-contiguous rows and states are made here, where autograd records them (as the
  // Python functional's), so that the node saves the copies. lstm_forward checks the rest.
  const variable_list out = LstmLayerFunction::apply(x.contiguous(), batch_sizes, h0.contiguous(), c0.contiguous(),
                                                     w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
  return {out[0], out[1], out[2]};
}

// Below autograd (nothing records): lstm_forward's outputs without what it saves for backward.
std::tuple<Tensor, Tensor, Tensor> lstm_layer_outputs(const Tensor& x, const Tensor& batch_sizes, const Tensor& h0,
                                                      const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                                                      const OptionalTensor& b_ih, const OptionalTensor& b_hh,
                                                      const OptionalTensor& w_hr, bool reverse) {
  check_layer_rows(x, h0, c0);
  const auto [y, h_n, c_n, gates, cells] =
      dispatched_forward(x.contiguous(), batch_sizes, h0.contiguous(), c0.contiguous(), w_ih.contiguous(),
                         w_hh.contiguous(), contiguous_if_given(b_ih), contiguous_if_given(b_hh),
                         contiguous_if_given(w_hr), reverse, /*training=*/false);
  return {y, h_n, c_n};
}

std::tuple<Tensor, Tensor, Tensor> lstm_padded_autograd(const Tensor& input, const OptionalTensor& h0,
                                                        const OptionalTensor& c0, const Tensor& w_ih,
                                                        const Tensor& w_hh, const OptionalTensor& b_ih,
                                                        const OptionalTensor& b_hh, bool batch_first, bool reverse) {
  TORCH_CHECK(input.defined() && input.dim() == 3, "seqkernels.lstm_padded: input must be 3-D [T, B, I], got ",
              std::to_string(input.defined() ? input.dim() : 0), "-D");
  // A batch-first or otherwise non-contiguous input is copied time-major here, where autograd
  // records the copy (as lstm_layer's path's reshape), so that the node saves the copy and not
  // the caller's tensor.
  Tensor seq = batch_first ? input.transpose(0, 1) : input;
  if (!seq.is_contiguous()) seq = seq.contiguous();
  const variable_list out = LstmPaddedFunction::apply(seq, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first, reverse);
  return {out[0], out[1], out[2]};
}

// Below autograd (nothing records): the outputs alone, nothing saved.
std::tuple<Tensor, Tensor, Tensor> lstm_padded_outputs(const Tensor& input, const OptionalTensor& h0,
                                                       const OptionalTensor& c0, const Tensor& w_ih,
                                                       const Tensor& w_hh, const OptionalTensor& b_ih,
                                                       const OptionalTensor& b_hh, bool batch_first, bool reverse) {
  return padded_forward("seqkernels.lstm_padded", input, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first, reverse,
                        &dispatched_forward);
}

std::tuple<Tensor, Tensor> lstm_cell_autograd(const Tensor& input, const OptionalTensor& h0, const OptionalTensor& c0,
                                              const Tensor& w_ih, const Tensor& w_hh, const OptionalTensor& b_ih,
                                              const OptionalTensor& b_hh) {
  // A non-contiguous input is copied here, where autograd records the copy, so that the node saves
  // the copy (the op reads rows). cell_forward checks the arguments.
  const Tensor rows = input.is_contiguous() ? input : input.contiguous();
  const variable_list out = LstmCellFunction::apply(rows, h0, c0, w_ih, w_hh, b_ih, b_hh);
  return {out[0], out[1]};
}

// Below autograd (nothing records): h and c alone, nothing saved.
std::tuple<Tensor, Tensor> lstm_cell_outputs(const Tensor& input, const OptionalTensor& h0, const OptionalTensor& c0,
                                             const Tensor& w_ih, const Tensor& w_hh, const OptionalTensor& b_ih,
                                             const OptionalTensor& b_hh) {
  const auto [y, h_n, c_n, gates, cells] =
      cell_forward(input, h0, c0, w_ih, w_hh, b_ih, b_hh, /*training=*/false).out;
  return {h_n, c_n};
}

}  // namespace
}  // namespace seqkernels

TORCH_LIBRARY_IMPL(seqkernels, Autograd, m) {
  m.impl("lstm_layer", &seqkernels::lstm_layer_autograd);
  m.impl("lstm_padded", &seqkernels::lstm_padded_autograd);
  m.impl("lstm_cell", &seqkernels::lstm_cell_autograd);
}

TORCH_LIBRARY_IMPL(seqkernels, CompositeExplicitAutograd, m) {
  m.impl("lstm_layer", &seqkernels::lstm_layer_outputs);
  m.impl("lstm_padded", &seqkernels::lstm_padded_outputs);
  m.impl("lstm_cell", &seqkernels::lstm_cell_outputs);
}
