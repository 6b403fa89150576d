// lstm_infer: one layer, one direction, a padded [T, B, I] sequence, inference only: the
// module's common call in one operator (seqkernels.LSTM's fast path). The argument handling
// is shared; each backend registers it with its own lstm_forward (no second dispatch).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <tuple>

namespace seqkernels {

// A backend's lstm_forward (its schema in csrc/registration.cpp).
using LstmForwardFn = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> (*)(
    const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& h0, const at::Tensor& c0,
    const at::Tensor& w_ih, const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const std::optional<at::Tensor>& w_hr, bool reverse, bool training);

// lstm_infer's arguments (csrc/registration.cpp) run through `forward` as one lstm_forward call
// with equal batch sizes, training = false.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_infer(const at::Tensor& input, const std::optional<at::Tensor>& h0,
                                                          const std::optional<at::Tensor>& c0, const at::Tensor& w_ih,
                                                          const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
                                                          const std::optional<at::Tensor>& b_hh, bool batch_first,
                                                          LstmForwardFn forward);

}  // namespace seqkernels
