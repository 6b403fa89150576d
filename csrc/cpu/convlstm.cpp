// The ConvLSTM on the CPU: convlstm_forward / convlstm_backward (schemas in
// csrc/registration.cpp, checks in csrc/convlstm_checks.cpp, the time loop in
// seqkernels/convlstm_loop.h). This file is the fused pointwise pass of a step: one sweep
// over the channels-last [B, P, C] elements that reads the four gates of each element from
// the two convolutions' outputs, applies the cell of seqkernels/convlstm_cell.h and writes
// h, c, y and the saved gates (backward: dz and dc). Pixels are split over threads; the inner
// loop over a pixel's C contiguous channels vectorises (float32 through FastFloatMath).
//
// Shape legend: B batch, P = H·W pixels, C hidden channels, G = 4C.
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <string>
#include <torch/library.h>

#include "cpu_checks.h"
#include "seqkernels/convlstm_cell.h"
#include "seqkernels/convlstm_loop.h"
#include "vec_math.h"
#include "winograd.h"

namespace seqkernels::cpu {
namespace {

using at::Tensor;

// Pixels per parallel chunk: at least ~16k elements of work each.
int64_t pixel_grain(int64_t C) { return std::max<int64_t>(1, (int64_t(1) << 14) / C); }

// The C channels of one pixel. GCC vectorises the loop over c only when the pointers are
// __restrict function parameters (restrict locals loaded from the step struct are ignored).
//   z: [G] of the pixel; add: [G] added to it when kAdd (training: the pixel's w_hh * h_{t-1};
//   inference: the bias); in training z is overwritten by the activated gates, each element
//   read, then written, through this one pointer; c_prev, h, c_out: [C]; peep:
//   [3, P, C] at the pixel (stride PC between the three weights), unused without peepholes.
template <bool kPeephole, bool kTraining, bool kAdd, class scalar_t>
void forward_channels(scalar_t* __restrict z, const scalar_t* __restrict add, const scalar_t* __restrict c_prev,
                      const scalar_t* __restrict peep, int64_t PC, scalar_t* __restrict h,
                      scalar_t* __restrict c_out, int64_t C) {
  using acc_t = at::opmath_type<scalar_t>;
  using Math = typename CpuMath<acc_t>::type;
  for (int64_t c = 0; c < C; ++c) {
    LstmGates<acc_t> pre{acc_t(z[c]), acc_t(z[C + c]), acc_t(z[2 * C + c]), acc_t(z[3 * C + c])};
    if constexpr (kAdd) {
      pre.i += acc_t(add[c]);
      pre.f += acc_t(add[C + c]);
      pre.g += acc_t(add[2 * C + c]);
      pre.o += acc_t(add[3 * C + c]);
    }
    Peephole<acc_t> w{};
    if constexpr (kPeephole) w = {acc_t(peep[c]), acc_t(peep[PC + c]), acc_t(peep[2 * PC + c])};
    LstmGates<acc_t> act;
    acc_t c_t, h_t;
    convlstm_cell_forward<kPeephole, Math>(pre, acc_t(c_prev[c]), w, act, c_t, h_t);
    h[c] = scalar_t(h_t);
    c_out[c] = scalar_t(c_t);
    if constexpr (kTraining) {
      z[c] = scalar_t(act.i);
      z[C + c] = scalar_t(act.f);
      z[2 * C + c] = scalar_t(act.g);
      z[3 * C + c] = scalar_t(act.o);
    }
  }
}

// Pixels per run of the transpositions between channels-last and the output's layout: a
// channel's run of 16 pixels is one 64-byte line of y_t (float32). Pixel by pixel, a pixel's C
// channels lie P apart there; at P = 4096 that is 16 KB, so all of them fell into one L1 set
// and every element written (y_t) or read (x_{t+1}) missed: the pass took as long as the
// step's convolution (AMD EPYC, B = 4, 64 x 64, C = 64: 17% of an inference call in perf).
constexpr int64_t kTransposeRun = 16;

template <bool kPeephole, bool kTraining, bool kAdd, class scalar_t>
void forward_pixels(const ConvLstmForwardStep<scalar_t>& s) {
  const int64_t C = s.C, G = 4 * s.C, P = s.P, PC = P * C, Ci = s.Ci, h_stride = s.h_stride;
  at::parallel_for(0, s.B * P, pixel_grain(C), [&](int64_t begin, int64_t end) {
    // Runs of at most kTransposeRun pixels of one frame.
    for (int64_t first = begin; first < end;) {
      const int64_t b = first / P, p0 = first - b * P;
      const int64_t run = std::min({kTransposeRun, end - first, P - p0});
      for (int64_t pixel = first; pixel < first + run; ++pixel) {
        const scalar_t* add = kTraining ? s.zh + pixel * G : s.bias;
        forward_channels<kPeephole, kTraining, kAdd>(s.z + pixel * G, add, s.c_prev + pixel * C,
                                                     kPeephole ? s.peep + (pixel % P) * C : nullptr, PC,
                                                     s.h + pixel * h_stride, s.c + pixel * C, C);
      }
      // y_t in the output's layout, [C, P] of frame b: each channel's run contiguous.
      const scalar_t* h = s.h + first * h_stride;
      scalar_t* y = s.y + b * PC + p0;
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t k = 0; k < run; ++k) y[c * P + k] = h[k * h_stride + c];
      }
      if (s.x_next) {  // inference: x_{t+1} ([Ci, P] of frame b) next to h_t, the next convolution's input
        const scalar_t* x = s.x_next + b * s.x_stride_b + p0;
        scalar_t* slot = s.x_slot + first * h_stride;
        for (int64_t ci = 0; ci < Ci; ++ci) {
          for (int64_t k = 0; k < run; ++k) slot[k * h_stride + ci] = x[ci * P + k];
        }
      }
      first += run;
    }
  });
}

