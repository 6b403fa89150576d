// The ConvLSTM time loop, written once for every backend (csrc/cpu/convlstm.cpp,
// csrc/cuda/convlstm.cu). The convolutions are ATen's (oneDNN on the CPU, cuDNN on the
// GPU); the loop and the gate math are ours:
//   forward   one convolution of all T·B input frames (w_ih * x + bias) before the loop;
//             per step the state convolution w_hh * h_{t-1} and one fused pointwise pass
//             (Backend::forward_step) that adds the two, applies the gates and peepholes,
//             writes h_t into y, c_t, and in training the activated gates.
//   backward  reverse time: per step one fused pointwise pass (Backend::backward_step)
//             giving dz_t (the gate pre-activations' gradient) and dc_{t-1} in place, then
//             the state convolution's input gradient w_hhᵀ * dz_t, which is dh_{t-1}'s
//             recurrent part. After the loop, dx, dw_ih, dbias and dw_hh are each one
//             convolution backward over all T·B frames, and the peephole gradients one
//             reduction each.
// A Backend supplies `check(x)` (the device) and the two step functions over raw pointers.
// No host synchronisation; the only allocations are ATen's (the caching allocator on the
// GPU), so the loop can be captured in a CUDA graph.
//
// Shape legend: T steps, B batch, Ci input channels, C hidden channels, G = 4C gate
// channels (i, f, g, o), H x W the frame, HW = H·W, KH x KW the kernel.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <tuple>

#include "seqkernels/convlstm_checks.h"

namespace seqkernels {

// One forward step of the fused pointwise pass. Element (b, c, p) with p < HW reads gate q
// at [b, q·C + c, p] of zx and zh.
template <class scalar_t>
struct ConvLstmForwardStep {
  const scalar_t* zx;      // [B, G, HW] w_ih * x_t + bias
  const scalar_t* zh;      // [B, G, HW] w_hh * h_{t-1}
  const scalar_t* c_prev;  // [B, C, HW] c_{t-1}
  const scalar_t* peep;    // [3, C, HW] w_ci, w_cf, w_co, or nullptr
  scalar_t* h;             // [B, C, HW] h_t (a step of y)
  scalar_t* c;             // [B, C, HW] c_t
  scalar_t* act;           // [B, G, HW] activated gates, or nullptr (inference)
  int64_t B, C, HW;
};

template <class scalar_t>
struct ConvLstmBackwardStep {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* act;     // [B, G, HW] saved activated gates of step t
  const scalar_t* c;       // [B, C, HW] c_t
  const scalar_t* c_prev;  // [B, C, HW] c_{t-1}
  const scalar_t* peep;    // [3, C, HW] or nullptr
  const scalar_t* dy;      // [B, C, HW] dL/dy_t, or nullptr (no gradient)
  const scalar_t* dh_rec;  // [B, C, HW] dL/dh_t from step t+1 (or h_n), or nullptr
  acc_t* dc;               // [B, C, HW] in: dL/dc_t from step t+1; out: dL/dc_{t-1}
  scalar_t* dz;            // [B, G, HW] dL/d(pre-activations) of step t
  int64_t B, C, HW;
};

namespace convlstm_detail {

using at::Tensor;

struct ConvGeometry {
  std::vector<int64_t> stride{1, 1}, padding, dilation{1, 1}, output_padding{0, 0};
  explicit ConvGeometry(const ConvLstmSizes& s) : padding{s.KH / 2, s.KW / 2} {}
};

inline Tensor conv(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                   const ConvGeometry& g) {
  return at::convolution(input, weight, bias, g.stride, g.padding, g.dilation, false, g.output_padding, 1)
      .contiguous();
}

// The gradients of conv(input, weight) selected by mask (input, weight, bias).
inline std::tuple<Tensor, Tensor, Tensor> conv_backward(const Tensor& grad_out, const Tensor& input,
                                                        const Tensor& weight, bool with_bias, const ConvGeometry& g,
                                                        std::array<bool, 3> mask) {
  const std::vector<int64_t> bias_sizes{weight.size(0)};
  return at::convolution_backward(grad_out, input, weight,
                                  with_bias ? at::OptionalIntArrayRef(bias_sizes) : at::OptionalIntArrayRef(),
                                  g.stride, g.padding, g.dilation, false, g.output_padding, 1, mask);
}

template <class T>
T* ptr_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->data_ptr<T>() : nullptr;
}

}  // namespace convlstm_detail

