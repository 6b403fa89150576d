// The ConvLSTM on the GPU: convlstm_forward / convlstm_backward (schemas in
// csrc/registration.cpp, checks in csrc/convlstm_checks.cpp, the time loop in
// seqkernels/convlstm_loop.h with cuDNN's convolutions). This file is the fused pointwise
// pass of a step: one thread per channels-last (b, pixel, c) element reads its four gates from
// the two convolutions' outputs, applies the cell of seqkernels/convlstm_cell.h in float
// (double for float64) and writes h, c, y and the saved gates (backward: dz and dc).
//
// Shape legend: B batch, P = H·W pixels, C hidden channels, G = 4C; layouts in convlstm_loop.h.
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "seqkernels/convlstm_cell.h"
#include "seqkernels/convlstm_loop.h"

namespace seqkernels {
namespace {

using at::Tensor;

template <class acc_t>
struct CudaMath {
  static __device__ __forceinline__ acc_t sigmoid(acc_t x) { return acc_t(1) / (acc_t(1) + exp(-x)); }
  static __device__ __forceinline__ acc_t tanh(acc_t x) { return ::tanh(x); }
};

constexpr int kThreads = 256;

// Blocks for n elements, one per thread, capped: the kernels stride over the rest.
int blocks_for(int64_t n) {
  const int64_t max_blocks = int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 16;
  return int(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, max_blocks)));
}

template <bool kPeephole, bool kTraining, class scalar_t>
__global__ void __launch_bounds__(kThreads) forward_kernel(ConvLstmForwardStep<scalar_t> s) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t C = s.C, P = s.P, PC = P * C, n = s.B * PC;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pixel = e / C, c_idx = e - pixel * C;  // pixel = b·P + p
    const int64_t z = pixel * 4 * C + c_idx, within = e % PC;  // within = p·C + c
    // All four pre-activations are read before any gate is written over them (training).
    LstmGates<acc_t> pre{acc_t(s.z[z]), acc_t(s.z[z + C]), acc_t(s.z[z + 2 * C]), acc_t(s.z[z + 3 * C])};
    if constexpr (kTraining) {  // the state convolution's half (inference: already in z)
      pre.i += acc_t(s.zh[z]);
      pre.f += acc_t(s.zh[z + C]);
      pre.g += acc_t(s.zh[z + 2 * C]);
      pre.o += acc_t(s.zh[z + 3 * C]);
    }
    Peephole<acc_t> w{};
    if constexpr (kPeephole) w = {acc_t(s.peep[within]), acc_t(s.peep[PC + within]), acc_t(s.peep[2 * PC + within])};
    LstmGates<acc_t> act;
    acc_t c, h;
    convlstm_cell_forward<kPeephole, CudaMath<acc_t>>(pre, acc_t(s.c_prev[e]), w, act, c, h);
    s.h[pixel * s.h_stride + c_idx] = scalar_t(h);
    s.c[e] = scalar_t(c);
    const int64_t b = pixel / P, p = pixel - b * P;
    s.y[(b * C + c_idx) * P + p] = scalar_t(h);
    if constexpr (kTraining) {
      s.z[z] = scalar_t(act.i);
      s.z[z + C] = scalar_t(act.f);
      s.z[z + 2 * C] = scalar_t(act.g);
      s.z[z + 3 * C] = scalar_t(act.o);
    }
  }
}

template <bool kPeephole, class scalar_t>
__global__ void __launch_bounds__(kThreads) backward_kernel(ConvLstmBackwardStep<scalar_t> s) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t C = s.C, PC = s.P * s.C, n = s.B * PC;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pixel = e / C, c_idx = e - pixel * C;
    const int64_t z = pixel * 4 * C + c_idx, within = e % PC;
    const LstmGates<acc_t> act{acc_t(s.act[z]), acc_t(s.act[z + C]), acc_t(s.act[z + 2 * C]), acc_t(s.act[z + 3 * C])};
    Peephole<acc_t> w{};
    if constexpr (kPeephole) w = {acc_t(s.peep[within]), acc_t(s.peep[PC + within]), acc_t(s.peep[2 * PC + within])};
    const acc_t dh = (s.dy ? acc_t(s.dy[e]) : acc_t(0)) + (s.dh_rec ? acc_t(s.dh_rec[e]) : acc_t(0));
    LstmGates<acc_t> dpre;
    acc_t dc_prev;
    convlstm_cell_backward<kPeephole, CudaMath<acc_t>>(act, acc_t(s.c[e]), acc_t(s.c_prev[e]), w, dh, s.dc[e], dpre,
                                                      dc_prev);
    s.dc[e] = dc_prev;
    s.dz[z] = scalar_t(dpre.i);
    s.dz[z + C] = scalar_t(dpre.f);
    s.dz[z + 2 * C] = scalar_t(dpre.g);
    s.dz[z + 3 * C] = scalar_t(dpre.o);
  }
}

struct CudaPointwise {
  static void check(const Tensor& x) {
    TORCH_CHECK(x.is_cuda(), "seqkernels.convlstm: CUDA kernel called with a tensor on ", x.device());
  }

  template <class scalar_t>
  static void forward_step(const ConvLstmForwardStep<scalar_t>& s) {
    const int blocks = blocks_for(s.B * s.P * s.C);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const bool peep = s.peep != nullptr, training = s.training;
    if (peep && training) forward_kernel<true, true><<<blocks, kThreads, 0, stream>>>(s);
    else if (peep) forward_kernel<true, false><<<blocks, kThreads, 0, stream>>>(s);
    else if (training) forward_kernel<false, true><<<blocks, kThreads, 0, stream>>>(s);
    else forward_kernel<false, false><<<blocks, kThreads, 0, stream>>>(s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  template <class scalar_t>
  static void backward_step(const ConvLstmBackwardStep<scalar_t>& s) {
    const int blocks = blocks_for(s.B * s.P * s.C);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (s.peep) backward_kernel<true><<<blocks, kThreads, 0, stream>>>(s);
    else backward_kernel<false><<<blocks, kThreads, 0, stream>>>(s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

// The kernels launch on the current device: make it x's before anything runs.
void require_cuda(const Tensor& x) {
  TORCH_CHECK(x.defined() && x.is_cuda(), "seqkernels.convlstm: x must be a CUDA tensor for the CUDA kernel");
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> convlstm_forward_cuda(
    const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
    const std::optional<Tensor>& bias, const std::optional<Tensor>& peephole, bool training) {
  require_cuda(x);
  const c10::cuda::CUDAGuard guard(x.device());
  return convlstm_forward_loop<CudaPointwise>(x, h0, c0, w_ih, w_hh, bias, peephole, training);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> convlstm_backward_cuda(
    const std::optional<Tensor>& grad_y, const std::optional<Tensor>& grad_h_n, const std::optional<Tensor>& grad_c_n,
    const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
    const std::optional<Tensor>& peephole, const Tensor& y, const Tensor& gates, const Tensor& cells, bool has_bias) {
  require_cuda(x);
  const c10::cuda::CUDAGuard guard(x.device());
  return convlstm_backward_loop<CudaPointwise>(grad_y, grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, peephole, y, gates,
                                               cells, has_bias);
}

}  // namespace
}  // namespace seqkernels

TORCH_LIBRARY_IMPL(seqkernels, CUDA, m) {
  m.impl("convlstm_forward", &seqkernels::convlstm_forward_cuda);
  m.impl("convlstm_backward", &seqkernels::convlstm_backward_cuda);
}
