// Validation of lstm_forward / lstm_backward arguments, shared by every backend.
// Shapes and sizes raise RuntimeError, dtypes TypeError; nothing is read from device memory.
#include "seqkernels/lstm_checks.h"

#include <c10/util/Exception.h>

#include "seqkernels/error_format.h"

namespace seqkernels {
namespace {

bool is_floating(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// Same device and dtype as x, contiguous, and exactly the expected shape.
void check_like_x(const at::Tensor& x, const at::Tensor& t, const char* name, at::IntArrayRef shape) {
  TORCH_CHECK(t.defined(), "seqkernels.lstm: ", name, " is undefined");
  TORCH_CHECK(t.device() == x.device(), "seqkernels.lstm: ", name, " is on ", t.device(), " but x is on ", x.device());
  TORCH_CHECK_TYPE(t.scalar_type() == x.scalar_type(), "seqkernels.lstm: ", name, " has dtype ", t.scalar_type(),
                   " but x has dtype ", x.scalar_type());
  TORCH_CHECK(t.sizes() == shape, "seqkernels.lstm: ", name, " must have shape ", seqkernels::shape(shape), ", got ",
              seqkernels::shape(t.sizes()));
  TORCH_CHECK(t.is_contiguous(), "seqkernels.lstm: ", name, " must be contiguous");
}

LstmSizes check_common(const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& h0,
                       const at::Tensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                       const std::optional<at::Tensor>& w_hr) {
  LstmSizes s;
  TORCH_CHECK(x.defined() && x.dim() == 2, "seqkernels.lstm: x must be 2-D [N, I] packed rows, got ",
              num(x.defined() ? x.dim() : 0), "-D");
  TORCH_CHECK_TYPE(is_floating(x.scalar_type()),
                   "seqkernels.lstm: x must be float32, float64, bfloat16 or float16, got ", x.scalar_type());
  TORCH_CHECK(x.is_contiguous(), "seqkernels.lstm: x must be contiguous");
  s.N = x.size(0);
  s.I = x.size(1);
  TORCH_CHECK(s.N > 0, "seqkernels.lstm: empty input (no rows)");
  TORCH_CHECK(s.I > 0, "seqkernels.lstm: input_size must be positive");

  TORCH_CHECK(batch_sizes.defined() && batch_sizes.dim() == 1, "seqkernels.lstm: batch_sizes must be 1-D [T]");
  TORCH_CHECK(batch_sizes.device().is_cpu(), "seqkernels.lstm: batch_sizes must be on the CPU, got ",
              batch_sizes.device());
  TORCH_CHECK_TYPE(batch_sizes.scalar_type() == at::kLong, "seqkernels.lstm: batch_sizes must be int64, got ",
                   batch_sizes.scalar_type());
  s.T = batch_sizes.size(0);
  TORCH_CHECK(s.T > 0, "seqkernels.lstm: batch_sizes is empty (no time steps)");
  const auto bs = batch_sizes.contiguous();
  const int64_t* bs_ptr = bs.data_ptr<int64_t>();
  s.batch_sizes.assign(bs_ptr, bs_ptr + s.T);
  s.offsets.resize(s.T + 1);
  s.offsets[0] = 0;
  for (int64_t t = 0; t < s.T; ++t) {
    const int64_t b = s.batch_sizes[t];
    TORCH_CHECK(b > 0, "seqkernels.lstm: batch_sizes[", num(t), "] = ", num(b), " must be positive (empty batch)");
    TORCH_CHECK(t == 0 || b <= s.batch_sizes[t - 1], "seqkernels.lstm: batch_sizes must be non-increasing, got ",
                num(t == 0 ? 0 : s.batch_sizes[t - 1]), " then ", num(b), " at step ", num(t));
    s.offsets[t + 1] = s.offsets[t] + b;
  }
  TORCH_CHECK(s.offsets[s.T] == s.N, "seqkernels.lstm: batch_sizes sum to ", num(s.offsets[s.T]), " but x has ", num(s.N),
              " rows");
  s.B = s.batch_sizes[0];

  TORCH_CHECK(w_ih.defined() && w_ih.dim() == 2, "seqkernels.lstm: w_ih must be 2-D [4H, I]");
  s.G = w_ih.size(0);
  TORCH_CHECK(s.G > 0 && s.G % 4 == 0, "seqkernels.lstm: w_ih has ", num(s.G), " rows, expected 4 * hidden_size");
  s.H = s.G / 4;
  check_like_x(x, w_ih, "w_ih", {s.G, s.I});
  if (w_hr.has_value() && w_hr->defined()) {
    TORCH_CHECK(w_hr->dim() == 2, "seqkernels.lstm: w_hr must be 2-D [P, H]");
    s.P = w_hr->size(0);
    TORCH_CHECK(s.P > 0, "seqkernels.lstm: proj_size must be positive");
    check_like_x(x, *w_hr, "w_hr", {s.P, s.H});
  }
  s.Hout = s.P > 0 ? s.P : s.H;
  check_like_x(x, w_hh, "w_hh", {s.G, s.Hout});
  check_like_x(x, h0, "h0", {s.B, s.Hout});
  check_like_x(x, c0, "c0", {s.B, s.H});
  return s;
}

}  // namespace

LstmSizes check_lstm_forward(const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& h0,
                             const at::Tensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                             const std::optional<at::Tensor>& b_ih, const std::optional<at::Tensor>& b_hh,
                             const std::optional<at::Tensor>& w_hr) {
  LstmSizes s = check_common(x, batch_sizes, h0, c0, w_ih, w_hh, w_hr);
  const bool has_ih = b_ih.has_value() && b_ih->defined();
  const bool has_hh = b_hh.has_value() && b_hh->defined();
  TORCH_CHECK(has_ih == has_hh, "seqkernels.lstm: give both biases (b_ih and b_hh) or neither");
  s.has_bias = has_ih;
  if (s.has_bias) {
    check_like_x(x, *b_ih, "b_ih", {s.G});
    check_like_x(x, *b_hh, "b_hh", {s.G});
  }
  return s;
}

LstmSizes check_lstm_backward(const at::Tensor& grad_y, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
                              const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& h0,
                              const at::Tensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                              const std::optional<at::Tensor>& w_hr, const at::Tensor& y, const at::Tensor& gates,
                              const at::Tensor& cells, bool has_bias) {
  LstmSizes s = check_common(x, batch_sizes, h0, c0, w_ih, w_hh, w_hr);
  s.has_bias = has_bias;
  check_like_x(x, y, "y", {s.N, s.Hout});
  TORCH_CHECK(gates.defined() && gates.size(0) == s.N,
              "seqkernels.lstm_backward: gates were not saved; run lstm_forward with training=True");
  check_like_x(x, gates, "gates", {s.N, s.G});
  check_like_x(x, cells, "cells", {s.N, s.H});
  check_like_x(x, grad_y, "grad_y", {s.N, s.Hout});
  check_like_x(x, grad_h_n, "grad_h_n", {s.B, s.Hout});
  check_like_x(x, grad_c_n, "grad_c_n", {s.B, s.H});
  return s;
}

}  // namespace seqkernels
