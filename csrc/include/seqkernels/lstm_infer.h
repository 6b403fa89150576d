// seqkernels.LSTM's common call (one layer and direction of a stack without projection, a padded
// [T, B, I] sequence) as one operator: lstm_infer (inference only; each backend registers it with its own
// lstm_forward, no second dispatch) and lstm_padded (the same call where autograd records it; one
// C++ autograd node, csrc/lstm_recorded.cpp). The argument handling is shared.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <tuple>

namespace seqkernels {

// A backend's lstm_forward (its schema in csrc/registration.cpp).
using LstmForwardFn = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> (*)(
    const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& h0, const at::Tensor& c0,
    const at::Tensor& w_ih, const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const std::optional<at::Tensor>& w_hr, bool reverse, bool training);

// A padded call's lstm_forward arguments, checked: input [T, B, I] ([B, T, I] batch_first), h0 / c0
// [1, B, H] or both None (zeros), w_hh [G, H]; lstm_forward checks the rest.
struct PaddedCall {
  at::Tensor seq;          // [T, B, I]: the input time-major (a view; contiguous only if the input is)
  at::Tensor h0, c0;       // [B, H]: the given state's rows (contiguous), or zeros from one allocation
  at::Tensor batch_sizes;  // [T] int64 on the CPU, all B
  int64_t T, B, I, H;
};
// `op` names the operator in messages ("seqkernels.lstm_infer").
PaddedCall padded_call(const char* op, const at::Tensor& input, const std::optional<at::Tensor>& h0,
                       const std::optional<at::Tensor>& c0, const at::Tensor& w_hh, bool batch_first);

// t.contiguous() where t is given.
std::optional<at::Tensor> contiguous_if_given(const std::optional<at::Tensor>& t);

// The padded call's outputs (output, h_n, c_n: nn.LSTM's) from one lstm_forward call through
// `forward`, training = false; reverse runs from the last step to the first. `op` names the
// operator in messages.
std::tuple<at::Tensor, at::Tensor, at::Tensor> padded_forward(const char* op, const at::Tensor& input,
                                                              const std::optional<at::Tensor>& h0,
                                                              const std::optional<at::Tensor>& c0,
                                                              const at::Tensor& w_ih, const at::Tensor& w_hh,
                                                              const std::optional<at::Tensor>& b_ih,
                                                              const std::optional<at::Tensor>& b_hh, bool batch_first,
                                                              bool reverse, LstmForwardFn forward);

// lstm_infer (csrc/registration.cpp): padded_forward where autograd records nothing (else it raises).
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_infer(const at::Tensor& input, const std::optional<at::Tensor>& h0,
                                                          const std::optional<at::Tensor>& c0, const at::Tensor& w_ih,
                                                          const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
                                                          const std::optional<at::Tensor>& b_hh, bool batch_first,
                                                          bool reverse, LstmForwardFn forward);

}  // namespace seqkernels