// The C channels of one pixel in backward (see forward_channels).
//   act, dz: [G]; c, c_prev, dy, dh_rec, dc: [C]; dy and dh_rec are read only when kDy /
//   kDhRec (template flags, so that no branch stops the loop from vectorising).
template <bool kPeephole, bool kDy, bool kDhRec, class scalar_t, class acc_t>
void backward_channels(const scalar_t* __restrict act_in, const scalar_t* __restrict c_t,
                       const scalar_t* __restrict c_prev, const scalar_t* __restrict peep, int64_t PC,
                       const scalar_t* __restrict dy, const scalar_t* __restrict dh_rec, acc_t* __restrict dc,
                       scalar_t* __restrict dz, int64_t C) {
  using Math = typename CpuMath<acc_t>::type;
  for (int64_t c = 0; c < C; ++c) {
    const LstmGates<acc_t> act{acc_t(act_in[c]), acc_t(act_in[C + c]), acc_t(act_in[2 * C + c]),
                               acc_t(act_in[3 * C + c])};
    Peephole<acc_t> w{};
    if constexpr (kPeephole) w = {acc_t(peep[c]), acc_t(peep[PC + c]), acc_t(peep[2 * PC + c])};
    acc_t dh(0);
    if constexpr (kDy) dh += acc_t(dy[c]);
    if constexpr (kDhRec) dh += acc_t(dh_rec[c]);
    LstmGates<acc_t> dpre;
    acc_t dc_prev;
    convlstm_cell_backward<kPeephole, Math>(act, acc_t(c_t[c]), acc_t(c_prev[c]), w, dh, dc[c], dpre, dc_prev);
    dc[c] = dc_prev;
    dz[c] = scalar_t(dpre.i);
    dz[C + c] = scalar_t(dpre.f);
    dz[2 * C + c] = scalar_t(dpre.g);
    dz[3 * C + c] = scalar_t(dpre.o);
  }
}

template <bool kPeephole, bool kDy, bool kDhRec, class scalar_t>
void backward_pixels(const ConvLstmBackwardStep<scalar_t>& s) {
  const int64_t C = s.C, G = 4 * s.C, PC = s.P * s.C;
  at::parallel_for(0, s.B * s.P, pixel_grain(C), [&](int64_t begin, int64_t end) {
    for (int64_t pixel = begin; pixel < end; ++pixel) {
      const int64_t state = pixel * C;
      backward_channels<kPeephole, kDy, kDhRec>(s.act + pixel * G, s.c + state, s.c_prev + state,
                                                kPeephole ? s.peep + (pixel % s.P) * C : nullptr, PC,
                                                kDy ? s.dy + state : nullptr, kDhRec ? s.dh_rec + state : nullptr,
                                                s.dc + state, s.dz + pixel * G, C);
    }
  });
}

template <bool kPeephole, class scalar_t>
void backward_pixels_dispatch(const ConvLstmBackwardStep<scalar_t>& s) {
  if (s.dy && s.dh_rec) backward_pixels<kPeephole, true, true>(s);
  else if (s.dy) backward_pixels<kPeephole, true, false>(s);
  else if (s.dh_rec) backward_pixels<kPeephole, false, true>(s);
  else backward_pixels<kPeephole, false, false>(s);
}

template <bool kPeephole, class scalar_t>
void forward_pixels_dispatch(const ConvLstmForwardStep<scalar_t>& s) {
  if (s.training) forward_pixels<kPeephole, true, true>(s);  // adds w_hh * h_{t-1}
  else if (s.bias) forward_pixels<kPeephole, false, true>(s);  // adds the bias
  else forward_pixels<kPeephole, false, false>(s);
}

