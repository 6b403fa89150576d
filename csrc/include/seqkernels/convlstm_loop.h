// The ConvLSTM time loop, written once for every backend (csrc/cpu/convlstm.cpp,
// csrc/cuda/convlstm.cu). The convolutions are the backend's (Backend::Convolution: cuDNN's
// on the GPU; on the CPU Winograd's (csrc/cpu/winograd.h) where they pay, oneDNN's
// elsewhere); the loop and the gate math are ours:
//   forward   training: one convolution w_ih * x + bias of all T·B input frames before the
//             loop, written straight into the buffer that keeps the activated gates for
//             backward (the pointwise pass overwrites each step's pre-activations with its
//             gates, so they cost no extra memory); per step the state convolution
//             w_hh * h_{t-1}. Inference keeps no gates, so instead of a whole-sequence
//             pre-activation buffer (4x the output) each step convolves [x_t, h_{t-1}], held
//             side by side in one buffer, with [w_ih | w_hh]: one convolution per step and
//             memory near the output's own. Then one fused pointwise pass
//             (Backend::forward_step) adds the parts (and in inference the bias), applies the
//             gates and peepholes, and writes c_t, h_t (channels-last, over h_{t-1}: the next
//             convolution's input), y_t (in the output's layout, so no whole-sequence
//             transposition follows) and in inference x_{t+1} next to h_t.
//   backward  reverse time: per step one fused pointwise pass (Backend::backward_step)
//             giving dz_t (the gate pre-activations' gradient) and dc_{t-1} in place, then
//             the state convolution's input gradient w_hhᵀ * dz_t, which is dh_{t-1}'s
//             recurrent part. dL/dy_t is read in grad_y's own strides where the backend can
//             (Backend::kStridedDy), else copied into channels-last one step at a time.
//             After every chunk of steps, dx, dw_ih, dbias and dw_hh of its steps are one
//             convolution backward each over all its frames, and the peephole gradients one
//             reduction each, accumulated over the chunks.
// Inside, every activation is channels-last (NHWC: a pixel's channels contiguous). Both
// oneDNN and cuDNN convolve that layout without reordering it (measured on the CPU here:
// the per-step convolution 1.2-1.5x faster than in NCHW), and the pointwise pass reads a
// pixel's four gates as four contiguous runs of C. The user's NCHW tensors are converted
// once per call on the way in and out.
// Every step's convolution reads the same buffers and writes a buffer it allocates, so a
// backend may replay it instead of calling it again: Backend::StepCall (CPU: a plain call;
// CUDA: captured into a CUDA graph at the second step and replayed, which removes the
// convolution's host cost, ~30-60 µs per step through ATen and cuDNN, from a loop that is
// otherwise host-bound at these sizes; the forward's and the backward's graphs are kept for the
// next call of the same sizes, with the buffers they read and write).
// A Backend supplies `check(x)` (the device), the two step functions over raw pointers,
// `kStridedDy`, `kChunkPixels`, `kInferenceGroupPixels`, `StepCall` (with `buffer` and `weights`:
// the buffers and weights a step's convolutions read), `Convolution` and `copy_all` (a call's
// staging copies, before its first step: one launch on the GPU). No host
// synchronisation; the only allocations are ATen's (the caching allocator on the GPU), so the
// loop can be captured in a CUDA graph.
//
// Shape legend: T steps, B batch, Ci input channels, C hidden channels, G = 4C gate
// channels (i, f, g, o), H x W the frame, P = H·W pixels, KH x KW the kernel.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <array>
#include <string>
#include <tuple>
#include <utility>

#include "seqkernels/convlstm_checks.h"
#include "seqkernels/error_format.h"

