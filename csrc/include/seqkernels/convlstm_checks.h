// Input validation shared by the CPU and CUDA ConvLSTM operators (convlstm_forward /
// convlstm_backward, schemas in csrc/registration.cpp). Every check raises RuntimeError
// through TORCH_CHECK before any data pointer is touched.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace seqkernels {

// Sizes and flags of one convlstm_forward / convlstm_backward call.
// Shape legend: T steps, B batch, Ci input channels, C hidden channels, G = 4C gate
// channels, H x W the frame, KH x KW the (odd) kernel.
struct ConvLstmSizes {
  int64_t T = 0, B = 0, Ci = 0, C = 0, G = 0, H = 0, W = 0, KH = 0, KW = 0;
  bool has_bias = false;
  bool has_peephole = false;
};

// x [T, B, Ci, H, W], h0/c0 [B, C, H, W], w_ih [G, Ci, KH, KW], w_hh [G, C, KH, KW],
// bias [G] or None, peephole [3, C, H, W] or None; all contiguous, on one device, one dtype
// of float32/float64/bfloat16/float16; T, B >= 1; KH, KW odd.
ConvLstmSizes check_convlstm_forward(const at::Tensor& x, const at::Tensor& h0, const at::Tensor& c0,
                                     const at::Tensor& w_ih, const at::Tensor& w_hh,
                                     const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& peephole);

// The forward's arguments (bias as has_bias) plus y [T, B, C, H, W], and gates
// [T, B, H, W, G] and cells [T, B, H, W, C] (channels-last) saved by a training forward, and the output gradients (each None or the
// shape of its output).
ConvLstmSizes check_convlstm_backward(const std::optional<at::Tensor>& grad_y, const std::optional<at::Tensor>& grad_h_n,
                                      const std::optional<at::Tensor>& grad_c_n, const at::Tensor& x,
                                      const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& w_ih,
                                      const at::Tensor& w_hh, const std::optional<at::Tensor>& peephole,
                                      const at::Tensor& y, const at::Tensor& gates, const at::Tensor& cells,
                                      bool has_bias);

}  // namespace seqkernels