// The loop's convolutions of one weight: Winograd's (winograd.h) where WinogradConv::chosen
// says so for this weight and frame size, oneDNN's otherwise.
class CpuConvolution {
 public:
  CpuConvolution(const Tensor& weight, const convlstm_detail::ConvGeometry& g, int64_t pixels,
                 convlstm_detail::ConvUse use) {
    if (WinogradConv::chosen(weight, pixels)) winograd_.emplace(weight, use == convlstm_detail::ConvUse::kForward);
    else aten_.emplace(weight, g, pixels, use);
  }
  Tensor forward(const Tensor& input, const std::optional<Tensor>& bias) {
    return winograd_ ? winograd_->forward(input, bias) : aten_->forward(input, bias);
  }
  Tensor input_grad(const Tensor& grad_out, const Tensor& input_like) {
    return winograd_ ? winograd_->input_grad(grad_out) : aten_->input_grad(grad_out, input_like);
  }
  Tensor weight_grad(const Tensor& grad_out, const Tensor& input) {
    return winograd_ ? winograd_->weight_grad(grad_out, input) : aten_->weight_grad(grad_out, input);
  }
  std::pair<Tensor, Tensor> grads(const Tensor& grad_out, const Tensor& input) {
    if (!winograd_) return aten_->grads(grad_out, input);
    return {winograd_->input_grad(grad_out), winograd_->weight_grad(grad_out, input)};
  }

 private:
  std::optional<WinogradConv> winograd_;
  std::optional<convlstm_detail::AtenConvolution> aten_;
};

struct CpuPointwise {
  using Convolution = CpuConvolution;

  static void check(const Tensor& x) { check_cpu(x, "seqkernels.convlstm"); }

  // dL/dy_t is copied into channels-last per step: the channel loop vectorises over
  // contiguous runs.
  static constexpr bool kStridedDy = false;

  // Backward chunks: quarters of the sequence, whatever their size (no workspace to bound; the
  // larger oneDNN calls are the faster ones).
  static constexpr int64_t kChunkPixels = std::numeric_limits<int64_t>::max() / 2;

  // Inference: a step's frames convolved in groups of at most 1024 pixels (the step output then
  // at most 1024 x 4C values: 1 MB at C = 64 in float32, against 4 MB for the benchmark's first
  // shape's 16 frames of 16 x 16). One-frame groups of the second shape's 64 x 64 frames measured
  // no slower than whole steps (AMD EPYC, 2 threads, alternating processes).
  static constexpr int64_t kInferenceGroupPixels = 1024;

  // Each step's convolution is called again (nothing to save on the host: the CPU runs it), and
  // its buffers are fresh per call.
  template <class Result>
  struct StepCall {
    StepCall(int64_t /*calls*/, const std::string& /*key*/) {}
    static Tensor buffer(at::IntArrayRef sizes, const at::TensorOptions& options, at::MemoryFormat format) {
      return at::empty(sizes, options.memory_format(format));
    }
    // The parts side by side along the input channels (no copy of a single part; nothing staged).
    static Tensor weights(at::TensorList parts, convlstm_detail::CopyList& /*staging*/) {
      return parts.size() == 1 ? parts[0] : at::cat(parts, 1);
    }
    template <class F>
    Result operator()(const void* /*input*/, F&& fn) {
      return fn();
    }
  };

  static void copy_all(const convlstm_detail::CopyList& staging) {
    for (const auto& [dst, src] : staging) dst.copy_(src);
  }

  template <class scalar_t>
  static void forward_step(const ConvLstmForwardStep<scalar_t>& s) {
    if (s.peep) forward_pixels_dispatch<true>(s);
    else forward_pixels_dispatch<false>(s);
  }

  template <class scalar_t>
  static void backward_step(const ConvLstmBackwardStep<scalar_t>& s) {
    if (s.peep) backward_pixels_dispatch<true>(s);
    else backward_pixels_dispatch<false>(s);
  }
};

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> convlstm_forward_cpu(
    const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
    const std::optional<Tensor>& bias, const std::optional<Tensor>& peephole, bool training) {
  return convlstm_forward_loop<CpuPointwise>(x, h0, c0, w_ih, w_hh, bias, peephole, training);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> convlstm_backward_cpu(
    const std::optional<Tensor>& grad_y, const std::optional<Tensor>& grad_h_n, const std::optional<Tensor>& grad_c_n,
    const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
    const std::optional<Tensor>& peephole, const Tensor& y, const Tensor& gates, const Tensor& cells, bool has_bias) {
  return convlstm_backward_loop<CpuPointwise>(grad_y, grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, peephole, y, gates,
                                              cells, has_bias);
}

}  // namespace

TORCH_LIBRARY_IMPL(seqkernels, CPU, m) {
  m.impl("convlstm_forward", &convlstm_forward_cpu);
  m.impl("convlstm_backward", &convlstm_backward_cpu);
}

}  // namespace seqkernels::cpu