namespace seqkernels {

// One forward step of the fused pointwise pass, channels-last: element (b, p, c) of a state
// is at (b·P + p)·C + c, its gate q at (b·P + p)·G + q·C + c, its peephole weight q at
// (q·P + p)·C + c; only y_t is in the output's layout, (b·C + c)·P + p.
template <class scalar_t>
struct ConvLstmForwardStep {
  // Training: z = w_ih * x_t + bias, zh = w_hh * h_{t-1}, and the activated gates are written
  // over z. Inference: z = [w_ih | w_hh] * [x_t, h_{t-1}] + bias, the whole pre-activation
  // (zh is nullptr), nothing written back.
  scalar_t* z;             // [B, P, G]
  const scalar_t* zh;      // [B, P, G] or nullptr
  const scalar_t* bias;    // [G] added to z (inference), or nullptr (training: already in z)
  const scalar_t* c_prev;  // [B, P, C] c_{t-1}
  const scalar_t* peep;    // [3, P, C] w_ci, w_cf, w_co, or nullptr
  scalar_t* h;             // h_t: pixel b·P + p's C channels at (b·P + p)·h_stride
  scalar_t* c;             // [B, P, C] c_t
  scalar_t* y;             // [B, C, P] h_t again, in the output's layout (y_t)
  // Inference: x_{t+1} in x's layout, frame b's [Ci, P] at b·x_stride_b (nullptr at the last
  // step), copied into the first Ci channels of the next convolution's input (x_slot: pixel
  // b·P + p at (b·P + p)·h_stride), which h_t shares.
  const scalar_t* x_next;
  int64_t x_stride_b;
  scalar_t* x_slot;
  bool training;
  int64_t h_stride;        // C, or Ci + C where h_t shares its buffer with x_t (inference)
  int64_t B, P, C, Ci;
};

template <class scalar_t>
struct ConvLstmBackwardStep {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* act;     // [B, P, G] saved activated gates of step t
  const scalar_t* c;       // [B, P, C] c_t
  const scalar_t* c_prev;  // [B, P, C] c_{t-1}
  const scalar_t* peep;    // [3, P, C] or nullptr
  // dL/dy_t, or nullptr (no gradient): [B, P, C] channels-last, or with Backend::kStridedDy
  // element (b, c, p = py·W + px) at b·dy_stride[0] + c·dy_stride[1] + py·dy_stride[2] +
  // px·dy_stride[3] (grad_y's own strides, 0 where autograd expanded it).
  const scalar_t* dy;
  int64_t dy_stride[4];
  const scalar_t* dh_rec;  // [B, P, C] dL/dh_t from step t+1 (or h_n), or nullptr
  acc_t* dc;               // [B, P, C] in: dL/dc_t from step t+1; out: dL/dc_{t-1}
  scalar_t* dz;            // [B, P, G] dL/d(pre-activations) of step t
  int64_t B, P, C, W;
};

namespace convlstm_detail {

using at::Tensor;

struct ConvGeometry {
  std::vector<int64_t> stride{1, 1}, padding, dilation{1, 1}, output_padding{0, 0};
  explicit ConvGeometry(const ConvLstmSizes& s) : padding{s.KH / 2, s.KW / 2} {}
};

// [N, C, H, W] (NCHW) -> [N, H, W, C] memory, as an [N, C, H, W] tensor in channels-last
// strides: what the convolutions take and give.
inline Tensor to_nhwc(const Tensor& t) { return t.contiguous(at::MemoryFormat::ChannelsLast); }

// w * input (+ bias), in NHWC memory.
inline Tensor conv(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                   const ConvGeometry& g) {
  return to_nhwc(at::convolution(input, weight, bias, g.stride, g.padding, g.dilation, false, g.output_padding, 1));
}

// The gradients of conv(input, weight) selected by mask (input, weight). No bias gradient:
// the backward takes it as onesᵀ·dz (weight_grads in convlstm_backward_loop).
inline std::pair<Tensor, Tensor> conv_backward(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                                               const ConvGeometry& g, std::array<bool, 2> mask) {
  auto [grad_input, grad_weight, unused] =
      at::convolution_backward(grad_out, input, weight, at::OptionalIntArrayRef(), g.stride, g.padding, g.dilation,
                               false, g.output_padding, 1, {mask[0], mask[1], false});
  return {grad_input, grad_weight};
}

// What a convolution object of the loop is made for: forward calls, or the two gradients.
enum class ConvUse { kForward, kGradients };

// The convolutions of one weight that the loop runs, through ATen (oneDNN on the CPU, cuDNN on
// the GPU). A backend supplies its own as Backend::Convolution (the CPU's takes Winograd's
// where it pays: csrc/cpu/winograd.h), with this interface; `pixels` is H·W of the frames.
class AtenConvolution {
 public:
  AtenConvolution(const Tensor& weight, const ConvGeometry& g, int64_t /*pixels*/, ConvUse /*use*/)
      : weight_(to_nhwc(weight)), geom_(g) {}
  Tensor forward(const Tensor& input, const std::optional<Tensor>& bias) { return conv(input, weight_, bias, geom_); }
  // dL/d(input) of a call on inputs shaped like input_like, in NHWC memory.
  Tensor input_grad(const Tensor& grad_out, const Tensor& input_like) {
    return to_nhwc(conv_backward(grad_out, input_like, weight_, geom_, {true, false}).first);
  }
  Tensor weight_grad(const Tensor& grad_out, const Tensor& input) {
    return conv_backward(grad_out, input, weight_, geom_, {false, true}).second;
  }
  // Both, in one call: {input gradient (any strides), weight gradient}.
  std::pair<Tensor, Tensor> grads(const Tensor& grad_out, const Tensor& input) {
    return conv_backward(grad_out, input, weight_, geom_, {true, true});
  }

