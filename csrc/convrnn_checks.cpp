// Validation of convrnn_forward / convrnn_backward arguments, shared by every backend.
// Every failure, dtypes included, raises RuntimeError (issue 5: bad input raises
// ValueError or RuntimeError); nothing is read from device memory.
#include "seqkernels/convrnn_checks.h"
#include "seqkernels/error_format.h"
#include "seqkernels/tensor_checks.h"

#include <c10/util/Exception.h>

namespace seqkernels {
namespace {

constexpr const char* kOp = "seqkernels.convrnn";

void check_like(const at::Tensor& ref, const char* ref_name, const at::Tensor& t, const char* name,
                at::IntArrayRef shape, bool contiguous = true) {
  check_tensor_like(kOp, ref, ref_name, t, name, shape, contiguous);
}

// The sequence tensor (x forward, y backward) [B, T, C, N] and weight [C, C, K], plus flags.
ConvRnnSizes check_common(const at::Tensor& seq, const char* seq_name, const at::Tensor& weight,
                          int64_t padding_mode, int64_t nonlinearity) {
  ConvRnnSizes s;
  TORCH_CHECK(padding_mode == 0 || padding_mode == 1,
              "seqkernels.convrnn: padding_mode must be 0 (circular) or 1 (zeros), got ", num(padding_mode));
  TORCH_CHECK(nonlinearity == 0 || nonlinearity == 1,
              "seqkernels.convrnn: nonlinearity must be 0 (tanh) or 1 (relu), got ", num(nonlinearity));
  s.circular = padding_mode == 0;
  s.relu = nonlinearity == 1;

  TORCH_CHECK(seq.defined() && seq.dim() == 4, "seqkernels.convrnn: ", seq_name, " must be 4-D [B, T, C, N], got ",
              num(seq.defined() ? seq.dim() : 0), "-D");
  TORCH_CHECK(is_floating_dtype(seq.scalar_type()), "seqkernels.convrnn: ", seq_name,
                   " must be float32, float64, bfloat16 or float16, got ", seq.scalar_type());
  TORCH_CHECK(seq.is_contiguous(), "seqkernels.convrnn: ", seq_name, " must be contiguous");
  s.B = seq.size(0);
  s.T = seq.size(1);
  s.C = seq.size(2);
  s.N = seq.size(3);
  TORCH_CHECK(s.B >= 1 && s.T >= 1 && s.C >= 1 && s.N >= 1, "seqkernels.convrnn: ", seq_name,
              " must have B, T, C, N >= 1, got ", seqkernels::shape(seq.sizes()));

  TORCH_CHECK(weight.defined() && weight.dim() == 3, "seqkernels.convrnn: weight must be 3-D [C, C, K], got ",
              num(weight.defined() ? weight.dim() : 0), "-D");
  s.K = weight.size(2);
  TORCH_CHECK(s.K >= 1, "seqkernels.convrnn: kernel width K must be >= 1, got ", num(s.K));
  check_like(seq, seq_name, weight, "weight", {s.C, s.C, s.K});
  TORCH_CHECK(!s.circular || s.K <= s.N, "seqkernels.convrnn: circular padding needs kernel width K <= ring size N, got K = ",
              num(s.K), ", N = ", num(s.N));
  return s;
}

}  // namespace

ConvRnnSizes check_convrnn_forward(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                   const at::Tensor& h0, int64_t padding_mode, int64_t nonlinearity) {
  ConvRnnSizes s = check_common(x, "x", weight, padding_mode, nonlinearity);
  s.has_bias = bias.has_value() && bias->defined();
  if (s.has_bias) {
    check_like(x, "x", *bias, "bias", {s.C});
  }
  check_like(x, "x", h0, "h0", {s.B, s.C, s.N});
  return s;
}

ConvRnnSizes check_convrnn_backward(const at::Tensor& grad_y, const at::Tensor& grad_h_T, const at::Tensor& weight,
                                    const at::Tensor& h0, const at::Tensor& y, int64_t padding_mode,
                                    int64_t nonlinearity, bool has_bias) {
  ConvRnnSizes s = check_common(y, "y", weight, padding_mode, nonlinearity);
  s.has_bias = has_bias;
  // The incoming gradients may have any layout (e.g. expanded, stride 0, for a sum).
  check_like(y, "y", grad_y, "grad_y", {s.B, s.T, s.C, s.N}, false);
  check_like(y, "y", grad_h_T, "grad_h_T", {s.B, s.C, s.N}, false);
  check_like(y, "y", h0, "h0", {s.B, s.C, s.N});
  return s;
}

}  // namespace seqkernels
