// The ConvLSTM on the CPU: convlstm_forward / convlstm_backward (schemas in
// csrc/registration.cpp, checks in csrc/convlstm_checks.cpp, the time loop in
// seqkernels/convlstm_loop.h). This file is the fused pointwise pass of a step: one sweep
// over the [B, C, HW] elements that reads the four gates of each element from the two
// convolutions' outputs, applies the cell of seqkernels/convlstm_cell.h and writes h, c and
// the saved gates (backward: dz and dc). Rows (b, c) are split over threads; the inner loop
// over the HW contiguous pixels vectorises (float32 through FastFloatMath).
//
// Shape legend: T steps, B batch, C hidden channels, G = 4C, HW pixels of a frame.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu_checks.h"
#include "seqkernels/convlstm_cell.h"
#include "seqkernels/convlstm_loop.h"
#include "vec_math.h"

namespace seqkernels::cpu {
namespace {

using at::Tensor;

// Rows of HW pixels per parallel chunk: at least ~16k elements of work each.
int64_t row_grain(int64_t HW) { return std::max<int64_t>(1, (int64_t(1) << 14) / HW); }

template <bool kPeephole, bool kTraining, class scalar_t>
void forward_rows(const ConvLstmForwardStep<scalar_t>& s) {
  using acc_t = at::opmath_type<scalar_t>;
  using Math = typename CpuMath<acc_t>::type;
  const int64_t CHW = s.C * s.HW;
  at::parallel_for(0, s.B * s.C, row_grain(s.HW), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / s.C, ch = row % s.C;
      const int64_t gate0 = b * 4 * CHW + ch * s.HW;  // gate q of the row at gate0 + q·CHW
      const int64_t state = row * s.HW;
      const scalar_t* peep = kPeephole ? s.peep + ch * s.HW : nullptr;
      for (int64_t p = 0; p < s.HW; ++p) {
        const int64_t z = gate0 + p;
        const LstmGates<acc_t> pre{
            acc_t(s.zx[z]) + acc_t(s.zh[z]), acc_t(s.zx[z + CHW]) + acc_t(s.zh[z + CHW]),
            acc_t(s.zx[z + 2 * CHW]) + acc_t(s.zh[z + 2 * CHW]), acc_t(s.zx[z + 3 * CHW]) + acc_t(s.zh[z + 3 * CHW])};
        Peephole<acc_t> w{};
        if constexpr (kPeephole) w = {acc_t(peep[p]), acc_t(peep[CHW + p]), acc_t(peep[2 * CHW + p])};
        LstmGates<acc_t> act;
        acc_t c, h;
        convlstm_cell_forward<kPeephole, Math>(pre, acc_t(s.c_prev[state + p]), w, act, c, h);
        s.h[state + p] = scalar_t(h);
        s.c[state + p] = scalar_t(c);
        if constexpr (kTraining) {
          s.act[z] = scalar_t(act.i);
          s.act[z + CHW] = scalar_t(act.f);
          s.act[z + 2 * CHW] = scalar_t(act.g);
          s.act[z + 3 * CHW] = scalar_t(act.o);
        }
      }
    }
  });
}

template <bool kPeephole, class scalar_t>
void backward_rows(const ConvLstmBackwardStep<scalar_t>& s) {
  using acc_t = at::opmath_type<scalar_t>;
  using Math = typename CpuMath<acc_t>::type;
  const int64_t CHW = s.C * s.HW;
  at::parallel_for(0, s.B * s.C, row_grain(s.HW), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / s.C, ch = row % s.C;
      const int64_t gate0 = b * 4 * CHW + ch * s.HW;
      const int64_t state = row * s.HW;
      const scalar_t* peep = kPeephole ? s.peep + ch * s.HW : nullptr;
      for (int64_t p = 0; p < s.HW; ++p) {
        const int64_t z = gate0 + p, e = state + p;
        const LstmGates<acc_t> act{acc_t(s.act[z]), acc_t(s.act[z + CHW]), acc_t(s.act[z + 2 * CHW]),
                                   acc_t(s.act[z + 3 * CHW])};
        Peephole<acc_t> w{};
        if constexpr (kPeephole) w = {acc_t(peep[p]), acc_t(peep[CHW + p]), acc_t(peep[2 * CHW + p])};
        const acc_t dh = (s.dy ? acc_t(s.dy[e]) : acc_t(0)) + (s.dh_rec ? acc_t(s.dh_rec[e]) : acc_t(0));
        LstmGates<acc_t> dpre;
        acc_t dc_prev;
        convlstm_cell_backward<kPeephole, Math>(act, acc_t(s.c[e]), acc_t(s.c_prev[e]), w, dh, s.dc[e], dpre, dc_prev);
        s.dc[e] = dc_prev;
        s.dz[z] = scalar_t(dpre.i);
        s.dz[z + CHW] = scalar_t(dpre.f);
        s.dz[z + 2 * CHW] = scalar_t(dpre.g);
        s.dz[z + 3 * CHW] = scalar_t(dpre.o);
      }
    }
  });
}

struct CpuPointwise {
  static void check(const Tensor& x) { check_cpu(x, "seqkernels.convlstm"); }

  template <class scalar_t>
  static void forward_step(const ConvLstmForwardStep<scalar_t>& s) {
    const bool peep = s.peep != nullptr, training = s.act != nullptr;
    if (peep && training) forward_rows<true, true>(s);
    else if (peep) forward_rows<true, false>(s);
    else if (training) forward_rows<false, true>(s);
    else forward_rows<false, false>(s);
  }

  template <class scalar_t>
  static void backward_step(const ConvLstmBackwardStep<scalar_t>& s) {
    if (s.peep) backward_rows<true>(s);
    else backward_rows<false>(s);
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
