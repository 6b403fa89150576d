// lstm_infer: the padded-input, inference-only call of seqkernels.LSTM's fast path as one
// operator. Why: on a GPU the module's Python precedes the loop's launch and adds to a small
// call's time one for one; the reshapes, views, zero state and batch sizes that the Python path
// makes around lstm_forward (a dozen tensor operations from Python) are made here in C++.
#include "seqkernels/lstm_infer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <array>

#include "seqkernels/error_format.h"

namespace seqkernels {

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_infer(const at::Tensor& input, const std::optional<at::Tensor>& h0,
                                                          const std::optional<at::Tensor>& c0, const at::Tensor& w_ih,
                                                          const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
                                                          const std::optional<at::Tensor>& b_hh, bool batch_first,
                                                          LstmForwardFn forward) {
  // Shape legend (csrc/registration.cpp): input [T, B, I] ([B, T, I] batch_first), h0 / c0
  // [1, B, H] or both None (zeros), w_ih [G, I], w_hh [G, H]. lstm_forward checks the rest.
  TORCH_CHECK(input.defined() && input.dim() == 3, "seqkernels.lstm_infer: input must be 3-D [T, B, I], got ",
              num(input.defined() ? input.dim() : 0), "-D");
  TORCH_CHECK(w_hh.defined() && w_hh.dim() == 2, "seqkernels.lstm_infer: w_hh must be 2-D [4H, H]");
  TORCH_CHECK(h0.has_value() == c0.has_value(), "seqkernels.lstm_infer: give both h0 and c0, or neither");
  // No autograd formula: where autograd would record the call, raise instead of dropping gradients.
  const auto records = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); };
  TORCH_CHECK(!c10::GradMode::is_enabled() ||
                  !(input.requires_grad() || w_ih.requires_grad() || w_hh.requires_grad() || records(h0) ||
                    records(c0) || records(b_ih) || records(b_hh)),
              "seqkernels.lstm_infer computes no gradients: call it under torch.no_grad() or on tensors that do "
              "not require grad (seqkernels.LSTM and lstm_layer record gradients)");
  const at::Tensor seq = batch_first ? input.transpose(0, 1) : input;  // [T, B, I]
  const int64_t T = seq.size(0), B = seq.size(1), I = seq.size(2), H = w_hh.size(1);
  TORCH_CHECK(T > 0 && B > 0, "seqkernels.lstm_infer: empty input ", shape(input.sizes()));
  at::Tensor h0_rows, c0_rows;  // [B, H]
  if (h0.has_value()) {
    const std::array<int64_t, 3> expected{1, B, H};
    TORCH_CHECK(h0->sizes() == expected && c0->sizes() == expected, "seqkernels.lstm_infer: h0 and c0 must have shape ",
                shape(expected), ", got ", shape(h0->sizes()), " and ", shape(c0->sizes()));
    h0_rows = (*h0)[0].contiguous();
    c0_rows = (*c0)[0].contiguous();
  } else {
    const at::Tensor zeros = at::zeros({2, B, H}, input.options());  // one allocation and fill for both
    h0_rows = zeros[0];
    c0_rows = zeros[1];
  }
  const at::Tensor batch_sizes = at::full({T}, B, at::TensorOptions().dtype(at::kLong));
  auto contiguous = [](const std::optional<at::Tensor>& t) {
    return t.has_value() ? std::optional<at::Tensor>(t->contiguous()) : std::nullopt;
  };
  const auto [y, h_n, c_n, gates, cells] =
      forward(seq.reshape({T * B, I}).contiguous(), batch_sizes, h0_rows, c0_rows, w_ih.contiguous(),
              w_hh.contiguous(), contiguous(b_ih), contiguous(b_hh), std::nullopt, /*reverse=*/false,
              /*training=*/false);
  const at::Tensor output = y.view({T, B, y.size(1)});
  return {batch_first ? output.transpose(0, 1) : output, h_n.unsqueeze(0), c_n.unsqueeze(0)};
}

}  // namespace seqkernels