template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> convlstm_forward_loop(
    const at::Tensor& x, const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& peephole, bool training) {
  using namespace convlstm_detail;
  const ConvLstmSizes s = check_convlstm_forward(x, h0, c0, w_ih, w_hh, bias, peephole);
  Backend::check(x);
  const ConvGeometry geom(s);
  const int64_t HW = s.H * s.W;

  // [T·B, G, H, W]: the input half of every step's pre-activations, biases included.
  const Tensor zx = conv(x.view({s.T * s.B, s.Ci, s.H, s.W}), w_ih, s.has_bias ? bias : std::nullopt, geom);
  Tensor y = at::empty({s.T, s.B, s.C, s.H, s.W}, x.options());
  // Inference keeps c in two alternating buffers; training keeps every c_t for backward.
  Tensor cells = at::empty({training ? s.T : 2, s.B, s.C, s.H, s.W}, x.options());
  Tensor gates = training ? at::empty({s.T, s.B, s.G, s.H, s.W}, x.options()) : at::empty({0}, x.options());

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "convlstm_forward", [&] {
    const int64_t frame = s.B * s.C * HW;  // elements of one step's h or c
    ConvLstmForwardStep<scalar_t> step{};
    step.peep = ptr_or_null<scalar_t>(peephole);
    step.B = s.B;
    step.C = s.C;
    step.HW = HW;
    Tensor h_prev = h0;
    const scalar_t* c_prev = c0.data_ptr<scalar_t>();
    for (int64_t t = 0; t < s.T; ++t) {
      const Tensor zh = conv(h_prev, w_hh, std::nullopt, geom);
      step.zx = zx.data_ptr<scalar_t>() + t * s.B * s.G * HW;
      step.zh = zh.data_ptr<scalar_t>();
      step.c_prev = c_prev;
      step.h = y.data_ptr<scalar_t>() + t * frame;
      step.c = cells.data_ptr<scalar_t>() + (training ? t : t % 2) * frame;
      step.act = training ? gates.data_ptr<scalar_t>() + t * s.B * s.G * HW : nullptr;
      Backend::forward_step(step);
      h_prev = y.select(0, t);
      c_prev = step.c;
    }
  });
  Tensor h_n = y.select(0, s.T - 1).clone();
  Tensor c_n = cells.select(0, training ? s.T - 1 : (s.T - 1) % 2).clone();
  if (!training) cells = at::empty({0}, x.options());
  return {y, h_n, c_n, gates, cells};
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> convlstm_backward_loop(
    const std::optional<at::Tensor>& grad_y, const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n, const at::Tensor& x, const at::Tensor& h0, const at::Tensor& c0,
    const at::Tensor& w_ih, const at::Tensor& w_hh, const std::optional<at::Tensor>& peephole, const at::Tensor& y,
    const at::Tensor& gates, const at::Tensor& cells, bool has_bias) {
  using namespace convlstm_detail;
  const ConvLstmSizes s = check_convlstm_backward(grad_y, grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, peephole, y,
                                                  gates, cells, has_bias);
  Backend::check(x);
  const ConvGeometry geom(s);
  const int64_t HW = s.H * s.W;
  const at::ScalarType acc_dtype = at::toOpMathType(x.scalar_type());

  Tensor dz = at::empty({s.T, s.B, s.G, s.H, s.W}, x.options());
  // dL/dc is carried in the accumulation type: it sums over the whole remaining sequence.
  Tensor dc = grad_c_n.has_value() && grad_c_n->defined() ? grad_c_n->to(acc_dtype, /*non_blocking=*/false, /*copy=*/true)
                                                          : at::zeros({s.B, s.C, s.H, s.W}, x.options().dtype(acc_dtype));
  Tensor dh_rec = grad_h_n.has_value() && grad_h_n->defined() ? *grad_h_n : Tensor();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "convlstm_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const int64_t frame = s.B * s.C * HW;
    ConvLstmBackwardStep<scalar_t> step{};
    step.peep = ptr_or_null<scalar_t>(peephole);
    step.dc = dc.data_ptr<acc_t>();
    step.B = s.B;
    step.C = s.C;
    step.HW = HW;
    const scalar_t* dy = ptr_or_null<scalar_t>(grad_y);
    for (int64_t t = s.T - 1; t >= 0; --t) {
      step.act = gates.data_ptr<scalar_t>() + t * s.B * s.G * HW;
      step.c = cells.data_ptr<scalar_t>() + t * frame;
      step.c_prev = t > 0 ? cells.data_ptr<scalar_t>() + (t - 1) * frame : c0.data_ptr<scalar_t>();
      step.dy = dy ? dy + t * frame : nullptr;
      step.dh_rec = dh_rec.defined() ? dh_rec.data_ptr<scalar_t>() : nullptr;
      step.dz = dz.data_ptr<scalar_t>() + t * s.B * s.G * HW;
      Backend::backward_step(step);
      // dL/dh_{t-1} through the state convolution (h0 stands in for h_{t-1}: same shape).
      dh_rec = std::get<0>(conv_backward(dz.select(0, t), h0, w_hh, false, geom, {true, false, false})).contiguous();
    }
  });

  const Tensor dz_frames = dz.view({s.T * s.B, s.G, s.H, s.W});
  // h_{t-1} and c_{t-1} for every step.
  const Tensor h_prev = at::cat({h0.unsqueeze(0), y.narrow(0, 0, s.T - 1)}).view({s.T * s.B, s.C, s.H, s.W});
  Tensor grad_w_hh = std::get<1>(conv_backward(dz_frames, h_prev, w_hh, false, geom, {false, true, false}));
  auto [grad_x, grad_w_ih, grad_bias] = conv_backward(dz_frames, x.view({s.T * s.B, s.Ci, s.H, s.W}), w_ih, has_bias,
                                                      geom, {true, true, has_bias});
  grad_x = grad_x.view({s.T, s.B, s.Ci, s.H, s.W});
  if (!has_bias) grad_bias = at::empty({0}, x.options());

  Tensor grad_peephole = at::empty({0}, x.options());
  if (s.has_peephole) {
    const Tensor dz_gates = dz.view({s.T, s.B, 4, s.C, s.H, s.W}).to(acc_dtype);
    const Tensor c_prev = at::cat({c0.unsqueeze(0), cells.narrow(0, 0, s.T - 1)}).to(acc_dtype);
    const Tensor c_t = cells.to(acc_dtype);
    const std::vector<int64_t> over_time_and_batch{0, 1};
    grad_peephole = at::stack({(dz_gates.select(2, 0) * c_prev).sum(over_time_and_batch),
                               (dz_gates.select(2, 1) * c_prev).sum(over_time_and_batch),
                               (dz_gates.select(2, 3) * c_t).sum(over_time_and_batch)})
                        .to(x.scalar_type());
  }
  return {grad_x, dh_rec, dc.to(x.scalar_type()), grad_w_ih, grad_w_hh, grad_bias, grad_peephole};
}

}  // namespace seqkernels