 private:
  Tensor weight_;
  ConvGeometry geom_;
};

// Moves the channel dimension of a [..., C, H, W] tensor last (to_back) or back from last.

inline Tensor move_channels(const Tensor& t, bool to_back) {
  const int64_t d = t.dim();
  std::vector<int64_t> order(d);
  for (int64_t i = 0; i < d - 3; ++i) order[i] = i;
  if (to_back) {  // [..., C, H, W] -> [..., H, W, C]
    order[d - 3] = d - 2;
    order[d - 2] = d - 1;
    order[d - 1] = d - 3;
  } else {  // [..., H, W, C] -> [..., C, H, W]
    order[d - 3] = d - 1;
    order[d - 2] = d - 3;
    order[d - 1] = d - 2;
  }
  return t.permute(order);
}

// x's frames [T, B, Ci, H, W] (any T and B strides) as [T·B, Ci, H, W] in NHWC memory: one copy.
inline Tensor nhwc_frames(const Tensor& x) {
  Tensor out = at::empty({x.size(0), x.size(1), x.size(3), x.size(4), x.size(2)}, x.options());
  out.copy_(move_channels(x, true));
  return move_channels(out.flatten(0, 1), false);
}

// A contiguous [..., H, W, C] buffer viewed as the [..., C, H, W] tensor it stores.
inline Tensor nchw_view(const Tensor& nhwc) { return move_channels(nhwc, false); }

// The [..., C, H, W] values of t in a contiguous [..., H, W, C] buffer of dtype.
inline Tensor to_nhwc_buffer(const Tensor& t, at::ScalarType dtype) {
  return move_channels(t, true).to(dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

// A call's staging copies (dst, src), made together by Backend::copy_all before the first step:
// 4-D tensors of one dtype, each src of its dst's sizes, any strides. On the GPU they are one
// launch: as five ATen copies (the weights, h_0, c_0, x_0) they were most of the op's host time
// before the first step's convolution could start (H100 profiles of the second benchmark shape's
// `infer`: the op's start to the first step 203 µs before, 83-125 µs after).
using CopyList = std::vector<std::pair<Tensor, Tensor>>;

template <class T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// What a StepCall's convolutions depend on besides the device and the library's switches (the
// backend adds those): the kind of call, the sizes and the dtype. Built without std::ostream
// (seqkernels/error_format.h says why).
inline std::string step_key(const char* kind, const ConvLstmSizes& s, at::ScalarType dtype) {
  std::string key = "convlstm ";
  key += kind;
  for (const int64_t v : {s.B, s.Ci, s.C, s.H, s.W, s.KH, s.KW, int64_t(s.has_bias)}) {
    key += ' ';
    key += num(v);
  }
  key += ' ';
  key += c10::toString(dtype);
  return key;
}

// A fresh channels-last buffer for t ([..., C, H, W] -> [..., H, W, C] memory), its copy staged.
inline Tensor staged_nhwc_buffer(const Tensor& t, CopyList& staging) {
  const Tensor out = at::empty(move_channels(t, true).sizes(), t.options());
  staging.emplace_back(nchw_view(out), t);
  return out;
}

inline Tensor optional_staged_nhwc_buffer(const std::optional<Tensor>& t, CopyList& staging) {
  return t.has_value() && t->defined() ? staged_nhwc_buffer(*t, staging) : Tensor();
}

}  // namespace convlstm_detail

// Saved for backward by a training forward, channels-last: gates [T, B, H, W, G] (activated
// i, f, g, o) and cells [T, B, H, W, C] (c_t).
template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> convlstm_forward_loop(
    const at::Tensor& x, const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& peephole, bool training) {
  using namespace convlstm_detail;
  const ConvLstmSizes s = check_convlstm_forward(x, h0, c0, w_ih, w_hh, bias, peephole);
  Backend::check(x);
  const ConvGeometry geom(s);
  const int64_t P = s.H * s.W, state = s.B * P * s.C, gate_step = s.B * P * s.G;
  const at::ScalarType dtype = x.scalar_type();

  const std::optional<Tensor> bias_or_none = s.has_bias ? bias : std::nullopt;
  CopyList staging;  // made together before the first step
  // The step convolution's weights and input, channels-last. Training: w_hh over one
  // [B, H, W, C] buffer holding h_{t-1}. Inference: [w_ih | w_hh] over one [B, H, W, Ci + C]
  // buffer holding x_t next to h_{t-1}. The pointwise pass writes h_t (and x_{t+1}) over it
  // once the convolution has read it, so every step convolves the same buffer. Both come from
  // the step call (the GPU keeps them, with the step graph that reads them, from one call to
  // the next, and writes the weight afresh in every call).
  typename Backend::template StepCall<Tensor> step_conv(s.T, step_key(training ? "train" : "infer", s, dtype));
  const int64_t h_channels = training ? s.C : s.Ci + s.C;  // pixel stride of the h buffer
  Tensor step_w = training ? step_conv.weights({w_hh}, staging) : step_conv.weights({w_ih, w_hh}, staging);
  Tensor h_buf = step_conv.buffer({s.B, s.H, s.W, h_channels}, x.options(), at::MemoryFormat::Contiguous);
  const Tensor h_in = nchw_view(h_buf);  // as the convolution's [B, channels, H, W] input
  staging.emplace_back(h_in.narrow(1, h_channels - s.C, s.C), h0);
  if (!training) staging.emplace_back(h_in.narrow(1, 0, s.Ci), x.select(0, 0));
  // Training keeps every c_t for backward; inference two alternating buffers.
  Tensor cells = at::empty({training ? s.T : 2, s.B, s.H, s.W, s.C}, x.options());
  // c_0 channels-last: its own buffer in training (backward reads it), else the second cell
  // buffer (step 0 writes the first).
  const Tensor c0_nhwc = training ? staged_nhwc_buffer(c0, staging) : cells.select(0, 1);
  if (!training) staging.emplace_back(nchw_view(c0_nhwc), c0);
  const Tensor peep_nhwc = optional_staged_nhwc_buffer(peephole, staging);
  Backend::copy_all(staging);
  staging.clear();
  // Handed over, not held: the CPU's convolution keeps its own transformed kernel, and its
  // concatenated weight (2 MB at the first benchmark shape) would otherwise outlive the loop.
  typename Backend::Convolution step_weights(std::exchange(step_w, Tensor()), geom, P, ConvUse::kForward);
  Tensor y = at::empty({s.T, s.B, s.C, s.H, s.W}, x.options());
  // Training: [T·B, G, H, W] in NHWC memory, w_ih * x + bias of every frame; the steps overwrite
  // each step's pre-activations with its activated gates, the buffer saved for backward.
  const Tensor zx = training ? typename Backend::Convolution(w_ih, geom, P, ConvUse::kForward)
                                   .forward(nhwc_frames(x), bias_or_none)
                             : Tensor();
  const Tensor bias_step = !training && bias_or_none.has_value() ? bias_or_none->contiguous() : Tensor();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "convlstm_forward", [&] {
    const scalar_t* x_data = x.data_ptr<scalar_t>();
    ConvLstmForwardStep<scalar_t> step{};
    step.peep = ptr_or_null<scalar_t>(peep_nhwc);
    step.bias = ptr_or_null<scalar_t>(bias_step);
    step.training = training;
    step.h_stride = h_channels;
    step.x_slot = nullptr;
    step.x_stride_b = x.stride(1);
    step.P = P;
    step.C = s.C;
    step.Ci = s.Ci;
    // Inference convolves a step's frames in groups of at most Backend::kInferenceGroupPixels
    // pixels: on the CPU the step's convolution output (4C channels a pixel) is the largest
    // allocation of an inference call, and a frame's convolution reads only its own x_t and
    // h_{t-1}, so a group's pointwise pass may write h_t before the next group convolves. The GPU
    // takes one group (the step's graph). Training takes one group.
    const int64_t group = training ? s.B : std::clamp<int64_t>(Backend::kInferenceGroupPixels / P, 1, s.B);
    const scalar_t* c_prev = c0_nhwc.data_ptr<scalar_t>();
    for (int64_t t = 0; t < s.T; ++t) {
      scalar_t* cells_t = cells.data_ptr<scalar_t>() + (training ? t : t % 2) * state;
      for (int64_t b0 = 0; b0 < s.B; b0 += group) {
        const int64_t frames = std::min(group, s.B - b0);
        // w_hh * h_{t-1} (training) or [w_ih | w_hh] * [x_t, h_{t-1}] (inference) of the group's
        // frames; held until the pointwise pass has read it.
        const Tensor z = step_conv(h_buf.data_ptr(), [&] {
          return step_weights.forward(frames == s.B ? h_in : h_in.narrow(0, b0, frames), std::nullopt);
        });
        if (training) {
          step.z = zx.data_ptr<scalar_t>() + t * gate_step;
          step.zh = z.data_ptr<scalar_t>();
        } else {
          step.z = z.data_ptr<scalar_t>();
          step.zh = nullptr;
          step.x_next = t + 1 < s.T ? x_data + (t + 1) * x.stride(0) + b0 * x.stride(1) : nullptr;
          step.x_slot = h_buf.data_ptr<scalar_t>() + b0 * P * h_channels;
        }
        step.B = frames;
        step.h = h_buf.data_ptr<scalar_t>() + b0 * P * h_channels + (h_channels - s.C);
        step.c_prev = c_prev + b0 * P * s.C;
        step.c = cells_t + b0 * P * s.C;
        step.y = y.data_ptr<scalar_t>() + t * state + b0 * s.C * P;
        Backend::forward_step(step);
      }
      c_prev = cells_t;
    }
  });
  Tensor h_n = y.select(0, s.T - 1).clone();
  // A copy (not .contiguous(), which may return a view): outputs must not alias each other.
  Tensor c_n = nchw_view(cells.select(0, training ? s.T - 1 : (s.T - 1) % 2)).clone(at::MemoryFormat::Contiguous);
  Tensor gates = training ? move_channels(zx, true).view({s.T, s.B, s.H, s.W, s.G}) : at::empty({0}, x.options());
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
  const int64_t P = s.H * s.W, state = s.B * P * s.C, gate_step = s.B * P * s.G;
  const at::ScalarType dtype = x.scalar_type();
  const at::ScalarType acc_dtype = at::toOpMathType(dtype);

  // The reverse loop runs in chunks of `chunk` steps; after each chunk its weight, bias,
  // input and peephole gradients are one convolution backward (or reduction) over all its
  // frames, accumulated. Whole-sequence calls would need dL/dz of every step at once (4
  // states per step, next to the 6 per step saved by the forward) plus the convolutions'
  // workspace for T·B frames. A chunk is a quarter of the sequence, and no more steps than
  // fill Backend::kChunkPixels frame pixels (B·P per step). The CPU takes quarters: its larger
  // oneDNN calls are the faster ones. The GPU takes one step: then every call of a step reads
  // the same buffers, so all of them (w_hhᵀ * dz_t and the weight gradients) replay from one
  // graph (Backend::StepCall), which leaves the loop bound by the GPU rather than by ~50 µs of
  // host time per convolution, and the loop holds one step's dL/dz and cuDNN's workspace for B
  // frames only (H100, B = 4, 64 x 64, C = 64, T = 20: 5-step chunks took 132 MB of workspace
  // next to 80 MB of dL/dz).
  const int64_t chunk =
      std::max<int64_t>(1, std::min(s.T / 4, (Backend::kChunkPixels + s.B * P - 1) / (s.B * P)));
  const int64_t slots = std::min(chunk, s.T);
  // One step per chunk: a step's convolutions, replayed ({dL/dh_{t-1}, dL/dx_t}). Everything
  // they read or accumulate into comes from the step call (the GPU keeps it, with the step
  // graph, from one call to the next) and is written or zeroed afresh below.
  using StepGrads = std::array<Tensor, 2>;
  typename Backend::template StepCall<StepGrads> step_grads(chunk == 1 ? s.T : 0, step_key("backward", s, dtype));
  const auto contiguous = at::MemoryFormat::Contiguous;
  // The chunk's dL/dz, h_{t-1} and x_t, channels-last: the inputs of its weight gradients.
  Tensor dz = step_grads.buffer({slots, s.B, s.H, s.W, s.G}, x.options(), contiguous);
  Tensor h_prev = step_grads.buffer({slots, s.B, s.H, s.W, s.C}, x.options(), contiguous);
  Tensor x_prev = step_grads.buffer({slots, s.B, s.H, s.W, s.Ci}, x.options(), contiguous);
  // dL/dc is carried in the accumulation type: it sums over the whole remaining sequence.
  Tensor dc = grad_c_n.has_value() && grad_c_n->defined() ? to_nhwc_buffer(*grad_c_n, acc_dtype)
                                                          : at::zeros({s.B, s.H, s.W, s.C}, x.options().dtype(acc_dtype));
  // dL/dy_t: read in grad_y's strides (Backend::kStridedDy), else copied into channels-last one
  // step at a time (a whole-sequence copy would cost another output's worth of memory).
  const bool has_dy = grad_y.has_value() && grad_y->defined();
  Tensor dy_step = has_dy && !Backend::kStridedDy ? at::empty({s.B, s.H, s.W, s.C}, x.options()) : Tensor();
  CopyList staging;  // made together before the first step
  const Tensor c0_nhwc = staged_nhwc_buffer(c0, staging);
  const Tensor peep_nhwc = optional_staged_nhwc_buffer(peephole, staging);
  const Tensor w_ih_step = step_grads.weights({w_ih}, staging), w_hh_step = step_grads.weights({w_hh}, staging);
  Backend::copy_all(staging);
  staging.clear();
  typename Backend::Convolution conv_ih(w_ih_step, geom, P, ConvUse::kGradients),
      conv_hh(w_hh_step, geom, P, ConvUse::kGradients);
  // dL/dh from step t+1 as an NHWC [B, C, H, W] tensor (first from h_n).
  Tensor dh_rec = grad_h_n.has_value() && grad_h_n->defined() ? to_nhwc(*grad_h_n) : Tensor();
  // A staged h_{t-1} stands in for h_{t-1} in the input-gradient calls: only its shape and
  // layout matter (a channels-last copy of h0 would cost a state).
  const Tensor h_like = nchw_view(h_prev.select(0, 0));

  // The summed gradients accumulate over chunks in the accumulation type (returned as copies:
  // the GPU keeps these buffers).
  const auto acc_opts = x.options().dtype(acc_dtype);
  Tensor grad_x = at::empty_like(x, at::MemoryFormat::Contiguous);
  Tensor grad_w_ih = step_grads.buffer(w_ih.sizes(), acc_opts, contiguous).zero_();
  Tensor grad_w_hh = step_grads.buffer(w_hh.sizes(), acc_opts, contiguous).zero_();
  Tensor grad_bias = has_bias ? step_grads.buffer({s.G}, acc_opts, contiguous).zero_() : at::empty({0}, x.options());
  // [3, H, W, C] accumulated: w_ci, w_cf, w_co.
  Tensor grad_peep_nhwc = s.has_peephole ? at::zeros({3, s.H, s.W, s.C}, acc_opts) : Tensor();

  // dL/dh_{t-1}'s recurrent part, w_hhᵀ * dz_t, from dz's slot `slot`.
  const auto state_grad = [&](int64_t slot) {
    return conv_hh.input_grad(nchw_view(dz.select(0, slot)), h_like);
  };
  // h_{t-1} and x_t of steps t0 .. t0 + n - 1 into h_prev's and x_prev's first n slots.
  const auto stage_frames = [&](int64_t t0, int64_t n) {
    const Tensor h_prev_n = nchw_view(h_prev.narrow(0, 0, n));
    if (t0 == 0) {
      h_prev_n.select(0, 0).copy_(h0);
      if (n > 1) h_prev_n.narrow(0, 1, n - 1).copy_(y.narrow(0, 0, n - 1));
    } else {
      h_prev_n.copy_(y.narrow(0, t0 - 1, n));
    }
    nchw_view(x_prev.narrow(0, 0, n)).copy_(x.narrow(0, t0, n));
  };
  // Ones over a chunk's dz rows (n·B·H·W): the bias gradient is onesᵀ·dz. convolution_backward's
  // own bias gradient is a sum over dims (0, 2, 3) whose CUDA reduction takes a staging buffer of
  // 4x dz (H100, bf16, B = 16, 16 x 16, 4C = 256: 8 MB, the largest allocation of the backward).
  const Tensor ones = has_bias ? step_grads.buffer({slots * s.B * P}, x.options(), contiguous).fill_(1) : Tensor();
  // The weight and bias gradients of the staged steps (the first n slots), accumulated; returns
  // their input gradient [n·B, Ci, H, W] (any strides).
  const auto weight_grads = [&](int64_t n) {
    const auto frames = [&](const Tensor& t) { return nchw_view(t.narrow(0, 0, n).flatten(0, 1)); };
    const Tensor dz_frames = frames(dz);
    grad_w_hh.add_(conv_hh.weight_grad(dz_frames, frames(h_prev)));
    auto [gx, gw_ih] = conv_ih.grads(dz_frames, frames(x_prev));
    grad_w_ih.add_(gw_ih);
    if (has_bias) {  // [n·B·H·W, 4C]ᵀ · ones: a GEMV, float accumulation in 16-bit types
      const int64_t rows = n * s.B * P;
      grad_bias.add_(at::mv(dz.narrow(0, 0, n).view({rows, s.G}).t(), ones.narrow(0, 0, rows)));
    }
    return gx;
  };
  const auto peephole_grads = [&](int64_t t0, int64_t n) {
    const Tensor dz_gates = dz.narrow(0, 0, n).view({n, s.B, s.H, s.W, 4, s.C}).to(acc_dtype);
    const Tensor c_t = cells.narrow(0, t0, n).to(acc_dtype);
    const Tensor c_prev = t0 == 0 ? at::cat({c0_nhwc.unsqueeze(0).to(acc_dtype), c_t.narrow(0, 0, n - 1)})
                                  : cells.narrow(0, t0 - 1, n).to(acc_dtype);
    const std::vector<int64_t> over_time_and_batch{0, 1};
    grad_peep_nhwc.select(0, 0).add_((dz_gates.select(4, 0) * c_prev).sum(over_time_and_batch));
    grad_peep_nhwc.select(0, 1).add_((dz_gates.select(4, 1) * c_prev).sum(over_time_and_batch));
    grad_peep_nhwc.select(0, 2).add_((dz_gates.select(4, 3) * c_t).sum(over_time_and_batch));
  };

  Tensor grad_h0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "convlstm_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    ConvLstmBackwardStep<scalar_t> step{};
    step.peep = ptr_or_null<scalar_t>(peep_nhwc);
    step.dc = dc.data_ptr<acc_t>();
    step.B = s.B;
    step.P = P;
    step.C = s.C;
    step.W = s.W;
    const scalar_t* dy_data = has_dy && Backend::kStridedDy ? grad_y->data_ptr<scalar_t>() : nullptr;
    if (dy_data) {
      for (int d = 0; d < 4; ++d) step.dy_stride[d] = grad_y->stride(d + 1);  // [B, C, H, W] of a step
    }
    for (int64_t end = s.T; end > 0; end -= chunk) {
      const int64_t t0 = std::max<int64_t>(0, end - chunk), n = end - t0;
      if (chunk == 1) stage_frames(t0, 1);  // before the pointwise pass: the replay reads them after it
      for (int64_t t = end - 1; t >= t0; --t) {
        step.act = gates.data_ptr<scalar_t>() + t * gate_step;
        step.c = cells.data_ptr<scalar_t>() + t * state;
        step.c_prev = t > 0 ? cells.data_ptr<scalar_t>() + (t - 1) * state : c0_nhwc.data_ptr<scalar_t>();
        if (dy_data) {
          step.dy = dy_data + t * grad_y->stride(0);
        } else {
          if (has_dy) nchw_view(dy_step).copy_(grad_y->select(0, t));
          step.dy = ptr_or_null<scalar_t>(dy_step);
        }
        step.dh_rec = dh_rec.defined() ? dh_rec.data_ptr<scalar_t>() : nullptr;
        step.dz = dz.data_ptr<scalar_t>() + (t - t0) * gate_step;
        Backend::backward_step(step);
        if (chunk == 1) {
          const auto [dh, gx] = step_grads(dz.data_ptr(), [&] { return StepGrads{state_grad(0), weight_grads(1)}; });
          dh_rec = dh;
          grad_x.select(0, t).copy_(gx);
        } else {
          dh_rec = state_grad(t - t0);
        }
      }
      if (chunk > 1) {
        stage_frames(t0, n);
        grad_x.narrow(0, t0, n).copy_(weight_grads(n).reshape({n, s.B, s.Ci, s.H, s.W}));  // gx: any strides
      }
      if (s.has_peephole) peephole_grads(t0, n);
    }
    grad_h0 = dh_rec.clone(at::MemoryFormat::Contiguous);  // a copy: dh_rec may be the step graph's result
    dh_rec = Tensor();
  });

  // [3, H, W, C] -> [3, C, H, W]
  Tensor grad_peephole =
      s.has_peephole ? nchw_view(grad_peep_nhwc).to(dtype).contiguous() : at::empty({0}, x.options());
  Tensor grad_c0 = nchw_view(dc).to(dtype).contiguous();
  return {grad_x,
          grad_h0,
          grad_c0,
          grad_w_ih.to(dtype, /*non_blocking=*/false, /*copy=*/true),
          grad_w_hh.to(dtype, /*non_blocking=*/false, /*copy=*/true),
          has_bias ? grad_bias.to(dtype, /*non_blocking=*/false, /*copy=*/true) : grad_bias,
          grad_peephole};
}

}  // namespace seqkernels
