// lstm_infer: the padded-input, inference-only call of seqkernels.LSTM's fast path as one
// operator. Why: on a GPU the module's Python precedes the loop's launch and adds to a small
// call's time one for one; the reshapes, views, zero state and batch sizes that the Python path
// makes around lstm_forward (a dozen tensor operations from Python) are made here in C++.
#include "seqkernels/lstm_infer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <array>
#include <string>

#include "seqkernels/error_format.h"

namespace seqkernels {

PaddedCall padded_call(const char* op, const at::Tensor& input, const std::optional<at::Tensor>& h0,
                       const std::optional<at::Tensor>& c0, const at::Tensor& w_hh, bool batch_first) {
  // Shape legend (csrc/registration.cpp): input [T, B, I] ([B, T, I] batch_first), h0 / c0
  // [1, B, H] or both None (zeros), w_ih [G, I], w_hh [G, H]. lstm_forward checks the rest.
  const std::string name = op;
  TORCH_CHECK(input.defined() && input.dim() == 3, name, ": input must be 3-D [T, B, I], got ",
              num(input.defined() ? input.dim() : 0), "-D");
  TORCH_CHECK(w_hh.defined() && w_hh.dim() == 2, name, ": w_hh must be 2-D [4H, H]");
  TORCH_CHECK(h0.has_value() == c0.has_value(), name, ": give both h0 and c0, or neither");
  PaddedCall call;
  call.seq = batch_first ? input.transpose(0, 1) : input;  // [T, B, I]
  call.T = call.seq.size(0);
  call.B = call.seq.size(1);
  call.I = call.seq.size(2);
  call.H = w_hh.size(1);
  TORCH_CHECK(call.T > 0 && call.B > 0, name, ": empty input ", shape(input.sizes()));
  if (h0.has_value()) {
    const std::array<int64_t, 3> expected{1, call.B, call.H};
    TORCH_CHECK(h0->sizes() == expected && c0->sizes() == expected, name, ": h0 and c0 must have shape ",
                shape(expected), ", got ", shape(h0->sizes()), " and ", shape(c0->sizes()));
    call.h0 = (*h0)[0].contiguous();
    call.c0 = (*c0)[0].contiguous();
  } else {
    const at::Tensor zeros = at::zeros({2, call.B, call.H}, input.options());  // one allocation and fill for both
    call.h0 = zeros[0];
    call.c0 = zeros[1];
  }
  call.batch_sizes = at::full({call.T}, call.B, at::TensorOptions().dtype(at::kLong));
  return call;
}

std::optional<at::Tensor> contiguous_if_given(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(t->contiguous()) : std::nullopt;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> padded_forward(const char* op, const at::Tensor& input,
                                                              const std::optional<at::Tensor>& h0,
                                                              const std::optional<at::Tensor>& c0,
                                                              const at::Tensor& w_ih, const at::Tensor& w_hh,
                                                              const std::optional<at::Tensor>& b_ih,
                                                              const std::optional<at::Tensor>& b_hh, bool batch_first,
                                                              bool reverse, LstmForwardFn forward) {
  const PaddedCall call = padded_call(op, input, h0, c0, w_hh, batch_first);
  const auto [y, h_n, c_n, gates, cells] =
      forward(call.seq.reshape({call.T * call.B, call.I}).contiguous(), call.batch_sizes, call.h0, call.c0,
              w_ih.contiguous(), w_hh.contiguous(), contiguous_if_given(b_ih), contiguous_if_given(b_hh), std::nullopt,
              reverse, /*training=*/false);
  const at::Tensor output = y.view({call.T, call.B, y.size(1)});
  return {batch_first ? output.transpose(0, 1) : output, h_n.unsqueeze(0), c_n.unsqueeze(0)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_infer(const at::Tensor& input, const std::optional<at::Tensor>& h0,
                                                          const std::optional<at::Tensor>& c0, const at::Tensor& w_ih,
                                                          const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
                                                          const std::optional<at::Tensor>& b_hh, bool batch_first,
                                                          bool reverse, LstmForwardFn forward) {
  // No autograd formula: where autograd would record the call, raise instead of dropping gradients.
  const auto records = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); };
  TORCH_CHECK(!c10::GradMode::is_enabled() ||
                  !(input.requires_grad() || w_ih.requires_grad() || w_hh.requires_grad() || records(h0) ||
                    records(c0) || records(b_ih) || records(b_hh)),
              "seqkernels.lstm_infer computes no gradients: call it under torch.no_grad() or on tensors that do "
              "not require grad (seqkernels.LSTM and lstm_layer record gradients)");
  return padded_forward("seqkernels.lstm_infer", input, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first, reverse,
                        forward);
}

}  // namespace seqkernels
