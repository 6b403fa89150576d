// Validation of convlstm_forward / convlstm_backward arguments, shared by every backend.
// Every failure raises RuntimeError (issue 6: bad input raises ValueError or RuntimeError);
// nothing is read from device memory.
#include "seqkernels/convlstm_checks.h"

#include <c10/util/Exception.h>

#include "seqkernels/error_format.h"
#include "seqkernels/tensor_checks.h"

namespace seqkernels {
namespace {

constexpr const char* kOp = "seqkernels.convlstm";

bool present(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// x, the two weights and the optional peephole weights: every size of the call.
ConvLstmSizes check_common(const at::Tensor& x, const at::Tensor& w_ih, const at::Tensor& w_hh,
                           const std::optional<at::Tensor>& peephole) {
  ConvLstmSizes s;
  TORCH_CHECK(x.defined() && x.dim() == 5, kOp, ": x must be 5-D [T, B, Ci, H, W], got ",
              num(x.defined() ? x.dim() : 0), "-D");
  TORCH_CHECK(is_floating_dtype(x.scalar_type()), kOp, ": x must be float32, float64, bfloat16 or float16, got ",
              x.scalar_type());
  s.T = x.size(0);
  s.B = x.size(1);
  s.Ci = x.size(2);
  s.H = x.size(3);
  s.W = x.size(4);
  TORCH_CHECK(s.T >= 1 && s.B >= 1 && s.Ci >= 1 && s.H >= 1 && s.W >= 1, kOp,
              ": x must have T, B, Ci, H, W >= 1, got ", shape(x.sizes()));
  // Any T and B strides (a batch-first input transposed to time-major is read in place), but
  // every frame x[t, b] one contiguous [Ci, H, W] block.
  TORCH_CHECK((s.W == 1 || x.stride(4) == 1) && (s.H == 1 || x.stride(3) == s.W) &&
                  (s.Ci == 1 || x.stride(2) == s.H * s.W) && x.stride(0) >= 0 && x.stride(1) >= 0,
              kOp, ": every frame x[t, b] ([Ci, H, W]) must be contiguous, got strides ", shape(x.strides()));

  TORCH_CHECK(w_hh.defined() && w_hh.dim() == 4, kOp, ": w_hh must be 4-D [G, C, KH, KW], got ",
              num(w_hh.defined() ? w_hh.dim() : 0), "-D");
  s.G = w_hh.size(0);
  s.C = w_hh.size(1);
  s.KH = w_hh.size(2);
  s.KW = w_hh.size(3);
  TORCH_CHECK(s.C >= 1 && s.G == 4 * s.C, kOp, ": w_hh must be [4C, C, KH, KW] with C >= 1, got ",
              shape(w_hh.sizes()));
  TORCH_CHECK(s.KH >= 1 && s.KW >= 1 && s.KH % 2 == 1 && s.KW % 2 == 1, kOp,
              ": kernel sizes must be odd ('same' padding), got ", num(s.KH), " x ", num(s.KW));
  check_tensor_like(kOp, x, "x", w_hh, "w_hh", {s.G, s.C, s.KH, s.KW});
  check_tensor_like(kOp, x, "x", w_ih, "w_ih", {s.G, s.Ci, s.KH, s.KW});
  s.has_peephole = present(peephole);
  if (s.has_peephole) check_tensor_like(kOp, x, "x", *peephole, "peephole", {3, s.C, s.H, s.W});
  return s;
}

void check_state(const ConvLstmSizes& s, const at::Tensor& x, const at::Tensor& t, const char* name,
                 bool contiguous = true) {
  check_tensor_like(kOp, x, "x", t, name, {s.B, s.C, s.H, s.W}, contiguous);
}

}  // namespace

ConvLstmSizes check_convlstm_forward(const at::Tensor& x, const at::Tensor& h0, const at::Tensor& c0,
                                     const at::Tensor& w_ih, const at::Tensor& w_hh,
                                     const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& peephole) {
  ConvLstmSizes s = check_common(x, w_ih, w_hh, peephole);
  check_state(s, x, h0, "h0");
  check_state(s, x, c0, "c0");
  s.has_bias = present(bias);
  if (s.has_bias) check_tensor_like(kOp, x, "x", *bias, "bias", {s.G});
  return s;
}

ConvLstmSizes check_convlstm_backward(const std::optional<at::Tensor>& grad_y, const std::optional<at::Tensor>& grad_h_n,
                                      const std::optional<at::Tensor>& grad_c_n, const at::Tensor& x,
                                      const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& w_ih,
                                      const at::Tensor& w_hh, const std::optional<at::Tensor>& peephole,
                                      const at::Tensor& y, const at::Tensor& gates, const at::Tensor& cells,
                                      bool has_bias) {
  ConvLstmSizes s = check_common(x, w_ih, w_hh, peephole);
  s.has_bias = has_bias;
  check_state(s, x, h0, "h0");
  check_state(s, x, c0, "c0");
  check_tensor_like(kOp, x, "x", y, "y", {s.T, s.B, s.C, s.H, s.W});
  check_tensor_like(kOp, x, "x", cells, "cells (saved by a training forward)", {s.T, s.B, s.H, s.W, s.C});
  check_tensor_like(kOp, x, "x", gates, "gates (saved by a training forward)", {s.T, s.B, s.H, s.W, s.G});
  // The incoming gradients in any strides (autograd hands over expanded ones, e.g. from a sum):
  // the loop reads or converts them one step at a time, never a dense copy of grad_y.
  if (present(grad_y)) check_tensor_like(kOp, x, "x", *grad_y, "grad_y", {s.T, s.B, s.C, s.H, s.W}, false);
  if (present(grad_h_n)) check_state(s, x, *grad_h_n, "grad_h_n", false);
  if (present(grad_c_n)) check_state(s, x, *grad_c_n, "grad_c_n", false);
  return s;
}

}  // namespace seqkernels
