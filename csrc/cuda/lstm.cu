// CUDA implementation of seqkernels::lstm_forward and seqkernels::lstm_backward: one LSTM
// layer, one direction, the whole packed sequence per call. The algorithm, the saved tensors
// and the outputs are those of csrc/cpu/lstm.cpp (the schema is documented in
// csrc/registration.cpp); only the execution differs.
//
// Shape legend: T steps, N = sum(batch_sizes) packed rows, B = batch_sizes[0], I input,
// H hidden, P projection, Hout = P with projection else H, G = 4H gate rows (i, f, g, o).
// Step t owns packed rows [off_t, off_t + bt), bt = batch_sizes[t]; row off_t + b belongs to
// sequence b. acc_t is float for half types (float16, bfloat16) and scalar_t otherwise.
//
// The time loop itself is one of three (lstm_loop.cuh chooses per call): the persistent kernel
// (lstm_persistent.cu), one fused GEMM + gate kernel per step (lstm_fused_step.cu), or the
// cuBLAS loop written out below, which handles every case (projection, every dtype); the
// first two produce exactly the cuBLAS loop's outputs and saved tensors.
//
// Forward, per call:
//   pre[N, G] (acc_t) = x·W_ihᵀ                                  one GEMM over all rows
//   (persistent or fused loop, where chosen and applicable; else:)
//   hbuf[B, Hout] = h0, cbuf[B, H] (acc_t) = c0
//   for each step t in processing order (t = 0..T-1, or T-1..0 when reverse):
//     pre[rows] += hbuf[:bt]·W_hhᵀ                                cuBLAS, beta = 1
//     fused pointwise kernel over bt×H: + (b_ih + b_hh), gates, c_t -> cbuf[:bt],
//       training: activated gates -> gates[rows], c_t -> cells[rows];
//       no projection: h_t = m_t -> y[rows] and hbuf[:bt]; projection: m_t -> mbuf[:bt]
//     projection: y[rows] = mbuf[:bt]·W_hrᵀ (cuBLAS), then hbuf[:bt] = y[rows] (D2D copy)
//   Rows b >= bt of hbuf / cbuf are never touched, so h_n = hbuf and c_n = cbuf at the end,
//   for packed sequences in both directions.
// Backward, per call (processing order reversed):
//   (persistent or fused loop, where chosen and applicable, up to the whole-sequence GEMMs; else:)
//   dhbuf[B, Hout] (acc_t) = grad_h_n, dcbuf[B, H] (acc_t) = grad_c_n
//   for each step: dh = dhbuf[:bt] + grad_y[rows];
//     projection: dHtot[rows] = dh (one small kernel), dm = dHtot[rows]·W_hr (cuBLAS)
//     fused pointwise kernel: dG[rows] (pre-activation gradients), dcbuf[:bt] = dL/dc_{t-1},
//       M[rows] = m_t (projection), Hprev[rows] = h_{t-1} (gathered for dW_hh)
//     dhbuf[:bt] = dG[rows]·W_hh                                  cuBLAS, beta = 0
//   grad_w_ih = dGᵀ·x, grad_w_hh = dGᵀ·Hprev, then (Hprev released) grad_x = dG·W_ih,
//   grad_bias = 1ᵀ·dG, grad_w_hr = dHtotᵀ·M, grad_h0 = dhbuf, grad_c0 = dcbuf
//   (all GEMMs: deterministic; float32 without TF32: split TF32 GEMMs where large, x3_products)
//
// The cuBLAS loop replays its steps from kept CUDA graphs where that applies (equal batch
// sizes, T >= 16, the caller not capturing; replayed_steps.cuh): the same math with the
// recurrent GEMM into a kept buffer, 16 steps per graph launch. With a projection the
// forward's h_t stays in a kept buffer too (the projection GEMM's output), and a step's kernel
// copies the previous step's into y; the backward's dh goes to a kept buffer and dHtot.
//
// Every buffer is allocated before the time loop (caching allocator); inside it there are only
// cuBLAS calls, kernel launches, graph launches and one device-to-device copy, all on the
// current stream: no allocation, no host synchronisation. Inside a caller's CUDA-graph capture
// the plain loop runs, which uses no private stream, so a call can be captured. T never
// appears in a launch dimension (sequences longer than 65535 steps are fine) and every
// in-kernel index is 64-bit.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "blas.cuh"
#include "kept_pools.cuh"
#include "lstm_device.cuh"
#include "lstm_fused_step.cuh"
#include "lstm_loop.cuh"
#include "lstm_one_cluster.cuh"
#include "lstm_persistent.cuh"
#include "replayed_steps.cuh"
#include "seqkernels/lstm_cell.h"
#include "seqkernels/lstm_checks.h"
#include "seqkernels/lstm_infer.h"

namespace seqkernels {
namespace {

using at::Tensor;
using cuda::Trans;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // the kernels stride over the rest
// Row blocks a step kernel sums into its recurrent product (step_k_parts; the x3 steps' halves).
constexpr int kMaxRecBlocks = 4;  // forward
constexpr int kMaxDhBlocks = 8;   // backward

using cuda::CudaMath;  // IEEE cell nonlinearities (lstm_device.cuh)

// V consecutive elements moved with one aligned load or store (16 bytes for V = 4 floats).
template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <int V, class T>
__device__ __forceinline__ Vec<T, V> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}

// load_vec from L2 (ld.global.cg), for what a kernel reads after pdl_wait(). With normal loads
// there, the replayed backward got wrong dG on an H200 (float64 and float32 without TF32,
// B = 16, H = 256); from L2 it passed. The likely cause, not isolated: a kernel that started
// beside the one before it (PDL) can hit lines that kernel's blocks left in this SM's L1 (a
// serial split-K GEMM reads the C it accumulates). The fused loop reads its carried state the
// same way.
template <int V, class T>
__device__ __forceinline__ Vec<T, V> load_vec_cg(const T* p) {
  Vec<T, V> r;
  constexpr int kBytes = static_cast<int>(sizeof(Vec<T, V>));
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      reinterpret_cast<uint4*>(&r)[i] = __ldcg(reinterpret_cast<const uint4*>(p) + i);
    }
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(&r) = __ldcg(reinterpret_cast<const uint2*>(p));
  } else {
    static_assert(kBytes == 4, "load_vec_cg: 4, 8 or a multiple of 16 bytes");
    *reinterpret_cast<unsigned int*>(&r) = __ldcg(reinterpret_cast<const unsigned int*>(p));
  }
  return r;
}

// load_vec_cg where kL2 (a read after pdl_wait()), else load_vec.
template <bool kL2, int V, class T>
__device__ __forceinline__ Vec<T, V> load_vec_from(const T* p) {
  if constexpr (kL2) {
    return load_vec_cg<V>(p);
  } else {
    return load_vec<V>(p);
  }
}

template <int V, class T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, V>& v) {
  *reinterpret_cast<Vec<T, V>*>(p) = v;
}

template <int V, class T>
bool aligned_for(const T* p) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % (sizeof(T) * V) == 0;
}

// float32 without TF32 on TF32 tensor cores (3xTF32). Each value v splits into big = TF32(v)
// (round to nearest, ties away) and small = TF32(v - big) (the subtraction is exact), and a
// product a·w as a_big·w_big + a_big'·w_small + a_small·w_big', where ' marks the big part with
// a non-finite v as 0 (small is 0 there too): NaN and inf then reach the sum only through
// big·big, as in a float32 GEMM (a cross term would give inf · 0 = NaN where the other operand
// is exactly a TF32 value). The dropped small·small term and the splits' remainders are ~2^-22
// of each product, float32's order (docs/precision.md). A finite v that rounds to inf (within
// 2^-11 of FLT_MAX) is truncated instead.
struct Tf32Parts {
  float big, small, big_finite;
};
__device__ __forceinline__ Tf32Parts tf32_parts(float v) {
  uint32_t big = cuda::to_tf32(v);
  const bool finite = isfinite(v);
  if (finite && isinf(__uint_as_float(big))) big = __float_as_uint(v) & 0xffffe000u;
  return {__uint_as_float(big), finite ? __uint_as_float(cuda::tf32_small(v, big)) : 0.f,
          finite ? __uint_as_float(big) : 0.f};
}
// tf32_parts of V values, each part as one vector.
template <int V>
struct Tf32PartsVec {
  Vec<float, V> big, small, big_finite;
};
template <int V>
__device__ __forceinline__ Tf32PartsVec<V> tf32_parts(const Vec<float, V>& v) {
  Tf32PartsVec<V> r;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const Tf32Parts p = tf32_parts(v.v[k]);
    r.big.v[k] = p.big;
    r.small.v[k] = p.small;
    r.big_finite.v[k] = p.big_finite;
  }
  return r;
}

// The forward's x3 steps (use_x3_steps) stack h_{t-1}'s parts in rows and W_hh's along K, so
// that one TF32 GEMM sums the products of a step:
//   rec[2B, G] = hx[2B, 2H] · wx[G, 2H]ᵀ,  wx's row g: [W_big | W_small] of W_hh's row g,
//   hx's row b: [h_big | h_big'], row B + b: [h_small | h_small]  (b < B),
// so rec[b] = big·big + big'·small and rec[B + b] = small·big + small·small, and the step adds
// both rows. With ' an inf in h reaches the sum only through big·big, as in a float32 GEMM; an
// inf in W_hh reaches small·big too (NaN where h's small part is 0), as in the persistent and
// fused loops' products. Stacking h reads W_hh's parts once (2 × W_hh per step), where both
// operands' three parts along K (K = 3H) read 3 × W_hh: on an H200 at B = 64, H = 1024, 11.2
// against 16.7 µs a GEMM (float32's own: 22.0; dev micro-benchmark, docs/benchmarks.md).
// `width`: the column offset of a row's second part (H; the backward's x3 dh: G).
template <int V>
__device__ __forceinline__ void store_x3_stacked(float* big_row, float* small_row, int64_t width,
                                                 const Vec<float, V>& v) {
  const Tf32PartsVec<V> p = tf32_parts(v);
  store_vec<V>(big_row, p.big);
  store_vec<V>(big_row + width, p.big_finite);
  store_vec<V>(small_row, p.small);
  store_vec<V>(small_row + width, p.small);
}

// fn(r) for the row blocks r < blocks that sum to a step's recurrent product (step_k_parts' K
// parts; the x3 steps' halves), unrolled with uniform predicates so that every block's loads can
// issue before the adds.
template <int kMax, class Fn>
__device__ __forceinline__ void for_each_block(int blocks, Fn&& fn) {
#pragma unroll
  for (int r = 0; r < kMax; ++r) {
    if (r < blocks) fn(r);
  }
}

// Blocks for a grid-stride kernel over work_items items (at least one block).
unsigned int blocks_for(int64_t work_items) {
  const int64_t blocks = (work_items + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t global_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// ---------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------

// The bias of V consecutive gate rows: bias_sum (lstm_device.cuh) with vector loads. The loop
// kernels add the biases themselves (a separate bias-sum kernel cost a launch and an allocation
// per forward call, in front of the loop on the host's critical path); zeros without bias.
template <int V, class scalar_t, class acc_t = at::opmath_type<scalar_t>>
__device__ __forceinline__ Vec<acc_t, V> bias_vec(const scalar_t* b_ih, const scalar_t* b_hh, int64_t j) {
  Vec<acc_t, V> r{};
  if (b_ih != nullptr) {
    const Vec<scalar_t, V> x = load_vec<V>(b_ih + j), y = load_vec<V>(b_hh + j);
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = static_cast<acc_t>(x.v[k]) + static_cast<acc_t>(y.v[k]);
  }
  return r;
}

// float32 with TF32: the replayed forward's product rec = h_{t-1}·W_hhᵀ on fp16 operands
// (lstm_forward_replayed; fp16 has TF32's 10-bit mantissa): W_hh's rows scaled by powers of two
// (exact), h0's rows too at the first step, and h_t = o·tanh(c) in [-1, 1] unscaled after it. The
// step kernel unscales the parts' sum by its row's and its gate row's inverse scales and writes
// h_t in fp16 for the next step's GEMM.
struct HalfRecStep {
  c10::Half* h;              // [B, H] out: h_t, the next product's A operand
  const float* w_unscale;    // [G]: W_hh's rows' inverse scales
  const float* h0_unscale;   // [B]: h0's rows' (the first step's A operand)
  int64_t step;              // the processing step; 0: rec is h0·W_hhᵀ
};

// One forward time step, fused: bias, gate nonlinearities, cell update, output. A thread owns
// V consecutive hidden units j of one batch row b (V = 4: 16-byte loads of the fp32 data).
// kRec: the recurrent product is in `rec` (rec_blocks row blocks of [bt, G], rec_stride
// elements apart, which the kernel sums: the replayed loop's fixed GEMM output, split along K by
// step_k_parts and/or into the x3 steps' two halves) rather than already added into `pre`. The
// step's GEMM is then the kernel launched just before this one, possibly with the PDL
// attribute: `pre` and the biases, written before the loop started, are loaded before
// pdl_wait(); rec and cbuf after it, from L2 (load_vec_cg), and every store follows it (the GEMM
// reads hbuf). cbuf too: the previous step's kernel wrote it, and that it finished before this
// one started holds only if cuBLAS launched the GEMM without PDL. kHalfRec (with kRec, float32):
// rec is the product on fp16 operands, unscaled here, and h_t goes to `half` too (HalfRecStep).
template <class scalar_t, class acc_t, int V, bool kTraining, bool kRec, bool kHalfRec = false>
__device__ __forceinline__ void forward_step_rows(
    const acc_t* __restrict__ pre,   // [bt, G] this step's x·W_ihᵀ (+ h_{t-1}·W_hhᵀ unless kRec), no bias; gates i, f, g, o
    const acc_t* __restrict__ rec,   // [rec_blocks][bt, G] (kRec), summing to h_{t-1}·W_hhᵀ; else unused
    int rec_blocks,                  // 1 to kMaxRecBlocks
    int64_t rec_stride,              // elements between blocks
    const scalar_t* __restrict__ b_ih,  // [G] input-hidden bias, or nullptr without bias
    const scalar_t* __restrict__ b_hh,  // [G] hidden-hidden bias (with b_ih)
    acc_t* __restrict__ cbuf,        // [B, H] rows [0, bt): c_{t-1} on entry, c_t on exit
    scalar_t* __restrict__ gates,    // [bt, G] out (kTraining): activated gates i, f, g, o of this step
    scalar_t* __restrict__ cells,    // [bt, H] out (kTraining): c_t of this step
    scalar_t* __restrict__ m_out,    // [bt, H] out: m_t = o ⊙ tanh(c_t): y rows (Hout = H) or the projection's input
    scalar_t* __restrict__ hbuf,     // [B, Hout] out rows [0, bt): h_t = m_t; nullptr with projection
    scalar_t* __restrict__ hx,       // [B, 2H] out rows [0, bt): h_t's big parts (x3 steps, float32), or nullptr
    scalar_t* __restrict__ hx_small, // [B, 2H] out rows [0, bt): its small parts (with hx)
    int64_t bt,                      // rows of this step (batch_sizes[t])
    int64_t H,                       // hidden size; H % V == 0
    HalfRecStep half = {}) {         // kHalfRec only
  static_assert(!kHalfRec || (kRec && std::is_same_v<scalar_t, float>),
                "the fp16 product is the replayed float32 loop's");
  const int64_t G = 4 * H;
  const int64_t HV = H / V;
  const int64_t total = bt * HV;
  for (int64_t idx = global_thread(); idx < total; idx += global_stride()) {
    const int64_t b = idx / HV;
    const int64_t j = (idx - b * HV) * V;
    const acc_t* p = pre + b * G + j;
    Vec<acc_t, V> pi = load_vec<V>(p);
    Vec<acc_t, V> pf = load_vec<V>(p + H);
    Vec<acc_t, V> pg = load_vec<V>(p + 2 * H);
    Vec<acc_t, V> po = load_vec<V>(p + 3 * H);
    const Vec<acc_t, V> bi = bias_vec<V>(b_ih, b_hh, j), bf = bias_vec<V>(b_ih, b_hh, H + j),
                        bg = bias_vec<V>(b_ih, b_hh, 2 * H + j), bo = bias_vec<V>(b_ih, b_hh, 3 * H + j);
    if constexpr (kRec) cuda::pdl_wait();
    Vec<acc_t, V> c = load_vec_from<kRec, V>(cbuf + b * H + j);
    if constexpr (kRec) {
      // A row of the product's four gates (from L2: written by the GEMM before this kernel).
      auto add_rec = [&](const acc_t* r) {
        const Vec<acc_t, V> ri = load_vec_cg<V>(r), rf = load_vec_cg<V>(r + H), rg = load_vec_cg<V>(r + 2 * H),
                            ro = load_vec_cg<V>(r + 3 * H);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          pi.v[k] += ri.v[k];
          pf.v[k] += rf.v[k];
          pg.v[k] += rg.v[k];
          po.v[k] += ro.v[k];
        }
      };
      if constexpr (kHalfRec) {
        // The parts' sum, then two exact products (the gate rows' scales, and h0's at the first step).
        const Vec<float, V> wi = load_vec<V>(half.w_unscale + j), wf = load_vec<V>(half.w_unscale + H + j),
                            wg = load_vec<V>(half.w_unscale + 2 * H + j), wo = load_vec<V>(half.w_unscale + 3 * H + j);
        const float row = half.step == 0 ? half.h0_unscale[b] : 1.0f;
        const Vec<acc_t, V> qi = pi, qf = pf, qg = pg, qo = po;
        pi = pf = pg = po = Vec<acc_t, V>{};
        for_each_block<kMaxRecBlocks>(rec_blocks, [&](int r) { add_rec(rec + r * rec_stride + b * G + j); });
#pragma unroll
        for (int k = 0; k < V; ++k) {
          pi.v[k] = qi.v[k] + pi.v[k] * row * wi.v[k];
          pf.v[k] = qf.v[k] + pf.v[k] * row * wf.v[k];
          pg.v[k] = qg.v[k] + pg.v[k] * row * wg.v[k];
          po.v[k] = qo.v[k] + po.v[k] * row * wo.v[k];
        }
      } else {
        for_each_block<kMaxRecBlocks>(rec_blocks, [&](int r) { add_rec(rec + r * rec_stride + b * G + j); });
      }
    }
    Vec<scalar_t, V> ai, af, ag, ao, cs, m;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const LstmGates<acc_t> pre_k{pi.v[k] + bi.v[k], pf.v[k] + bf.v[k], pg.v[k] + bg.v[k], po.v[k] + bo.v[k]};
      LstmGates<acc_t> act;
      acc_t c_new, m_new;
      lstm_cell_forward<CudaMath>(pre_k, c.v[k], act, c_new, m_new);
      c.v[k] = c_new;
      m.v[k] = static_cast<scalar_t>(m_new);
      if constexpr (kTraining) {
        ai.v[k] = static_cast<scalar_t>(act.i);
        af.v[k] = static_cast<scalar_t>(act.f);
        ag.v[k] = static_cast<scalar_t>(act.g);
        ao.v[k] = static_cast<scalar_t>(act.o);
        cs.v[k] = static_cast<scalar_t>(c_new);
      }
    }
    store_vec<V>(cbuf + b * H + j, c);
    store_vec<V>(m_out + b * H + j, m);
    if (hbuf != nullptr) store_vec<V>(hbuf + b * H + j, m);
    if constexpr (kHalfRec) {
      Vec<c10::Half, V> mh;
#pragma unroll
      for (int k = 0; k < V; ++k) mh.v[k] = c10::Half(m.v[k]);
      store_vec<V>(half.h + b * H + j, mh);
    }
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (hx != nullptr) store_x3_stacked<V>(hx + b * 2 * H + j, hx_small + b * 2 * H + j, H, m);
    }
    if constexpr (kTraining) {
      scalar_t* g = gates + b * G + j;
      store_vec<V>(g, ai);
      store_vec<V>(g + H, af);
      store_vec<V>(g + 2 * H, ag);
      store_vec<V>(g + 3 * H, ao);
      store_vec<V>(cells + b * H + j, cs);
    }
  }
}

// The cuBLAS loop's forward step: forward_step_rows on the step's rows, one unit per thread
// (lstm_forward_impl says why). kRec: x3 steps, the product in rec's two row blocks.
template <class scalar_t, class acc_t, bool kTraining, bool kRec>
__global__ void __launch_bounds__(kThreads) lstm_forward_step_kernel(
    const acc_t* __restrict__ pre, const acc_t* __restrict__ rec, int rec_blocks, int64_t rec_stride,
    const scalar_t* __restrict__ b_ih, const scalar_t* __restrict__ b_hh, acc_t* __restrict__ cbuf,
    scalar_t* __restrict__ gates, scalar_t* __restrict__ cells, scalar_t* __restrict__ m_out,
    scalar_t* __restrict__ hbuf, scalar_t* __restrict__ hx, scalar_t* __restrict__ hx_small, int64_t bt, int64_t H) {
  forward_step_rows<scalar_t, acc_t, 1, kTraining, kRec>(pre, rec, rec_blocks, rec_stride, b_ih, b_hh, cbuf, gates,
                                                         cells, m_out, hbuf, hx, hx_small, bt, H);
}

// Projection, backward: dL/dh_t = the later step's (dhbuf, or grad_h_n) + the step's grad_y, rounded to
// scalar_t (it is both the A operand of dm = dh·W_hr and a row block of dHtot for grad_w_hr). The plain
// and the replayed loop's kernels both take it from here.
template <class scalar_t, class acc_t>
__device__ __forceinline__ scalar_t projected_dh(acc_t later, scalar_t grad_y) {
  return static_cast<scalar_t>(later + static_cast<acc_t>(grad_y));
}

template <class scalar_t, class acc_t>
__global__ void __launch_bounds__(kThreads) lstm_backward_dh_kernel(
    const acc_t* __restrict__ dhbuf,     // [B, P] rows [0, bt): dL/dh_t from step t+1 (or grad_h_n)
    const scalar_t* __restrict__ grad_y, // [bt, P] dL/dy of this step's rows
    scalar_t* __restrict__ dh,           // [bt, P] out: dHtot rows of this step
    int64_t count) {                     // bt * P
  for (int64_t i = global_thread(); i < count; i += global_stride()) {
    dh[i] = projected_dh<scalar_t, acc_t>(dhbuf[i], grad_y[i]);
  }
}

// The final cell state in the input's type (half types keep c in float): c_n = cbuf.
template <class scalar_t, class acc_t>
__global__ void __launch_bounds__(kThreads) cell_state_out_kernel(const acc_t* __restrict__ cbuf,  // [B, H]
                                                                   scalar_t* __restrict__ c_n,       // [B, H] out
                                                                   int64_t count) {                  // B * H
  for (int64_t i = global_thread(); i < count; i += global_stride()) c_n[i] = static_cast<scalar_t>(cbuf[i]);
}

// float32 with TF32: the replayed backward's dh GEMM on fp16 operands scaled by powers of two
// (lstm_backward_replayed; fp16 has TF32's 10-bit mantissa, and the scales are exact). The step's
// dG is that GEMM's A operand, its K split into `parts` (step_k_parts); part p of row b holds the
// four gates of units [p·U, (p+1)·U), U = H / parts, in part order (column p·4U + gate·U + u), so
// that one block of U threads writes all of it and can scale it by its own largest magnitude.
// W_hh's rows are in the same order, scaled per (part, column) (scale_w_hh_parts_kernel); a part's
// product is then unscaled by its row's and its column's inverse scales, where the step sums it.
//
// x3 dh on fp16 parts (float32 without TF32, `x3`): each scaled operand is also kept as its
// remainder, scaled by 2^11 (half_remainder: the two fp16 values hold 22 bits, as x3's two TF32
// parts do), dG's remainders in rows [B, 2B) of the A operand and W_hh's in columns [H, 2H) of the
// B operand, so that each K part's product is one [2B, 2H] block holding big·big (rows < B, columns
// < H) and the two cross terms big·rem and rem·big (half_dh_part adds them at 2^-11; the fourth
// quadrant, rem·rem, is not read). Against x3's TF32 parts: half the bytes of W_hh's
// parts a step and fp16's tensor-core rate (H200, one GEMM of B = 64, H = 512 in 4 K parts: 4.3
// against 9.5 µs; docs/benchmarks.md).
struct HalfDhStep {
  c10::Half* dG;             // [B, G] ([2B, G] x3) out: this step's dG, scaled, in part order
  float* row_unscale;        // [2][B, parts]: the inverse scales of the rows' parts; step s writes
                             // half s % 2 and reads the previous step's (dh_in's) from the other
  const float* w_unscale;    // [parts, H]: W_hh's (part, column) inverse scales
  int64_t step;              // the processing step; 0: dh_in is grad_h_n (unscaled), not a product
  bool x3;                   // the split operands above
};

// x3 on fp16 parts: the remainder of a scaled value past its fp16 part big, times 2^11 (the
// subtraction is exact); 0 for inf and NaN, whose big part carries them (so an inf reaches the
// sum only through big·big, as in a float32 GEMM: half_dh_part).
constexpr float kHalfRemainderScale = 2048.0f;
constexpr float kHalfRemainderUnscale = 1.0f / 2048.0f;
__device__ __forceinline__ c10::Half half_remainder(float scaled, c10::Half big) {
  return c10::Half(isfinite(scaled) ? (scaled - static_cast<float>(big)) * kHalfRemainderScale : 0.0f);
}
// A product on these parts, still scaled: big·big (`whole`) plus the two cross terms at 2^-11, or
// `whole` alone where it is not finite (an inf or NaN in an operand: the cross terms would add
// NaN, inf times a remainder of either sign), as in a float32 GEMM.
__device__ __forceinline__ float half_parts_sum(float whole, float cross) {
  return isfinite(whole) ? fmaf(cross, kHalfRemainderUnscale, whole) : whole;
}
// n elements of T padded to whole 16-byte vectors: rows that cuBLASLt's aligned kernels take.
template <class T>
constexpr int64_t padded_to_vectors(int64_t n) {
  constexpr int64_t kPerVector = 16 / sizeof(T);
  return (n + kPerVector - 1) / kPerVector * kPerVector;
}

// kHalfDh's store of unit j's four gate gradients in row b of bt (backward_step_rows; `parts` K
// parts, U = H / parts): the block, row b's part p = j / U, agrees on the power of two that takes
// its largest finite magnitude into [2^14, 2^15). Once per block (its shared maxima are not reused).
__device__ __forceinline__ void store_half_dh(const HalfDhStep& half, int parts, int64_t b, int64_t bt, int64_t j,
                                              int64_t H, float di, float df, float dg, float dout) {
  __shared__ float warp_maxima[kThreads / 32];
  using cuda::finite_abs_max;
  float m = cuda::warp_max(finite_abs_max(finite_abs_max(finite_abs_max(finite_abs_max(0.0f, di), df), dg), dout));
  if ((threadIdx.x & 31) == 0) warp_maxima[threadIdx.x / 32] = m;
  __syncthreads();
  for (unsigned int w = 0; w < blockDim.x / 32; ++w) m = fmaxf(m, warp_maxima[w]);
  float scale, unscale;
  cuda::power_of_two_scales(m, scale, unscale);
  const int64_t U = H / parts, p = j / U, u = j - p * U;
  c10::Half* d = half.dG + b * 4 * H + p * 4 * U + u;
  const float gates[4] = {di, df, dg, dout};
#pragma unroll
  for (int gate = 0; gate < 4; ++gate) {
    const float scaled = gates[gate] * scale;
    const c10::Half big(scaled);
    d[gate * U] = big;
    if (half.x3) d[bt * 4 * H + gate * U] = half_remainder(scaled, big);  // row bt + b
  }
  if (u == 0) half.row_unscale[((half.step & 1) * bt + b) * parts + p] = unscale;
}

// kHalfDh: part r's term of dL/dh_t[b, j] from the previous step's dh GEMM (dh_in: `parts`
// [bt, H] blocks, x3 [2bt, 2H], half_parts_sum), unscaled; at the first step block r of grad_h_n
// as the prologue wrote it ([bt, H] blocks, block 0 grad_h_n, the others zero).
__device__ __forceinline__ float half_dh_part(const HalfDhStep& half, const float* __restrict__ dh_in, int parts,
                                              int r, int64_t b, int64_t bt, int64_t j, int64_t H) {
  if (half.step == 0) return __ldcg(dh_in + (r * bt + b) * H + j);
  float v;
  if (half.x3) {
    const float* c = dh_in + (r * 4 * bt + b * 2) * H + j;  // part r's block, row b, column j
    v = half_parts_sum(__ldcg(c), __ldcg(c + H) + __ldcg(c + bt * 2 * H));  // big·big; big·rem, rem·big
  } else {
    v = __ldcg(dh_in + (r * bt + b) * H + j);
  }
  const float* prev = half.row_unscale + ((half.step + 1) & 1) * bt * parts;
  return v * __ldcg(prev + b * parts + r) * half.w_unscale[r * H + j];
}

// One backward time step, fused: gradients of the pre-activations, of c_{t-1}, the
// recomputed m_t (projection), and the gathered h_{t-1} rows (for grad_w_hh). A thread owns V
// consecutive hidden units of one batch row; with projection V = 1. kCopy: dG is also written
// to dG_copy ([bt, G], the replayed loop's fixed operand of the step's dh GEMM), and the kernel
// launched just before this one (the previous step's dh GEMM, which wrote dh_in and read
// dG_copy) may still run (PDL): what the forward wrote is loaded before pdl_wait(), dh_in and
// dcbuf after it from L2 (load_vec_cg; the previous step's kernel wrote dcbuf, and cuBLAS may
// launch that GEMM with PDL too: forward_step_rows), and every store follows it. kHalfDh (with
// kCopy, V = 1, no projection): the copy is `half`'s scaled fp16 dG instead, and dh_in's parts
// are unscaled as they are summed; the launch must give each block the U units of one row's part
// (grid B·parts, U threads: HalfDhStep), so that every thread of a block runs the loop once.
// kX3Dh (with kCopy, float32, no projection): the copy is dG's TF32 parts stacked as the x3 steps
// stack h's (store_x3_stacked with width G: dG_copy [2bt, 2G]), for the x3 dh GEMM.
template <class scalar_t, class acc_t, int V, bool kProj, bool kCopy, bool kHalfDh = false, bool kX3Dh = false>
__device__ __forceinline__ void backward_step_rows(
    const scalar_t* __restrict__ gates,       // [bt, G] activated gates i, f, g, o of step t
    const scalar_t* __restrict__ cells,       // [bt, H] c_t of step t
    const scalar_t* __restrict__ prev_cells,  // [n_prev, H] c_{t-1} of rows b < n_prev (cells rows of the previous-state step)
    const scalar_t* __restrict__ prev_y,      // [n_prev, Hout] h_{t-1} of rows b < n_prev (y rows of that step)
    int64_t n_prev,                           // rows [0, n_prev) continue a sequence, rows [n_prev, bt) start from h0 / c0
    const scalar_t* __restrict__ h0,          // [B, Hout] initial hidden state
    const scalar_t* __restrict__ c0,          // [B, H] initial cell state
    const scalar_t* __restrict__ grad_y,      // [bt, Hout] dL/dy of step t (!kProj); unused with projection
    const acc_t* __restrict__ dh_in,          // !kProj: [B, Hout] dhbuf rows [0, bt); kProj: [B, H] dm = dh·W_hr rows [0, bt)
    int dh_blocks,                            // !kProj: dh_in's row blocks (1 to kMaxDhBlocks) that sum to dL/dh_t
    int64_t dh_stride,                        // elements between them
    acc_t* __restrict__ dcbuf,                // [B, H] rows [0, bt): dL/dc_t on entry, dL/dc_{t-1} on exit
    scalar_t* __restrict__ dG,                // [bt, G] out: dL/d(pre-activations) of step t
    scalar_t* __restrict__ dG_copy,           // [bt, G] out (kCopy): dG again ([2bt, 2G] kX3Dh); unused otherwise
    scalar_t* __restrict__ m_out,             // [bt, H] out (kProj): recomputed m_t; unused otherwise
    scalar_t* __restrict__ hprev,             // [bt, Hout] out: h_{t-1} of every row of step t
    int64_t bt,                               // rows of this step
    int64_t H,                                // hidden size; H % V == 0
    int64_t Hout,                             // P with projection, else H
    HalfDhStep half = {},                     // kHalfDh only
    const scalar_t* __restrict__ dh_late = nullptr,  // !kProj: [B, Hout] dL/dh_t of rows b >= dh_rows (grad_h_n)
    int64_t dh_rows = INT64_MAX) {            // !kProj: rows [0, dh_rows) take dh_in's blocks (below)
  static_assert(!kHalfDh || (kCopy && V == 1 && !kProj && std::is_same_v<acc_t, float>),
                "the scaled fp16 dh GEMM is the replayed float32 loop's");
  static_assert(!kX3Dh || (kCopy && !kHalfDh && !kProj && std::is_same_v<scalar_t, float>),
                "the x3 dh GEMM is the replayed float32 loop's");
  const int64_t G = 4 * H;
  const int64_t HV = H / V;
  const int64_t total = bt * HV;
  for (int64_t idx = global_thread(); idx < total; idx += global_stride()) {
    const int64_t b = idx / HV;
    const int64_t j = (idx - b * HV) * V;
    const bool cont = b < n_prev;
    const scalar_t* g = gates + b * G + j;
    const Vec<scalar_t, V> ai = load_vec<V>(g);
    const Vec<scalar_t, V> af = load_vec<V>(g + H);
    const Vec<scalar_t, V> ag = load_vec<V>(g + 2 * H);
    const Vec<scalar_t, V> ao = load_vec<V>(g + 3 * H);
    const Vec<scalar_t, V> c = load_vec<V>(cells + b * H + j);
    const Vec<scalar_t, V> cp = load_vec<V>(cont ? prev_cells + b * H + j : c0 + b * H + j);
    const scalar_t* hsrc = cont ? prev_y + b * Hout : h0 + b * Hout;
    Vec<scalar_t, V> hp{}, gy{};
    if constexpr (!kProj) {
      hp = load_vec<V>(hsrc + j);  // copied to hprev below
      gy = load_vec<V>(grad_y + b * Hout + j);
    }
    if constexpr (kCopy) cuda::pdl_wait();
    Vec<acc_t, V> dc = load_vec_from<kCopy, V>(dcbuf + b * H + j);
    Vec<acc_t, V> dm;
    if constexpr (kProj) {
      dm = load_vec_from<kCopy, V>(dh_in + b * H + j);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) dm.v[k] = static_cast<acc_t>(gy.v[k]);
      if (b < dh_rows) {
        for_each_block<kMaxDhBlocks>(dh_blocks, [&](int r) {
          if constexpr (kHalfDh) {  // exact products (the previous step wrote the row's scale)
            dm.v[0] += half_dh_part(half, dh_in, dh_blocks, r, b, bt, j, H);
          } else {
            const Vec<acc_t, V> dh = load_vec_from<kCopy, V>(dh_in + r * dh_stride + b * Hout + j);
#pragma unroll
            for (int k = 0; k < V; ++k) dm.v[k] += dh.v[k];
          }
        });
      } else {  // a sequence's last step, later than the step whose product dh_in holds (ragged replay)
        const Vec<scalar_t, V> dh = load_vec<V>(dh_late + b * Hout + j);
#pragma unroll
        for (int k = 0; k < V; ++k) dm.v[k] += static_cast<acc_t>(dh.v[k]);
      }
    }
    Vec<scalar_t, V> di, df, dg, dout, m;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const LstmGates<acc_t> act{static_cast<acc_t>(ai.v[k]), static_cast<acc_t>(af.v[k]),
                                 static_cast<acc_t>(ag.v[k]), static_cast<acc_t>(ao.v[k])};
      LstmGates<acc_t> dpre;
      acc_t dc_prev, m_k;
      lstm_cell_backward<CudaMath>(act, static_cast<acc_t>(c.v[k]), static_cast<acc_t>(cp.v[k]), dm.v[k], dc.v[k],
                                   dpre, dc_prev, m_k);
      dc.v[k] = dc_prev;
      di.v[k] = static_cast<scalar_t>(dpre.i);
      df.v[k] = static_cast<scalar_t>(dpre.f);
      dg.v[k] = static_cast<scalar_t>(dpre.g);
      dout.v[k] = static_cast<scalar_t>(dpre.o);
      m.v[k] = static_cast<scalar_t>(m_k);
    }
    store_vec<V>(dcbuf + b * H + j, dc);
    scalar_t* d = dG + b * G + j;
    store_vec<V>(d, di);
    store_vec<V>(d + H, df);
    store_vec<V>(d + 2 * H, dg);
    store_vec<V>(d + 3 * H, dout);
    if constexpr (kHalfDh) {
      store_half_dh(half, dh_blocks, b, bt, j, H, di.v[0], df.v[0], dg.v[0], dout.v[0]);
    } else if constexpr (kX3Dh) {
      float* big = dG_copy + b * 2 * G + j;
      float* small = dG_copy + (bt + b) * 2 * G + j;
      store_x3_stacked<V>(big, small, G, di);
      store_x3_stacked<V>(big + H, small + H, G, df);
      store_x3_stacked<V>(big + 2 * H, small + 2 * H, G, dg);
      store_x3_stacked<V>(big + 3 * H, small + 3 * H, G, dout);
    } else if constexpr (kCopy) {
      scalar_t* d2 = dG_copy + b * G + j;
      store_vec<V>(d2, di);
      store_vec<V>(d2 + H, df);
      store_vec<V>(d2 + 2 * H, dg);
      store_vec<V>(d2 + 3 * H, dout);
    }
    if constexpr (kProj) {
      static_assert(V == 1, "the projection path moves single elements");
      m_out[b * H + j] = m.v[0];
      // Hout = P columns of h_{t-1}, spread over the H threads of the row.
      for (int64_t col = j; col < Hout; col += H) hprev[b * Hout + col] = hsrc[col];
    } else {
      store_vec<V>(hprev + b * Hout + j, hp);
    }
  }
}

// The cuBLAS loop's backward step: backward_step_rows on the step's rows.
template <class scalar_t, class acc_t, int V, bool kProj>
__global__ void __launch_bounds__(kThreads) lstm_backward_step_kernel(
    const scalar_t* __restrict__ gates, const scalar_t* __restrict__ cells, const scalar_t* __restrict__ prev_cells,
    const scalar_t* __restrict__ prev_y, int64_t n_prev, const scalar_t* __restrict__ h0,
    const scalar_t* __restrict__ c0, const scalar_t* __restrict__ grad_y, const acc_t* __restrict__ dh_in,
    acc_t* __restrict__ dcbuf, scalar_t* __restrict__ dG, scalar_t* __restrict__ m_out,
    scalar_t* __restrict__ hprev, int64_t bt, int64_t H, int64_t Hout) {
  backward_step_rows<scalar_t, acc_t, V, kProj, false>(gates, cells, prev_cells, prev_y, n_prev, h0, c0, grad_y,
                                                       dh_in, 1, 0, dcbuf, dG, nullptr, m_out, hprev, bt, H, Hout);
}

// ---------------------------------------------------------------------------------------
// Kernels of the replayed cuBLAS loop (replayed_steps.cuh, lstm_forward_replayed below)
// ---------------------------------------------------------------------------------------

// What a replayed step reads of its call. One captured graph serves every call of its key, so
// the per-call pointers cannot be kernel arguments: replay_prologue_kernel writes them into
// the kept entry's device memory at the start of each call. `step` is the processing step the
// next chunk starts at; each chunk's last node advances it.
template <class scalar_t, class acc_t>
struct ForwardReplayArgs {
  const acc_t* pre;       // [N, G] x·W_ihᵀ, no bias
  const scalar_t* b_ih;   // [G] or nullptr
  const scalar_t* b_hh;   // [G] or nullptr
  scalar_t* gates;        // [N, G] out (training)
  scalar_t* cells;        // [N, H] out (training)
  scalar_t* y;            // [N, Hout] out
  int64_t T;
  int64_t step;
  bool reverse;           // the layer's direction: step s is time T - 1 - s
  const int64_t* steps;   // ragged: [2, T] batch_sizes[t] and offsets[t] (replayed_step_rows); else nullptr
};

template <class scalar_t>
struct BackwardReplayArgs {
  const scalar_t* gates;   // [N, G] saved activated gates
  const scalar_t* cells;   // [N, H] saved c_t
  const scalar_t* y;       // [N, Hout] the forward's outputs (h_t)
  const scalar_t* grad_y;  // [N, Hout]
  const scalar_t* h0;      // [B, Hout]
  const scalar_t* c0;      // [B, H]
  scalar_t* dG;            // [N, G] out
  scalar_t* hprev;         // [N, Hout] out
  int64_t T;
  int64_t step;
  bool reverse;            // the layer's direction (the backward walks it the other way)
  scalar_t* dHtot;         // [N, P] out with a projection: dL/dh_t of every row (for grad_w_hr); else nullptr
  scalar_t* M;             // [N, H] out with a projection: the recomputed m_t (for grad_w_hr); else nullptr
  const int64_t* steps;    // ragged: [2, T] batch_sizes[t] and offsets[t] (replayed_step_rows); else nullptr
  const scalar_t* grad_h_n;  // ragged: [B, H] dL/dh of each sequence's last step
  at::opmath_type<scalar_t>* dh0;  // ragged, reverse: [B, H] out, grad_h0 of the rows that end before the last step
};

// A replayed step's rows: bt = batch_sizes[t] from the first packed row off = offsets[t]; with
// equal batch sizes (no table) B rows from t·B.
struct ReplayedRows {
  int64_t bt, off;
};
__device__ __forceinline__ ReplayedRows replayed_step_rows(const int64_t* steps, int64_t T, int64_t t, int64_t B) {
  if (steps == nullptr) return {B, t * B};
  return {steps[t], steps[T + t]};
}

// Step k of a chunk: forward_step_rows on the B rows of time t, the recurrent product in rec.
template <class scalar_t, class acc_t, int V, bool kTraining, bool kHalfRec>
__global__ void __launch_bounds__(kThreads) lstm_forward_replay_step_kernel(
    const ForwardReplayArgs<scalar_t, acc_t>* __restrict__ args, int k,
    const acc_t* __restrict__ rec,  // [rec_blocks][B, G] summing to h_{t-1}·W_hhᵀ (K parts; x3 steps' halves)
    int rec_blocks,
    acc_t* __restrict__ cbuf,       // [B, H] c_{t-1} on entry, c_t on exit
    scalar_t* __restrict__ hbuf,    // [B, H] out: h_t (the next step's GEMM operand, or h_n with x3 steps)
    scalar_t* __restrict__ hx,      // [2B, 2H] out: h_t's parts (x3 steps: the next step's GEMM operand), or nullptr
    int64_t B, int64_t H,
    HalfRecStep half) {             // kHalfRec: the GEMM's fp16 operands (its `step` set here)
  const ForwardReplayArgs<scalar_t, acc_t> a = *args;
  // Ragged: the step's bt rows of the B that the GEMM multiplied (rows past bt keep their state).
  const ReplayedRows rows =
      replayed_step_rows(a.steps, a.T, cuda::replayed_forward_times(a.step + k, a.T, a.reverse).t, B);
  const int64_t off = rows.off, G = 4 * H;
  half.step = a.step + k;
  forward_step_rows<scalar_t, acc_t, V, kTraining, true, kHalfRec>(
      a.pre + off * G, rec, rec_blocks, B * G, a.b_ih, a.b_hh, cbuf,
      kTraining ? a.gates + off * G : nullptr, kTraining ? a.cells + off * H : nullptr, a.y + off * H, hbuf, hx,
      hx != nullptr ? hx + B * 2 * H : nullptr, rows.bt, H, half);
}

// Step k of a backward chunk: backward_step_rows on the B rows of time t, one unit per thread
// (lstm_backward_replayed says why); dG also to dG_step, the fixed operand of the step's dh GEMM
// (kHalfDh: scaled fp16, HalfDhStep; kX3Dh: the stacked TF32 parts).
template <class scalar_t, class acc_t, bool kHalfDh, bool kX3Dh>
__global__ void __launch_bounds__(kThreads) lstm_backward_replay_step_kernel(
    const BackwardReplayArgs<scalar_t>* __restrict__ args, int k,
    const acc_t* __restrict__ dhbuf,  // [dh_blocks][B, H] summing to dL/dh_t from the later step (or grad_h_n)
    int dh_blocks,                    // the dh GEMM's K parts (step_k_parts)
    acc_t* __restrict__ dcbuf,        // [B, H] dL/dc_t on entry, dL/dc_{t-1} on exit
    scalar_t* __restrict__ dG_step,   // [B, G] ([2B, 2G] kX3Dh) out: the GEMM's A operand; nullptr with kHalfDh
    int64_t B, int64_t H,
    HalfDhStep half) {                // kHalfDh: the A operand instead (its `step` set here)
  const BackwardReplayArgs<scalar_t> a = *args;
  // prev: the step whose state time t started from (previous_step()); its first `prev.bt` rows
  // continue there, the others start from h0 / c0.
  const cuda::ReplayedTimes times = cuda::replayed_backward_times(a.step + k, a.T, a.reverse);
  const ReplayedRows rows = replayed_step_rows(a.steps, a.T, times.t, B);
  const ReplayedRows prev = times.has_prev ? replayed_step_rows(a.steps, a.T, times.prev_t, B) : ReplayedRows{0, 0};
  const int64_t prev_rows = a.reverse ? prev.bt : rows.bt;  // (going forward every row of t ran at t - 1)
  const int64_t off = rows.off, G = 4 * H;
  // dhbuf holds dL/dh_t for the rows of the step processed before this one (grad_h_n's rows at
  // the first step). Ragged, in the forward direction the rows past those run their last step here
  // and take grad_h_n's; in reverse the rows past this step's ended at that step, and its product
  // is their grad_h0 (kept before this step's GEMM overwrites it).
  int64_t dh_rows = B;
  if (a.steps != nullptr && a.step + k > 0) {
    const int64_t t_before = a.reverse ? times.t - 1 : times.t + 1;
    dh_rows = replayed_step_rows(a.steps, a.T, t_before, B).bt;
    if (rows.bt < dh_rows) {
      cuda::pdl_wait();
      for (int64_t i = rows.bt * H + global_thread(); i < dh_rows * H; i += global_stride()) {
        acc_t sum = 0;
        for (int r = 0; r < dh_blocks; ++r) sum += __ldcg(dhbuf + r * B * H + i);
        a.dh0[i] = sum;
      }
    }
  }
  half.step = a.step + k;
  backward_step_rows<scalar_t, acc_t, 1, false, true, kHalfDh, kX3Dh>(
      a.gates + off * G, a.cells + off * H, times.has_prev ? a.cells + prev.off * H : nullptr,
      times.has_prev ? a.y + prev.off * H : nullptr, times.has_prev ? prev_rows : 0, a.h0, a.c0, a.grad_y + off * H,
      dhbuf, dh_blocks, B * H, dcbuf, a.dG + off * G, dG_step, nullptr, a.hprev + off * H, rows.bt, H, H, half,
      a.grad_h_n, dh_rows);
}

// With a projection (P > 0) a replayed forward step is three nodes: rec = h_{t-1}·W_hhᵀ, this
// kernel, and the projection GEMM h_t = m_t·W_hrᵀ into hbuf, which the next step's GEMM reads.
// The gate math writes m_t to mbuf, the projection's fixed A operand. y's rows are the call's,
// so h_{t-1} (hbuf, which this step's GEMM read and the step's projection rewrites after this
// kernel) goes into its rows of y here; the host copies the last step's.
template <class scalar_t, class acc_t, bool kTraining>
__global__ void __launch_bounds__(kThreads) lstm_forward_replay_projected_step_kernel(
    const ForwardReplayArgs<scalar_t, acc_t>* __restrict__ args, int k,
    const acc_t* __restrict__ rec,     // [B, G] h_{t-1}·W_hhᵀ
    acc_t* __restrict__ cbuf,          // [B, H] c_{t-1} on entry, c_t on exit
    scalar_t* __restrict__ mbuf,       // [B, H] out: m_t = o ⊙ tanh(c_t)
    const scalar_t* __restrict__ hbuf, // [B, P] h_{t-1}
    int64_t B, int64_t H, int64_t P) {
  const ForwardReplayArgs<scalar_t, acc_t> a = *args;
  const cuda::ReplayedTimes times = cuda::replayed_forward_times(a.step + k, a.T, a.reverse);
  const int64_t off = times.t * B, G = 4 * H;
  forward_step_rows<scalar_t, acc_t, 1, kTraining, true>(
      a.pre + off * G, rec, 1, B * G, a.b_ih, a.b_hh, cbuf, kTraining ? a.gates + off * G : nullptr,
      kTraining ? a.cells + off * H : nullptr, mbuf, nullptr, nullptr, nullptr, B, H);
  if (times.has_prev) {
    cuda::pdl_wait();  // (a thread without gate rows has not waited)
    scalar_t* y_prev = a.y + times.prev_t * B * P;
    for (int64_t i = global_thread(); i < B * P; i += global_stride()) y_prev[i] = hbuf[i];
  }
}

// A replayed backward step with a projection is four nodes: this kernel, dm = dh·W_hr, the gate
// kernel (lstm_backward_replay_projected_step_kernel) and dh_{t-1} = dG·W_hh. Here dh =
// dL/dh_t (dhbuf + grad_y of the step's rows), rounded to scalar_t as in the plain loop, into
// dH_step (the dm GEMM's fixed A operand) and the call's dHtot rows (grad_w_hr's operand).
template <class scalar_t, class acc_t>
__global__ void __launch_bounds__(kThreads) lstm_backward_replay_dh_kernel(
    const BackwardReplayArgs<scalar_t>* __restrict__ args, int k,
    const acc_t* __restrict__ dhbuf,  // [B, P] dL/dh_t from the later step (or grad_h_n)
    scalar_t* __restrict__ dH_step,   // [B, P] out
    int64_t B, int64_t P) {
  const BackwardReplayArgs<scalar_t> a = *args;
  const int64_t off = cuda::replayed_backward_times(a.step + k, a.T, a.reverse).t * B * P;
  for (int64_t i = global_thread(); i < B * P; i += global_stride()) {
    const scalar_t dh = projected_dh<scalar_t, acc_t>(dhbuf[i], a.grad_y[off + i]);
    dH_step[i] = dh;
    a.dHtot[off + i] = dh;
  }
}

// The projected backward's gate kernel: backward_step_rows on the B rows of time t with dm =
// dh·W_hr as its dL/dm_t, one unit per thread; dG also to dG_step, the dh GEMM's fixed operand.
template <class scalar_t, class acc_t>
__global__ void __launch_bounds__(kThreads) lstm_backward_replay_projected_step_kernel(
    const BackwardReplayArgs<scalar_t>* __restrict__ args, int k,
    const acc_t* __restrict__ dm,     // [B, H] dL/dm_t
    acc_t* __restrict__ dcbuf,        // [B, H] dL/dc_t on entry, dL/dc_{t-1} on exit
    scalar_t* __restrict__ dG_step,   // [B, G] out
    int64_t B, int64_t H, int64_t P) {
  const BackwardReplayArgs<scalar_t> a = *args;
  const cuda::ReplayedTimes times = cuda::replayed_backward_times(a.step + k, a.T, a.reverse);
  const bool has_prev = times.has_prev;
  const int64_t prev_off = times.prev_t * B, off = times.t * B, G = 4 * H;
  backward_step_rows<scalar_t, acc_t, 1, true, true>(
      a.gates + off * G, a.cells + off * H, has_prev ? a.cells + prev_off * H : nullptr,
      has_prev ? a.y + prev_off * P : nullptr, has_prev ? B : 0, a.h0, a.c0, nullptr, dm, 1, 0, dcbuf,
      a.dG + off * G, dG_step, a.M + off * H, a.hprev + off * P, B, H, P);
}

// A replayed call's first launch: its arguments into the kept entry, and the two recurrent
// states (forward: h0 and c0; backward: grad_h_n and grad_c_n) into the kept state buffers.
template <class Args, class scalar_t, class h_t, class c_t>
__global__ void __launch_bounds__(kThreads) replay_prologue_kernel(Args* __restrict__ args_out, Args args,
                                                                   const scalar_t* __restrict__ h_in,
                                                                   h_t* __restrict__ h_out,
                                                                   int64_t h_count,  // B * Hout
                                                                   const scalar_t* __restrict__ c_in,
                                                                   c_t* __restrict__ c_out,
                                                                   int64_t c_count) {  // B * H
  if (blockIdx.x == 0 && threadIdx.x == 0) *args_out = args;
  for (int64_t i = global_thread(); i < h_count; i += global_stride()) h_out[i] = static_cast<h_t>(h_in[i]);
  for (int64_t i = global_thread(); i < c_count; i += global_stride()) c_out[i] = static_cast<c_t>(c_in[i]);
}

// ---------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------

void check_on_cuda(const Tensor& x, const char* op) {
  TORCH_CHECK(x.defined() && x.is_cuda(), op, ": x must be a CUDA tensor (the CUDA kernel was dispatched to), got ",
              x.defined() ? x.device() : c10::Device(c10::kCPU));
}

template <class scalar_t>
using scale_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

// ---------------------------------------------------------------------------------------
// The cuBLAS loop replayed from CUDA graphs (replayed_steps.cuh)
// ---------------------------------------------------------------------------------------
//
// Eager, the cuBLAS loop is host-bound at small batches: a cuBLASLt call and a kernel launch
// cost 9-19 µs of host time per step on an H100 host, against 5-12 µs of device time per step
// (the same loop inside a CUDA graph) and cuDNN's ~10 µs (docs/benchmarks.md). A replayed step
// is the recurrent GEMM and the gate kernel; the step GEMMs read and write kept buffers
// (forward: h_{t-1} -> rec = h_{t-1}·W_hhᵀ, the gate kernel adding rec to pre[rows]; backward:
// dG_step -> dh), and W_hh's address is part of the key (its values are read at replay, so
// updated weights are seen). The step kernels read the call's pointers from ForwardReplayArgs /
// BackwardReplayArgs, which replay_prologue_kernel writes together with the initial states.
using cuda::kReplaySteps;
using cuda::ReplayedSteps;

// Whether a call's steps are replayed (replayed_steps.cuh): with a projection unless
// SEQKERNELS_LSTM_REPLAY_PROJECTION (diagnostic) is "0", and a ragged packed sequence (its
// steps' rows from a table, ReplayedRows) without a projection unless SEQKERNELS_LSTM_REPLAY_RAGGED
// (diagnostic) is "0" (either: the plain loop, as before those calls were replayed; for A/Bs and
// tests). A ragged projected call runs the plain loop: its projection GEMM would overwrite the
// rows of h that a step does not run.
bool cublas_replay_applies(const LstmSizes& s) {
  const bool ragged = !all_steps_full(s);
  if (s.P > 0) return !ragged && cuda::replay_applies(s) && cuda::switch_on("SEQKERNELS_LSTM_REPLAY_PROJECTION");
  return cuda::replay_applies(s, /*ragged=*/true) && (!ragged || cuda::switch_on("SEQKERNELS_LSTM_REPLAY_RAGGED"));
}

// A ragged call's step table on the device ([2, T]: batch_sizes[t], then offsets[t]), copied from
// pinned memory on the current stream (the host block is not reused before the copy ran).
Tensor replayed_step_table(const LstmSizes& s, const Tensor& like) {
  Tensor host = at::empty({2, s.T}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  int64_t* p = host.data_ptr<int64_t>();
  std::copy(s.batch_sizes.begin(), s.batch_sizes.begin() + s.T, p);
  std::copy(s.offsets.begin(), s.offsets.begin() + s.T, p + s.T);
  return host.to(like.device(), /*non_blocking=*/true);
}

// What fixes a captured chunk besides the device and thread: direction of the pass, dtype,
// sizes, mode, TF32, vector width, x3 steps, the step GEMM's K parts, and the addresses of W_hh
// and W_hr (the projection GEMM's operand; nullptr without one).
std::string replay_key(const char* pass, const Tensor& w_hh, const void* w_hr, const LstmSizes& s, bool training,
                       bool tf32, bool vec4, bool x3, int k_parts) {
  std::string key = pass;
  key += ' ';
  key += c10::toString(w_hh.scalar_type());
  for (const int64_t v : {s.B, s.H, s.P, int64_t(training), int64_t(tf32), int64_t(vec4), int64_t(x3),
                          int64_t(k_parts), static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(w_hh.data_ptr())),
                          static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(w_hr))}) {
    key += ' ';
    key += num(v);
  }
  return key;
}

// A replayed loop's step GEMM: row-major C[M, N] = A[M, K] · op(B)[K, N] (blas.cuh's contract),
// the same operands at every step; with parts > 1, K split into that many GEMMs whose products
// fill `parts` blocks of C, [M, N] each (StepGemm::split_k_into), for the step kernel to sum.
template <class scalar_t, class acc_t>
struct ReplayGemm {
  Trans tb;
  int64_t M, N, K;
  const scalar_t* A;
  const scalar_t* B;
  acc_t* C;
  int parts = 1;
};

// The StepGemm of a ReplayGemm (the caller's workspace for a captured one: `caller`), split-K
// allowed: no host time per kernel inside a graph, and the eager steps keep the captured ones'
// algorithm.
template <class Gemm, class R, class... Caller>
Gemm& emplace_step_gemm(std::optional<Gemm>& gemm, const cuda::BlasContext& blas, const R& r, Caller... caller) {
  gemm.emplace(blas, Trans::N, r.tb, r.N, r.K / r.parts, r.K, r.tb == Trans::N ? r.N : r.K, r.N, caller...);
  gemm->allow_split_k();
  gemm->split_k_into(r.parts);
  return *gemm;
}

// A replayed call's steps, each the step GEMM and step(k, stream, project) (the GEMM first where
// gemm_first), where project() issues the step's projection GEMM `proj` (with a projection; the
// step calls it where its order needs it: the forward's h_t = m_t·W_hrᵀ after the gate kernel,
// the backward's dm = dh·W_hr before it). Captures the key's chunk where it has none
// (kReplaySteps steps, then the counter's advance), launches prologue(stream) and the chunk
// T / kReplaySteps times, then runs the T % kReplaySteps remaining steps eagerly with the same
// kernels and GEMM algorithms. False, having launched nothing, where the capture is not possible
// (the plain loop runs then).
template <class ab_t, class acc_t, class Step, class Prologue, class proj_ab_t = ab_t, class proj_c_t = acc_t>
bool run_replayed_steps(ReplayedSteps& replay, const cuda::BlasContext& blas, const ReplayGemm<ab_t, acc_t>& g,
                        bool gemm_first, int64_t T, int64_t* counter, Step&& step, Prologue&& prologue,
                        const ReplayGemm<proj_ab_t, proj_c_t>* proj = nullptr) {
  using sc_t = scale_t<acc_t>;
  using Gemm = cuda::StepGemm<ab_t, acc_t, sc_t>;
  using ProjGemm = cuda::StepGemm<proj_ab_t, proj_c_t, sc_t>;
  std::optional<Gemm> gemm;
  std::optional<ProjGemm> proj_gemm;
  auto one_step = [&](int k, cudaStream_t stream) {
    if (gemm_first) (*gemm)(g.M, sc_t(1), g.A, g.B, sc_t(0), g.C);
    step(k, stream, [&] { (*proj_gemm)(proj->M, sc_t(1), proj->A, proj->B, sc_t(0), proj->C); });
    if (!gemm_first) (*gemm)(g.M, sc_t(1), g.A, g.B, sc_t(0), g.C);
  };
  if (!replay.captured()) {
    const c10::cuda::CUDAStreamGuard on_capture_stream(replay.capture_stream());
    if (!replay.give_workspace(emplace_step_gemm(gemm, blas, g, cuda::CallerWorkspace{}), g.M, g.A, g.B, g.C) ||
        (proj != nullptr && !replay.give_workspace(emplace_step_gemm(proj_gemm, blas, *proj, cuda::CallerWorkspace{}),
                                                   proj->M, proj->A, proj->B, proj->C))) {
      return false;
    }
    if (!replay.capture_chunk(counter, [&](cudaStream_t cs) {
          for (int k = 0; k < kReplaySteps; ++k) one_step(k, cs);
        })) {
      return false;
    }
  }
  const cudaStream_t stream = replay.stream();
  prologue(stream);
  replay.launch_chunks(T / kReplaySteps);
  if (T % kReplaySteps != 0) {
    emplace_step_gemm(gemm, blas, g);
    if (proj != nullptr) emplace_step_gemm(proj_gemm, blas, *proj);
    for (int k = 0; k < T % kReplaySteps; ++k) one_step(k, stream);
  }
  return true;
}

// tf32_parts of a [rows, cols] block of src (row stride src_ld) into dst: element (r, c)'s big
// part at dst[r * dst_ld + c + off_big], its small and big' parts at off_small and
// off_big_finite instead (a part with a negative offset is not written): x3_split's parts (matrices
// one after another) and wx (store_x3_stacked). Blocks walk rows (grid y) and V-wide columns
// (grid x): no index division, V = 4 where every row and part is a 16-byte vector.
template <int V>
__global__ void __launch_bounds__(kThreads) split_tf32_kernel(const float* __restrict__ src, int64_t src_ld,
                                                              int64_t rows, int64_t cols, float* __restrict__ dst,
                                                              int64_t dst_ld, int64_t off_big, int64_t off_small,
                                                              int64_t off_big_finite) {
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  const int64_t c_stride = int64_t(gridDim.x) * blockDim.x * V;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = c0; c < cols; c += c_stride) {
      const Tf32PartsVec<V> p = tf32_parts(load_vec<V>(src + r * src_ld + c));
      float* d = dst + r * dst_ld + c;
      store_vec<V>(d + off_big, p.big);
      store_vec<V>(d + off_small, p.small);
      if (off_big_finite >= 0) store_vec<V>(d + off_big_finite, p.big_finite);
    }
  }
}

// split_tf32_kernel on `stream`, checked.
void split_tf32(cudaStream_t stream, const float* src, int64_t src_ld, int64_t rows, int64_t cols, float* dst,
                int64_t dst_ld, int64_t off_big, int64_t off_small, int64_t off_big_finite) {
  if (rows * cols == 0) return;
  const bool vec4 = cols % 4 == 0 && src_ld % 4 == 0 && dst_ld % 4 == 0 && off_big % 4 == 0 && off_small % 4 == 0 &&
                    (off_big_finite < 0 || off_big_finite % 4 == 0) && aligned_for<4>(src) && aligned_for<4>(dst);
  const int V = vec4 ? 4 : 1;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((cols / V + kThreads - 1) / kThreads, 64)),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, stream>>>(src, src_ld, rows, cols, dst, dst_ld, off_big, off_small, off_big_finite);
  };
  vec4 ? launch(split_tf32_kernel<4>) : launch(split_tf32_kernel<1>);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// split_tf32_kernel's parts of src's [rows, cols] block transposed: element (r, c)'s parts at
// dst[c * dst_ld + r + off_*], for a GEMM whose K runs along src's rows: TF32 tensor-core GEMMs
// want both operands K-contiguous (Hopper's wgmma reads TF32 only K-major; cuBLAS runs other
// layouts on slower kernels, docs/benchmarks.md). 32 × 32 tiles through shared memory, so that
// both the reads and the writes are coalesced.
constexpr int kSplitTile = 32;
constexpr int kSplitTileRows = 8;  // thread rows of a block (32 × 8 threads)
__global__ void __launch_bounds__(kSplitTile * kSplitTileRows)
    split_tf32_transposed_kernel(const float* __restrict__ src, int64_t src_ld, int64_t rows, int64_t cols,
                                 float* __restrict__ dst, int64_t dst_ld, int64_t off_big, int64_t off_small,
                                 int64_t off_big_finite) {
  __shared__ float tile[kSplitTile][kSplitTile + 1];  // +1: no bank conflicts on the transposed reads
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t col_tiles = (cols + kSplitTile - 1) / kSplitTile;
  const int64_t tiles = col_tiles * ((rows + kSplitTile - 1) / kSplitTile);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / col_tiles * kSplitTile, c0 = t % col_tiles * kSplitTile;
    for (int k = ty; k < kSplitTile; k += kSplitTileRows) {
      const int64_t r = r0 + k, c = c0 + tx;
      tile[k][tx] = r < rows && c < cols ? src[r * src_ld + c] : 0.f;
    }
    __syncthreads();
    for (int k = ty; k < kSplitTile; k += kSplitTileRows) {
      const int64_t c = c0 + k, r = r0 + tx;
      if (c < cols && r < rows) {
        const Tf32Parts p = tf32_parts(tile[tx][k]);
        float* d = dst + c * dst_ld + r;
        d[off_big] = p.big;
        d[off_small] = p.small;
        if (off_big_finite >= 0) d[off_big_finite] = p.big_finite;
      }
    }
    __syncthreads();
  }
}

// float32 with TF32 on fp16 tensor cores (the input projection of the cluster forward kernel's
// scaled fp16 path): the rows of src [rows, cols] (cols % 4 == 0, 16-byte aligned) in fp16, each
// scaled by a power of two (cuda::scale_row_to_half, one warp per row), and their inverse scales.
__global__ void scale_rows_to_half_kernel(const float* __restrict__ src, int64_t rows, int64_t cols,
                                          c10::Half* __restrict__ dst, float* __restrict__ unscale) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  for (int64_t r = global_thread() / 32; r < rows; r += global_stride() / 32) {  // warp-uniform
    const float inv = cuda::scale_row_to_half(src + r * cols, cols, lane, dst + r * cols);
    if (lane == 0) unscale[r] = inv;
  }
}

// HalfDhStep's B operand: W_hh [G, H] in fp16 with its rows in part order (row p·4U + gate·U + u
// from W_hh's row gate·H + p·U + u, U = H / parts) and each (part, column) scaled by the power of
// two that takes its largest finite magnitude into [2^14, 2^15); w_unscale [parts, H] the inverse
// scales. x3: [G, 2H], the remainders (half_remainder) in columns [H, 2H). A block per (part, 32
// columns): its warps walk the part's rows, a lane a column.
constexpr int kWarpsPerBlock = kThreads / 32;
__global__ void __launch_bounds__(kThreads) scale_w_hh_parts_kernel(const float* __restrict__ w_hh, int64_t H,
                                                                    int parts, bool x3, c10::Half* __restrict__ w_half,
                                                                    float* __restrict__ w_unscale) {
  __shared__ float maxima[kWarpsPerBlock][32];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) / 32;
  const int64_t U = H / parts, p = blockIdx.y, col = int64_t{blockIdx.x} * 32 + lane;
  const bool in = col < H;
  float m = 0.0f;
  for (int gate = 0; gate < 4 && in; ++gate) {
    for (int64_t u = warp; u < U; u += kWarpsPerBlock) {
      m = cuda::finite_abs_max(m, w_hh[(gate * H + p * U + u) * H + col]);
    }
  }
  maxima[warp][lane] = m;
  __syncthreads();
  for (int w = 0; w < kWarpsPerBlock; ++w) m = fmaxf(m, maxima[w][lane]);
  float scale, unscale;
  cuda::power_of_two_scales(m, scale, unscale);
  const int64_t ld = x3 ? 2 * H : H;
  for (int gate = 0; gate < 4 && in; ++gate) {
    for (int64_t u = warp; u < U; u += kWarpsPerBlock) {
      const float scaled = w_hh[(gate * H + p * U + u) * H + col] * scale;
      const c10::Half big(scaled);
      c10::Half* dst = w_half + (p * 4 * U + gate * U + u) * ld + col;
      dst[0] = big;
      if (x3) dst[H] = half_remainder(scaled, big);
    }
  }
  if (in && warp == 0) w_unscale[p * H + col] = unscale;
}

// scale_rows_to_half_kernel on `stream`, checked: src [rows, cols] into dst, inverse scales into unscale.
void scale_rows_to_half(cudaStream_t stream, const float* src, int64_t rows, int64_t cols, c10::Half* dst,
                        float* unscale) {
  if (rows == 0) return;
  scale_rows_to_half_kernel<<<blocks_for(rows * 32), kThreads, 0, stream>>>(src, rows, cols, dst, unscale);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// x3 steps: the cuBLAS loop's forward products in float32 without TF32 as one TF32 GEMM each on
// the stacked parts of store_x3_stacked, which the step kernel writes beside h_t. That GEMM
// reads W_hh's parts (twice W_hh) for 2B rows, so it pays where a step is compute-bound, not
// where it streams W_hh for a few rows: from kX3StepsMinBatch rows, where auto leaves the
// forward to the other loops (lstm_loop.cuh; _config.py's CUDA_X3_STEPS_MIN_BATCH), without
// projection.
// H200, the loop forced, eager ms per 256-step `infer` call, float32 GEMMs / x3 steps: B = 32,
// H = 512 5.77 / 2.89-2.98; B = 64, H = 1024 9.41 / 6.13-6.23. The backward's dh = dG·W_hh as
// split GEMMs with W_hh's parts as stored was no faster (H200, the GEMMs alone at B = 32 / 64,
// H = 512 / 1024: float32 8.6-19.7 µs, parts along K = 3G 8.9-22.7, stacked 8.8-20.1); with
// them transposed it is, from larger sizes (x3 dh, use_x3_dh).
// SEQKERNELS_LSTM_X3_STEPS (diagnostic): 0, never; 1, at any batch size (tests reach every path
// with it).
constexpr int64_t kX3StepsMinBatch = cuda::kPersistentMaxForwardBatchMma + 1;
template <class scalar_t>
bool use_x3_steps(const LstmSizes& s, bool tf32) {
  if (!std::is_same_v<scalar_t, float> || tf32 || s.P > 0) return false;
  const int mode = cuda::diagnostic_mode("SEQKERNELS_LSTM_X3_STEPS");
  return mode < 0 ? s.B >= kX3StepsMinBatch : mode == 1;
}

// The replayed loop's step GEMM split along K into this many GEMMs of one strided batch
// (ReplayGemm, StepGemm::split_k_into), whose products the step kernel sums: the forward's
// rec = h_{t-1}·W_hhᵀ (K = H; x3 steps: K = 2H) and the backward's dh = dG·W_hh (K = 4H). A
// step GEMM at these batch sizes has few output tiles for its deep K; the parts multiply the
// CTAs, and the step kernel adds them where cuBLASLt's own split-K would reduce them in a second
// kernel or serially in C. Measured on H200s (docs/benchmarks.md, eighth session), one part
// against the rule's:
//  - the backward op alone (the forward under auto), ms: TF32 8 parts, B = 8, H = 256 / 512
//    1.99 / 2.66 → 1.84 / 2.27, B = 64, H = 512 3.38 → 3.24, B = 8 / 16 / 32 at H = 1024 equal
//    within 1 %; 16-bit 4 parts, B = 8, H = 512 2.25 → 2.04 (bf16), B = 48, H = 640 / 1024
//    3.07 / 3.39 → 2.56 / 2.91, B = 64, H = 512 2.67 → 2.48, H = 256 equal;
//  - the cuBLAS loop's `train` call: TF32 B = 64, H = 512 5.55 → 5.28, bf16 B = 64, H = 1024
//    5.63 → 5.39;
//  - the x3 forward (float32 without TF32) in 2 parts at B >= 64: `infer` B = 64, H = 1024
//    6.08 → 5.54, but B = 32 4.41 → 4.65.
//  - the backward's x3 dh (float32 without TF32, use_x3_dh) in 4 parts: the cuBLAS loop's
//    `train` call at B = 64, H = 1024 in 1 / 2 / 4 parts 20.66 / 18.98 / 18.39 ms (H200,
//    2026-11-27; 8 would exceed kMaxDhBlocks' 8 row blocks).
//  - the TF32 forward in 2 parts at H = 512, 2 <= B <= 8 (fifteenth session): cuBLASLt's first
//    choice for [B, 512]·[512, 2048] there is a CUTLASS TF32 kernel (`cutlass_80` s1688), slower
//    than its choice at B = 12 (a call ~2.5 against ~1.9 ms); as two K halves the call takes
//    ~2.0. The loop forced, `infer` ms, 1 / 2 / 4 parts (H200, 25 alternating calls): B = 2
//    2.474 / 2.097 / 1.964, B = 4 2.488 / 2.008 / 2.171, B = 6 2.514 / 2.024 / 1.937, B = 8
//    2.504 / 2.038 / 1.945; at B = 12 1.904 / 2.077 / 1.977, and at H = 256 and 768 (B = 2-12)
//    one part was the fastest by 6-16 %. Two, not four: within 0.1 ms of the best at each B.
// Not taken: the forward's GEMM without x3 in parts elsewhere (0–19 % slower: cuBLASLt fills the
// GPU there), two backward parts in float32 (TF32 B = 64, H = 1024 `train` 9.66 against 8.42),
// the float32 backward without TF32 in 8 (no faster). 1 where the parts would break 16-byte
// alignment.
// SEQKERNELS_LSTM_K_PARTS (diagnostic): "F,B", the forward's and the backward's parts.
constexpr int64_t kTf32ForwardPartsHidden = 512;  // the TF32 forward in 2 parts: H = 512 and ...
constexpr int64_t kTf32ForwardPartsMaxBatch = 8;   // ... 2 <= B <= 8 (above)
constexpr int kX3DhParts = 4;  // the backward's x3 dh GEMM (use_x3_dh)
template <class scalar_t>
int step_k_parts(bool backward, const LstmSizes& s, bool tf32, bool x3, bool half_dh = false) {
  if (s.P > 0) return 1;  // the projected steps sum no parts
  int parts = 1;
  const char* env = std::getenv("SEQKERNELS_LSTM_K_PARTS");
  if (env != nullptr && env[0] != '\0') {
    const std::string v(env);
    const size_t comma = v.find(',');
    TORCH_CHECK(comma != std::string::npos, "SEQKERNELS_LSTM_K_PARTS must be F,B (e.g. 4,8), got '", v, "'");
    parts = std::atoi((backward ? v.substr(comma + 1) : v.substr(0, comma)).c_str());
  } else if (backward) {
    if (x3) parts = kX3DhParts;
    if (std::is_same_v<scalar_t, float> && tf32 && s.B >= 8) parts = 8;
    if (cuda::kHalfType<scalar_t> && s.B >= 8) parts = 4;
    if (half_dh && s.B >= 8) parts = cuda::kHalfDhParts;
  } else if (x3 && s.B >= 64) {
    parts = 2;
  } else if (std::is_same_v<scalar_t, float> && tf32 && !x3 && s.H == kTf32ForwardPartsHidden && s.B >= 2 &&
             s.B <= kTf32ForwardPartsMaxBatch) {
    parts = 2;
  }
  // x3 on TF32 parts: each part's product is two row blocks (the stacked parts' halves), K the
  // parts' 2G or 2H (on fp16 parts, HalfDhStep, one [2B, 2H] block over K = G).
  const bool stacked = x3 && !half_dh;
  const int64_t K = (stacked ? 2 : 1) * (backward ? s.G : s.H);
  const int max_parts = (backward ? kMaxDhBlocks : kMaxRecBlocks) / (stacked ? 2 : 1);
  // Every part's slices of A and B, and (backward) every [B, H] block of C, 16-byte aligned.
  auto fits = [&](int p) {
    return p <= max_parts && K % p == 0 && (K / p * int64_t(sizeof(scalar_t))) % 16 == 0 && (s.B * s.H) % 4 == 0;
  };
  parts = std::max(parts, 1);
  while (parts > 1 && !fits(parts)) parts /= 2;
  return parts;
}

// x3 dh: the replayed backward's step GEMM dh = dG·W_hh in float32 without TF32 as one TF32 GEMM
// on stacked parts, dh[2B, H] = dGx[2B, 2G] · wxt[H, 2G]ᵀ: the step kernel writes dG's parts as
// store_x3_stacked writes h's (width G), and wxt's row j holds the big and small parts of W_hh's
// column j (split transposed once per call), so that both operands are K-contiguous, as Hopper's
// TF32 kernels want them (with W_hh's parts as stored, the x3 steps' note above, cuBLAS ran sm80
// kernels no faster than float32's). The step sums both halves of each K part (kX3DhParts: 4).
// wxt is kept (the graphs read it) and idle after the loop: dx borrows it for W_ih's parts
// (x3_input_grad), so that it adds nothing to the call's peak there. It reads twice W_hh's bytes
// a step, so it pays where the step is compute-bound: from kX3DhMinBatch rows and B·H >=
// kX3DhMinUnits. H200, the loop's `train` call, TF32 off, ms, float32's GEMM / x3 dh in 4 parts
// (two rounds, one build, 2026-11-27, docs/benchmarks.md): H = 512 B = 64 / 128 / 256 7.87 /
// 12.65 / 21.77 against 7.92 / 12.14 / 19.64; H = 768 14.92 / 23.93 / 39.76 against 13.33 /
// 21.92 / 36.28; H = 1024 18.63 / 32.11 / 59.24 against 18.12 / 30.08 / 55.33. In 2 parts B = 32
// was slower (H = 512 5.16 against 5.71, H = 1024 13.07 against 13.49), and B = 64, H = 1024 took
// 18.98 (1 part: 20.66).
// Where a row part's units fit (half_dh_units_fit; SEQKERNELS_LSTM_STEP_HALF not 0) x3 dh runs
// on scaled fp16 parts instead (HalfDhStep's x3: half the bytes of W_hh's parts a step, fp16's
// tensor-core rate) and pays from kX3HalfDhMinBatch rows with B·H >= kX3HalfDhMinUnits. H200,
// `train` ms, float32's GEMM against x3 dh on fp16 parts in 4 K parts (two rounds, one build,
// 2026-11-27, docs/benchmarks.md): B = 32, H = 256 / 512 / 1024 3.64 / 5.16 / 12.95 against 3.66 /
// 4.90 / 11.39 (H = 256: the fused backward ran in both); B = 64 4.52 / 7.88 / 18.47 against
// 4.30 / 7.24 / 16.09. Against TF32 parts, B = 64, H = 512 / 1024: 7.90 / 18.15 against 7.18 /
// 15.99; 8 K parts: 7.67 / 16.76 against 7.14 / 15.92 in 4.
// The plain loop (unequal batch sizes, or inside a caller's capture) keeps float32's GEMM.
// SEQKERNELS_LSTM_X3_DH (diagnostic): 0, never; 1, at any batch size.
constexpr int64_t kX3DhMinBatch = 64;
constexpr int64_t kX3DhMinUnits = 49152;  // B·H: B = 64 from H = 768
constexpr int64_t kX3HalfDhMinBatch = 32;
constexpr int64_t kX3HalfDhMinUnits = 16384;  // B·H: B = 32 from H = 512, B = 64 from H = 256
template <class scalar_t>
bool use_x3_dh(const LstmSizes& s, bool tf32, bool half_parts) {
  if (!std::is_same_v<scalar_t, float> || tf32 || s.P > 0) return false;
  const int mode = cuda::diagnostic_mode("SEQKERNELS_LSTM_X3_DH");
  if (mode >= 0) return mode == 1;
  return half_parts ? s.B >= kX3HalfDhMinBatch && s.B * s.H >= kX3HalfDhMinUnits
                    : s.B >= kX3DhMinBatch && s.B * s.H >= kX3DhMinUnits;
}

// Whether float32 with TF32 may run the replayed cuBLAS loop's step GEMMs on fp16 operands scaled
// by powers of two (HalfRecStep, HalfDhStep): SEQKERNELS_LSTM_STEP_HALF (diagnostic) "0" never (TF32
// operands), else where they apply (use_half_rec, use_half_dh).
bool step_half_products() { return cuda::switch_on("SEQKERNELS_LSTM_STEP_HALF"); }

// Whether the replayed backward's dh GEMM runs on scaled fp16 operands (HalfDhStep): float32 with
// TF32, or without it the x3 dh GEMM (x3: its operands' remainders too), where a row part's
// U = H / k_parts units fill 2 to 8 warps of one block
// (cuda::half_dh_units_fit). k_parts is then cuda::kHalfDhParts from B = 8 (step_k_parts). H200,
// `train` ms, eager calls, two rounds each (docs/benchmarks.md): TF32 operands in 8 parts against
// fp16 in 8, H = 256 (32-unit blocks, not taken) B = 32 / 64 / 256 2.87 / 3.21 / 5.17 against
// 2.79 / 3.25 / 5.31; H = 512 3.46 / 4.13 / 8.43 against 3.30 / 3.99 / 8.01; H = 1024 5.06 / 6.99 /
// 18.67 against 4.55 / 6.61 / 16.89. fp16 in 4 parts against 8 (the same machine, another build):
// H = 1024 4.44 / 6.31 / 16.33 against 4.57 / 6.56 / 16.79, H = 512 3.20 / 3.89 / 7.70 against
// 3.29 / 4.00 / 8.00, H = 256 (64-unit blocks against TF32 operands in 8 parts) 2.87 / 3.12 / 5.06
// against 2.89 / 3.21 / 5.10.
static_assert(cuda::kHalfDhMaxUnits <= kThreads, "a row part's units are one block of the step kernel");
template <class scalar_t>
bool use_half_dh(const LstmSizes& s, bool tf32, bool x3, int k_parts) {
  return std::is_same_v<scalar_t, float> && (tf32 || x3) && s.P == 0 && step_half_products() &&
         cuda::half_dh_units_fit(s.H, k_parts);
}

// Whether the replayed forward's product runs on scaled fp16 operands (HalfRecStep): float32 with
// TF32, where h's rows and every K part of them are 16-byte vectors of fp16 (the GEMM's A operand)
// and h0 and W_hh are 16-byte aligned (scale_rows_to_half_kernel).
template <class scalar_t>
bool use_half_rec(const LstmSizes& s, bool tf32, int k_parts, const scalar_t* h0, const scalar_t* w_hh) {
  return std::is_same_v<scalar_t, float> && tf32 && s.P == 0 && step_half_products() && s.H % (8 * k_parts) == 0 &&
         aligned_for<4>(h0) && aligned_for<4>(w_hh);
}

// A float32 [rows, cols] matrix as its exact TF32 parts (tf32_parts), one after another `part`
// elements apart: big, small, and big' (non-finite values as 0), or only big and small for a
// weight operand (then big' = big: an inf in the weight reaches small·big too, NaN where the
// other operand's small part is 0, as in the x3 steps).
struct X3Parts {
  float* big;
  int64_t part;
  bool has_big_finite;
  const float* small() const { return big + part; }
  const float* big_finite() const { return has_big_finite ? big + 2 * part : big; }
};

// The [rows, cols] block of src (row stride src_ld) into dst's parts.
void x3_split(cudaStream_t stream, const float* src, int64_t src_ld, int64_t rows, int64_t cols, const X3Parts& dst) {
  split_tf32(stream, src, src_ld, rows, cols, dst.big, cols, 0, dst.part, dst.has_big_finite ? 2 * dst.part : -1);
}

// The [rows, cols] block of src transposed into dst's parts: [cols, rows] with row stride dst_ld.
void x3_split_transposed(cudaStream_t stream, const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                         const X3Parts& dst, int64_t dst_ld) {
  if (rows * cols == 0) return;
  const int64_t tiles = ((rows + kSplitTile - 1) / kSplitTile) * ((cols + kSplitTile - 1) / kSplitTile);
  split_tf32_transposed_kernel<<<static_cast<unsigned>(std::min<int64_t>(tiles, kMaxBlocks)),
                                 dim3(kSplitTile, kSplitTileRows), 0, stream>>>(
      src, src_ld, rows, cols, dst.big, dst_ld, 0, dst.part, dst.has_big_finite ? 2 * dst.part : -1);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// W_hh [G, H] as the x3 steps' weight operand wx [G, 2H] (store_x3_stacked).
void split_w_hh_x3(cudaStream_t stream, const float* w_hh, int64_t G, int64_t H, float* wx) {
  split_tf32(stream, w_hh, H, G, H, wx, 2 * H, /*off_big=*/0, /*off_small=*/H, /*off_big_finite=*/-1);
}
// W_hh [G, H] as x3 dh's weight operand wxt [H, 2G]: row j the big, then the small parts of W_hh's column j.
void split_w_hh_x3_transposed(cudaStream_t stream, const float* w_hh, int64_t G, int64_t H, float* wxt) {
  x3_split_transposed(stream, w_hh, H, G, H, X3Parts{wxt, G, false}, 2 * G);
}
// The name of wx's kept buffer for W_hh in the replayed loop (ReplayedSteps::shared_buffer): one
// per W_hh, read by the graphs of its training and inference forwards; `transposed`, the
// backward's wxt (x3 dh), read by the graphs of its backwards.
std::string x3_weights_name(const Tensor& w_hh, bool transposed = false) {
  return (transposed ? "x3 W_hh transposed " : "x3 W_hh ") +
         num(static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(w_hh.data_ptr()))) + " " + num(w_hh.size(0)) +
         " " + num(w_hh.size(1));
}

// h0 [B, H] into hx [2B, 2H] (store_x3_stacked).
__global__ void __launch_bounds__(kThreads) x3_stack_rows_kernel(const float* __restrict__ h0, int64_t B, int64_t H,
                                                                 float* __restrict__ hx) {
  for (int64_t i = global_thread(); i < B * H; i += global_stride()) {
    const int64_t b = i / H, j = i - b * H;
    store_x3_stacked<1>(hx + b * 2 * H + j, hx + (B + b) * 2 * H + j, H, Vec<float, 1>{{h0[i]}});
  }
}
void split_h0_x3(cudaStream_t stream, const float* h0, int64_t B, int64_t H, float* hx) {
  x3_stack_rows_kernel<<<blocks_for(B * H), kThreads, 0, stream>>>(h0, B, H, hx);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The forward time loop replayed (see above); false, having launched nothing, where it does
// not apply. Writes y, gates and cells (training) as the plain loop does, and h_n and c_n
// (scalar_t) as new tensors. With a projection (w_hr, [P, H]) a step is the recurrent GEMM, the
// gate kernel and the projection GEMM (lstm_forward_replay_projected_step_kernel).
template <class scalar_t>
bool lstm_forward_replayed(const LstmSizes& s, bool reverse, bool training, const cuda::BlasContext& blas,
                           const at::opmath_type<scalar_t>* pre, const scalar_t* b_ih, const scalar_t* b_hh,
                           const Tensor& w_hh, const scalar_t* w_hr, const Tensor& h0, const Tensor& c0, scalar_t* y,
                           scalar_t* gates, scalar_t* cells, Tensor& h_n, Tensor& c_n) {
  using acc_t = at::opmath_type<scalar_t>;
  using Args = ForwardReplayArgs<scalar_t, acc_t>;
  if (!cublas_replay_applies(s)) return false;
  const int64_t T = s.T, B = s.B, H = s.H, P = s.P, Hout = s.Hout, G = s.G;
  const bool proj = P > 0, ragged = !all_steps_full(s);
  // pre, y, gates and cells come from the caching allocator; the state buffers are kept ones.
  // One unit per thread (V = 1) for 16-bit types: 4x the threads of V = 4, and at B <= 64 that
  // parallelism, not the access width, bounds the step (H200, forced cuBLAS loop, 2026-11-26,
  // docs/benchmarks.md: bf16 eager calls 6-17 % shorter at B <= 64). float32 keeps V = 4 here:
  // its eager calls were not shorter with V = 1 (-0 to +5 %, as much as this unchanged path
  // varied between two builds).
  const bool vec4 = !proj && sizeof(scalar_t) >= 4 && H % 4 == 0 && aligned_for<4>(b_ih) && aligned_for<4>(b_hh);
  const bool x3 = use_x3_steps<scalar_t>(s, blas.tf32());
  const int k_parts = step_k_parts<scalar_t>(/*backward=*/false, s, blas.tf32(), x3);
  const int rec_blocks = (x3 ? 2 : 1) * k_parts;
  // (Not ragged: a row that starts late in reverse would read h0's scaled row unscaled.)
  const bool half_rec = !ragged && use_half_rec<scalar_t>(s, blas.tf32(), k_parts, h0.data_ptr<scalar_t>(),
                                                          w_hh.data_ptr<scalar_t>());
  const Tensor steps = ragged ? replayed_step_table(s, h0) : Tensor();
  ReplayedSteps replay(replay_key(half_rec ? "forward, fp16 rec" : "forward", w_hh, w_hr, s, training, blas.tf32(),
                                  vec4, x3, k_parts),
                       "the cuBLAS loop's");
  if (replay.capture_failed()) return false;
  const auto opts = h0.options();
  const auto acc_opts = opts.dtype(at::toOpMathType(h0.scalar_type()));
  Tensor hbuf = replay.buffer(0, {B, Hout}, opts);
  Tensor cbuf = replay.buffer(1, {B, H}, acc_opts);
  Tensor rec = replay.buffer(2, {rec_blocks * B, G}, acc_opts);
  Tensor args = replay.buffer(3, {int64_t(sizeof(Args))}, opts.dtype(at::kByte));
  // x3 steps: h_t's parts (the step GEMM's A operand) and W_hh's (wx, its B operand, kept once
  // per W_hh for the training and inference graphs, split again at every call: the graphs read
  // W_hh's values through it).
  Tensor hx = x3 ? replay.buffer(4, {2 * B, 2 * H}, opts) : Tensor();
  Tensor wx = x3 ? replay.shared_buffer(5, x3_weights_name(w_hh), {G, 2 * H}, opts) : Tensor();
  scalar_t* hbuf_p = hbuf.data_ptr<scalar_t>();
  acc_t* cbuf_p = cbuf.data_ptr<acc_t>();
  acc_t* rec_p = rec.data_ptr<acc_t>();
  scalar_t* hx_p = x3 ? hx.data_ptr<scalar_t>() : nullptr;
  scalar_t* wx_p = x3 ? wx.data_ptr<scalar_t>() : nullptr;
  auto* args_p = reinterpret_cast<Args*>(args.data_ptr());
  // With a projection (no x3 steps, no fp16 product): m_t, the projection GEMM's A operand.
  Tensor mbuf = proj ? replay.buffer(4, {B, H}, opts) : Tensor();
  scalar_t* mbuf_p = proj ? mbuf.data_ptr<scalar_t>() : nullptr;
  // The fp16 product's operands (HalfRecStep; x3 steps are float32 without TF32, so never both):
  // h in fp16, and W_hh's and h0's scaled rows, rewritten by every call's prologue.
  Tensor h_half, w_half, w_unscale, h0_unscale;
  HalfRecStep half{};
  if (half_rec) {
    h_half = replay.buffer(4, {B, H}, opts.dtype(at::kHalf));
    w_half = replay.buffer(5, {G, H}, opts.dtype(at::kHalf));
    w_unscale = replay.buffer(6, {G}, opts.dtype(at::kFloat));
    h0_unscale = replay.buffer(7, {B}, opts.dtype(at::kFloat));
    half = HalfRecStep{h_half.data_ptr<c10::Half>(), w_unscale.data_ptr<float>(), h0_unscale.data_ptr<float>(), 0};
  }

  // The gate kernel always follows its step's GEMM: with PDL it loads all but rec while the
  // GEMM runs (forward_step_rows).
  const bool pdl = cuda::pdl_supported(*at::cuda::getCurrentDeviceProperties());
  auto step = [&](int k, cudaStream_t stream, auto&& project) {
    const dim3 grid(blocks_for(B * H / (vec4 ? 4 : 1)));
    if (proj) {
      cuda::launch_kernel(training ? lstm_forward_replay_projected_step_kernel<scalar_t, acc_t, true>
                                   : lstm_forward_replay_projected_step_kernel<scalar_t, acc_t, false>,
                          grid, dim3(kThreads), 0, stream, pdl, args_p, k, rec_p, cbuf_p, mbuf_p, hbuf_p, B, H, P);
      project();  // hbuf = h_t = m_t·W_hrᵀ
      return;
    }
    auto launch = [&](auto kernel) {
      cuda::launch_kernel(kernel, grid, dim3(kThreads), 0, stream, pdl, args_p, k, rec_p, rec_blocks, cbuf_p, hbuf_p,
                          hx_p, B, H, half);
    };
    auto launch_for = [&](auto half_rec_tag) {
      constexpr bool kHalfRec = decltype(half_rec_tag)::value;
      if (vec4 && training) {
        launch(lstm_forward_replay_step_kernel<scalar_t, acc_t, 4, true, kHalfRec>);
      } else if (vec4) {
        launch(lstm_forward_replay_step_kernel<scalar_t, acc_t, 4, false, kHalfRec>);
      } else if (training) {
        launch(lstm_forward_replay_step_kernel<scalar_t, acc_t, 1, true, kHalfRec>);
      } else {
        launch(lstm_forward_replay_step_kernel<scalar_t, acc_t, 1, false, kHalfRec>);
      }
    };
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (half_rec) return launch_for(std::true_type{});
    }
    launch_for(std::false_type{});
  };
  auto prologue = [&](cudaStream_t stream) {
    const Args call{pre, b_ih, b_hh, gates, cells, y, T, 0, reverse, ragged ? steps.data_ptr<int64_t>() : nullptr};
    replay_prologue_kernel<<<blocks_for(B * H), kThreads, 0, stream>>>(
        args_p, call, h0.data_ptr<scalar_t>(), hbuf_p, B * Hout, c0.data_ptr<scalar_t>(), cbuf_p, B * H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (x3) {
        split_w_hh_x3(stream, w_hh.data_ptr<float>(), G, H, wx_p);
        split_h0_x3(stream, h0.data_ptr<float>(), B, H, hx_p);
      }
      if (half_rec) {
        scale_rows_to_half(stream, w_hh.data_ptr<float>(), G, H, w_half.data_ptr<c10::Half>(),
                           w_unscale.data_ptr<float>());
        scale_rows_to_half(stream, h0.data_ptr<float>(), B, H, half.h, h0_unscale.data_ptr<float>());
      }
    }
  };
  // rec[B, G] = h_{t-1}[B, Hout] · W_hh[G, Hout]ᵀ (x3: the parts, [2B, 2H] · [G, 2H]ᵀ in TF32;
  // with K parts, k_parts such blocks), then the gate kernel (and with a projection hbuf[B, P] =
  // mbuf[B, H] · W_hr[P, H]ᵀ).
  std::optional<cuda::BlasContext> tf32_blas;  // x3 steps: the handle's settings of `blas`, TF32 compute
  if (x3) tf32_blas.emplace(true);
  const ReplayGemm<scalar_t, scalar_t> projection{Trans::T, B, P, H, mbuf_p, w_hr, hbuf_p};
  auto run = [&](const auto& gemm) {
    return run_replayed_steps(replay, x3 ? *tf32_blas : blas, gemm, /*gemm_first=*/true, T, &args_p->step, step,
                              prologue, proj ? &projection : nullptr);
  };
  bool ran = false;
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (half_rec) {
      ran = run(ReplayGemm<c10::Half, float>{Trans::T, B, G, H, half.h, w_half.data_ptr<c10::Half>(), rec_p, k_parts});
    }
  }
  if (!half_rec) {
    ran = run(x3 ? ReplayGemm<scalar_t, acc_t>{Trans::T, 2 * B, G, 2 * H, hx_p, wx_p, rec_p, k_parts}
                 : ReplayGemm<scalar_t, acc_t>{Trans::T, B, G, Hout, hbuf_p, w_hh.data_ptr<scalar_t>(), rec_p,
                                               k_parts});
  }
  if (!ran) return false;
  if (proj) {  // the last step's h_t into its rows of y (a later step's kernel copies the others)
    const int64_t last_t = reverse ? 0 : T - 1;
    C10_CUDA_CHECK(cudaMemcpyAsync(y + last_t * B * P, hbuf_p, static_cast<size_t>(B * P) * sizeof(scalar_t),
                                   cudaMemcpyDeviceToDevice, replay.stream()));
  }
  h_n = hbuf.clone();
  c_n = cbuf.to(h0.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  return true;
}

// The backward time loop replayed (see above); false, having launched nothing, where it does
// not apply. Fills dG and hprev as the plain loop does, and grad_h0 and grad_c0 (scalar_t) as
// new tensors. `held` keeps the loop's entry (and its pool locked) until the caller resets it:
// with x3 dh on TF32 parts, `idle_x3_weights` is its kept [H, 2G] buffer of W_hh's parts, idle
// once the loop is done, which the caller may use as scratch while it holds the entry (the pool
// orders its next call, which rewrites the buffer, after the work queued until then). With a
// projection (w_hr, [P, H]) a step is four nodes (lstm_backward_replay_dh_kernel) and it fills
// dHtot and M too.
template <class scalar_t>
bool lstm_backward_replayed(const LstmSizes& s, bool reverse, const cuda::BlasContext& blas, const Tensor& w_hh,
                            const scalar_t* w_hr, const scalar_t* gates, const scalar_t* cells, const scalar_t* y,
                            const scalar_t* grad_y, const Tensor& h0, const Tensor& c0, const Tensor& grad_h_n,
                            const Tensor& grad_c_n, scalar_t* dG, scalar_t* hprev, scalar_t* dHtot, scalar_t* M,
                            Tensor& grad_h0, Tensor& grad_c0, std::optional<ReplayedSteps>& held,
                            Tensor& idle_x3_weights) {
  using acc_t = at::opmath_type<scalar_t>;
  using Args = BackwardReplayArgs<scalar_t>;
  if (!cublas_replay_applies(s)) return false;
  const int64_t T = s.T, B = s.B, H = s.H, P = s.P, Hout = s.Hout, G = s.G;
  const bool proj = P > 0, ragged = !all_steps_full(s);
  const scalar_t* h0_p = h0.data_ptr<scalar_t>();
  const scalar_t* c0_p = c0.data_ptr<scalar_t>();
  // dG and hprev come from the caching allocator; the state buffers are kept ones. One unit per
  // thread (V = 1): 4x the threads of V = 4, and with them training calls 0-10 % shorter (forced
  // cuBLAS loop, B <= 256, H200, 2026-11-26, docs/benchmarks.md).
  // The parts of fp16 operands where they fit (use_half_dh; x3 dh's split ones), else TF32's or
  // x3 dh's stacked TF32 parts.
  const bool tf32 = blas.tf32(), x3_dtype = std::is_same_v<scalar_t, float> && !tf32;
  int k_parts = step_k_parts<scalar_t>(/*backward=*/true, s, tf32, x3_dtype, /*half_dh=*/true);
  // Ragged: dh's plain blocks (a row that runs its last step takes grad_h_n's row instead of them).
  const bool half_fits = !ragged && use_half_dh<scalar_t>(s, tf32, x3_dtype, k_parts);
  const bool x3 = !ragged && use_x3_dh<scalar_t>(s, tf32, half_fits);
  const bool half_dh = half_fits && (tf32 || x3);
  if (!half_dh) k_parts = step_k_parts<scalar_t>(/*backward=*/true, s, tf32, x3);
  const bool x3_tf32 = x3 && !half_dh, x3_half = x3 && half_dh;
  const int dh_blocks = (x3_tf32 ? 2 : 1) * k_parts;  // blocks of dhbuf that sum to dh ([2B, 2H] with x3 on fp16)
  ReplayedSteps& replay = held.emplace(replay_key(half_dh ? "backward, fp16 dh" : "backward", w_hh, w_hr, s,
                                                 /*training=*/true, tf32, /*vec4=*/false, x3, k_parts),
                                      "the cuBLAS loop's");
  if (replay.capture_failed()) {
    held.reset();
    return false;
  }
  const auto opts = h0.options();
  const auto acc_opts = opts.dtype(at::toOpMathType(h0.scalar_type()));
  const auto half_opts = opts.dtype(at::kHalf), float_opts = opts.dtype(at::kFloat);
  // The dh GEMM's output blocks, summed by the step; M and N of one: x3 on fp16 parts [2B, 2H].
  const int64_t dh_rows = x3_half ? 2 * B : B, dh_cols = x3_half ? 2 * H : Hout;
  Tensor dhbuf = replay.buffer(0, {dh_blocks * dh_rows, dh_cols}, acc_opts);
  Tensor dcbuf = replay.buffer(1, {B, H}, acc_opts);
  // The dh GEMM's A operand (x3: dG's parts, stacked; on fp16, big rows then remainders) and,
  // x3 on TF32 parts, its B operand: W_hh's parts transposed, [H, 2G] (x3 dh above), kept once
  // per W_hh.
  const std::vector<int64_t> dG_step_sizes = x3_tf32 ? std::vector<int64_t>{2 * B, 2 * G}
                                                     : std::vector<int64_t>{dh_rows, G};
  Tensor dG_step = replay.buffer(2, dG_step_sizes, half_dh ? half_opts : opts);
  Tensor args = replay.buffer(3, {int64_t(sizeof(Args))}, opts.dtype(at::kByte));
  Tensor wxt =
      x3_tf32 ? replay.shared_buffer(4, x3_weights_name(w_hh, /*transposed=*/true), {H, 2 * G}, opts) : Tensor();
  acc_t* dhbuf_p = dhbuf.data_ptr<acc_t>();
  acc_t* dcbuf_p = dcbuf.data_ptr<acc_t>();
  auto* args_p = reinterpret_cast<Args*>(args.data_ptr());
  // Ragged: the step table, and in reverse grad_h0's rows of the sequences that end before the
  // last step (the step kernel keeps them from dhbuf before the GEMM overwrites them).
  const Tensor steps = ragged ? replayed_step_table(s, h0) : Tensor();
  const int64_t last_rows = s.batch_sizes[reverse ? T - 1 : 0];  // the last processed step's
  const Tensor ragged_dh0 = last_rows < B ? at::empty({B, H}, acc_opts) : Tensor();
  // With a projection (no x3, no fp16 dh): dL/dh_t rounded (the dm GEMM's A operand), and dm.
  Tensor dH_step = proj ? replay.buffer(4, {B, P}, opts) : Tensor();
  Tensor dm = proj ? replay.buffer(5, {B, H}, acc_opts) : Tensor();
  scalar_t* dH_step_p = proj ? dH_step.data_ptr<scalar_t>() : nullptr;
  acc_t* dm_p = proj ? dm.data_ptr<acc_t>() : nullptr;
  // The scaled fp16 dh GEMM's W_hh (HalfDhStep): rewritten by every call's prologue.
  Tensor w_half, w_unscale, row_unscale;
  HalfDhStep half{};
  if (half_dh) {
    w_half = replay.buffer(4, {G, dh_cols}, half_opts);
    w_unscale = replay.buffer(5, {k_parts, H}, float_opts);
    row_unscale = replay.buffer(6, {2, B, k_parts}, float_opts);
    half = HalfDhStep{dG_step.data_ptr<c10::Half>(), row_unscale.data_ptr<float>(), w_unscale.data_ptr<float>(), 0,
                      x3};
  }

  // Step k > 0 follows the previous step's dh GEMM: with PDL it loads all but dhbuf while that
  // GEMM runs (backward_step_rows). Step 0 follows the prologue or a chunk's graph: no PDL.
  const bool pdl = cuda::pdl_supported(*at::cuda::getCurrentDeviceProperties());
  auto step = [&](int k, cudaStream_t stream, auto&& project) {
    if (proj) {  // the dh kernel, dm = dh·W_hr, then the gate kernel (after a GEMM at every k: PDL)
      lstm_backward_replay_dh_kernel<scalar_t, acc_t>
          <<<blocks_for(B * P), kThreads, 0, stream>>>(args_p, k, dhbuf_p, dH_step_p, B, P);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      project();
      cuda::launch_kernel(lstm_backward_replay_projected_step_kernel<scalar_t, acc_t>, dim3(blocks_for(B * H)),
                          dim3(kThreads), 0, stream, pdl, args_p, k, dm_p, dcbuf_p, dG_step.data_ptr<scalar_t>(), B,
                          H, P);
      return;
    }
    auto launch = [&](auto kernel) {  // one unit per thread
      cuda::launch_kernel(kernel, dim3(blocks_for(B * H)), dim3(kThreads), 0, stream, pdl && k > 0, args_p, k, dhbuf_p,
                          dh_blocks, dcbuf_p, dG_step.data_ptr<scalar_t>(), B, H, half);
    };
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (half_dh) {  // a block per row part (HalfDhStep)
        cuda::launch_kernel(lstm_backward_replay_step_kernel<scalar_t, acc_t, true, false>, dim3(B * k_parts),
                            dim3(H / k_parts), 0, stream, pdl && k > 0, args_p, k, dhbuf_p, k_parts, dcbuf_p,
                            static_cast<scalar_t*>(nullptr), B, H, half);
        return;
      }
      if (x3_tf32) return launch(lstm_backward_replay_step_kernel<scalar_t, acc_t, false, true>);
    }
    launch(lstm_backward_replay_step_kernel<scalar_t, acc_t, false, false>);
  };
  auto prologue = [&](cudaStream_t stream) {
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (half_dh) {
        scale_w_hh_parts_kernel<<<dim3((H + 31) / 32, k_parts), kThreads, 0, stream>>>(
            w_hh.data_ptr<float>(), H, k_parts, x3, w_half.data_ptr<c10::Half>(), w_unscale.data_ptr<float>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      if (x3_tf32) split_w_hh_x3_transposed(stream, w_hh.data_ptr<float>(), G, H, wxt.data_ptr<float>());
    }
    const Args call{gates, cells, y, grad_y, h0_p, c0_p, dG, hprev, T, 0, reverse, dHtot, M,
                    ragged ? steps.data_ptr<int64_t>() : nullptr, grad_h_n.data_ptr<scalar_t>(),
                    ragged_dh0.defined() ? ragged_dh0.data_ptr<acc_t>() : nullptr};
    replay_prologue_kernel<<<blocks_for(B * H), kThreads, 0, stream>>>(
        args_p, call, grad_h_n.data_ptr<scalar_t>(), dhbuf_p, B * Hout, grad_c_n.data_ptr<scalar_t>(), dcbuf_p,
        B * H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // grad_h_n is the first step's dh: its other blocks are zero.
    if (dh_blocks > 1) {
      C10_CUDA_CHECK(cudaMemsetAsync(dhbuf_p + B * H, 0, (dh_blocks - 1) * B * H * sizeof(acc_t), stream));
    }
  };
  // The gate-gradient kernel, then dL/dh_{t-1}: dhbuf[B, Hout] = dG_step[B, G] · W_hh[G, Hout]
  // (k_parts such blocks; x3 on TF32 parts: [2B, H] = dG_step[2B, 2G] · wxt[H, 2G]ᵀ in TF32 each;
  // on fp16 parts [2B, 2H] = dG_step[2B, G] · w_half[G, 2H]). With a projection, before the gate
  // kernel: dm[B, H] = dH_step[B, P] · W_hr[P, H].
  std::optional<cuda::BlasContext> tf32_blas;  // x3 on TF32 parts: the handle's settings of `blas`, TF32 compute
  if (x3_tf32) tf32_blas.emplace(true);
  const ReplayGemm<scalar_t, acc_t> projection{Trans::N, B, H, P, dH_step_p, w_hr, dm_p};
  auto run = [&](const auto& gemm) {
    return run_replayed_steps(replay, x3_tf32 ? *tf32_blas : blas, gemm, /*gemm_first=*/false, T, &args_p->step,
                              step, prologue, proj ? &projection : nullptr);
  };
  bool ran = false;
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (half_dh) {
      ran = run(ReplayGemm<c10::Half, float>{Trans::N, dh_rows, dh_cols, G, half.dG, w_half.data_ptr<c10::Half>(),
                                             dhbuf_p, k_parts});
    }
  }
  if (!half_dh) {
    ran = run(x3_tf32 ? ReplayGemm<scalar_t, acc_t>{Trans::T, 2 * B, H, 2 * G, dG_step.data_ptr<scalar_t>(),
                                               wxt.data_ptr<scalar_t>(), dhbuf_p, k_parts}
                 : ReplayGemm<scalar_t, acc_t>{Trans::N, B, Hout, G, dG_step.data_ptr<scalar_t>(),
                                               w_hh.data_ptr<scalar_t>(), dhbuf_p, k_parts});
  }
  if (!ran) {
    held.reset();
    return false;
  }
  idle_x3_weights = wxt;
  // The last step's blocks (processing step T - 1) unscaled as the step kernel would.
  Tensor parts = dhbuf.view({dh_blocks, dh_rows, dh_cols});
  if (x3_half) {  // big·big, and the cross terms where it is finite (half_parts_sum)
    const Tensor whole = parts.narrow(1, 0, B).narrow(2, 0, H);
    const Tensor cross = parts.narrow(1, 0, B).narrow(2, H, H).add(parts.narrow(1, B, B).narrow(2, 0, H));
    parts = whole.add(cross, kHalfRemainderUnscale).where(whole.isfinite(), whole);
  }
  const Tensor dh0 = half_dh ? parts.mul(row_unscale[(T - 1) % 2].t().unsqueeze(-1)).mul(w_unscale.unsqueeze(1)).sum(0)
                     : dh_blocks > 1 ? parts.sum(0)
                                     : dhbuf;
  grad_h0 = dh0.to(h0.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  if (ragged_dh0.defined()) {
    grad_h0.narrow(0, last_rows, B - last_rows).copy_(ragged_dh0.narrow(0, last_rows, B - last_rows));
  }
  grad_c0 = dcbuf.to(h0.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  return true;
}

// Whole-sequence products in float32 without TF32 (the input projection, and the backward's dx,
// dW_ih and dW_hh) as three TF32 GEMMs on exact splits (3xTF32) from kX3MinFlops, where cuBLAS's
// float32 GEMM runs at ~48 TFLOP/s on an H200 (x·W_ihᵀ at B = 16, T = 256, H = I = 1024: 703 µs,
// a third of the persistent forward's call); TF32 tensor cores run the three GEMMs in less. One
// GEMM over K = 3I on the three parts side by side was less accurate (a 256-step call's error
// against float64 ~1e-5 of the largest value at H = I = 1024 on an H200, ~3e-6 with three GEMMs).
// SEQKERNELS_LSTM_X3_PRODUCTS (diagnostic): 0, never; 1, at any size (tests reach every path).
constexpr double kX3MinFlops = 4294967296.0;  // 2^32
// Split buffers of at most kX3SplitBytes (the operands are split in row chunks), and at least
// kX3MinSplitBytes where a memory budget would leave less.
constexpr int64_t kX3SplitBytes = int64_t{48} << 20;
constexpr int64_t kX3MinSplitBytes = int64_t{8} << 20;
// The backward's products split only where every GEMM of a chunk has kX3MinFlops: smaller ones
// fill too little of the GPU to beat float32's GEMMs. On an H200 at T = 256, B = 64, `train`
// without TF32: H = 1024 (chunk GEMMs of 5.6 GFLOP) 18.5 against 19.3 ms a call with float32's;
// H = 512 (1.9 and 2.1 GFLOP) 8.66 against 8.15 without them or the projection's splits
// (docs/benchmarks.md).
// Whether products of `flops` (per GEMM) run split, by the rule or SEQKERNELS_LSTM_X3_PRODUCTS.
bool use_x3_products(double flops) {
  const int mode = cuda::diagnostic_mode("SEQKERNELS_LSTM_X3_PRODUCTS");
  return mode < 0 ? flops >= kX3MinFlops : mode == 1;
}

// C[M, N] = beta·C + a·b as gemm's three TF32 products a_big·b_big + a_big'·b_small + a_small·b_big'
// (' : non-finite values as 0, so that NaN and inf reach C only through big·big, as in a float32
// GEMM), accumulated into C in that order.
void x3_products(cuda::StepGemm<float, float, float>& gemm, int64_t M, const X3Parts& a, const X3Parts& b,
                 float beta, float* c) {
  gemm(M, 1.f, a.big, b.big, beta, c);
  gemm(M, 1.f, a.big_finite(), b.small(), 1.f, c);
  gemm(M, 1.f, a.small(), b.big_finite(), 1.f, c);
}

// c[N, ldc] = a[N, K] · op(w) as x3_products, a's rows split in chunks of `chunk` into a_split
// ([3, chunk, K]); w's parts ready, gemm's M a chunk's rows.
void x3_products_by_rows(cuda::StepGemm<float, float, float>& gemm, int64_t N, int64_t K, int64_t chunk, const float* a,
                         float* a_split, const X3Parts& w, float* c, int64_t ldc, cudaStream_t stream) {
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    const X3Parts as{a_split, rows * K, true};
    x3_split(stream, a + r0 * K, K, rows, K, as);
    x3_products(gemm, rows, as, w, 0.f, c + r0 * ldc);
  }
}

// Rows of a chunk whose split buffers take bytes_per_row each, within `budget` bytes: all rows, or
// a multiple of 32 (whole K tiles of the weight gradients' GEMMs).
int64_t x3_chunk_rows(int64_t budget, int64_t bytes_per_row, int64_t rows) {
  const int64_t fit = budget / bytes_per_row;
  return fit >= rows ? rows : std::max<int64_t>(1, fit / 32 * 32);
}

// The backward's weight gradients grad_w_ih[G, I] = dGᵀ·x and grad_w_hh[G, Hout] = dGᵀ·hprev in
// float32 without TF32 as x3_products, or false, having done nothing (a chunk's GEMMs below
// kX3MinFlops). K = N runs along the operands' rows, so each row chunk of dG, x and hprev is split
// transposed (K-contiguous), dG's once for both GEMMs. The split buffers take at most grad_x's
// bytes (lstm_backward_impl allocates grad_x after these products) and kX3SplitBytes.
bool x3_weight_grads(int64_t N, int64_t G, int64_t I, int64_t Hout, const float* dG, const float* x,
                     const float* hprev, float* grad_w_ih, float* grad_w_hh, const at::TensorOptions& opts) {
  const int64_t row_floats = 3 * (G + I + Hout);
  const int64_t budget = std::min(kX3SplitBytes, std::max(N * I * 4, kX3MinSplitBytes));
  const int64_t chunk = x3_chunk_rows(budget, 4 * row_floats, N);
  if (N == 0 || !use_x3_products(2.0 * G * std::min(I, Hout) * chunk)) return false;
  // Transposed parts dGᵀ [G, rows], xᵀ [I, rows], hprevᵀ [Hout, rows] whose rows hold ld floats, rows
  // rounded up to 16-byte vectors: on 4-byte-aligned rows cuBLAS ran these TF32 GEMMs on sm80
  // kernels 2.5x slower (docs/benchmarks.md).
  Tensor split = at::empty({padded_to_vectors<float>(chunk) * row_floats}, opts);
  float* const base = split.data_ptr<float>();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cuda::BlasContext tf32_blas(true);
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    const int64_t ld = padded_to_vectors<float>(rows);
    const X3Parts g{base, G * ld, true};
    const X3Parts xs{base + 3 * G * ld, I * ld, true};
    const X3Parts hs{base + 3 * (G + I) * ld, Hout * ld, true};
    x3_split_transposed(stream, dG + r0 * G, G, rows, G, g, ld);
    x3_split_transposed(stream, x + r0 * I, I, rows, I, xs, ld);
    x3_split_transposed(stream, hprev + r0 * Hout, Hout, rows, Hout, hs, ld);
    // dW[G, cols] (+)= dGᵀ[G, rows] · (operandᵀ[cols, rows])ᵀ
    const float beta = r0 == 0 ? 0.f : 1.f;
    cuda::StepGemm<float, float, float> w_ih_gemm(tf32_blas, Trans::N, Trans::T, I, rows, ld, ld, I);
    x3_products(w_ih_gemm, G, g, xs, beta, grad_w_ih);
    cuda::StepGemm<float, float, float> w_hh_gemm(tf32_blas, Trans::N, Trans::T, Hout, rows, ld, ld, Hout);
    x3_products(w_hh_gemm, G, g, hs, beta, grad_w_hh);
  }
  return true;
}

// The backward's grad_x[N, I] = dG·W_ih in float32 without TF32 as x3_products, or false, having
// done nothing (a chunk's GEMM below kX3MinFlops): row chunks of dG split as they are, W_ih split
// once transposed ([I, G], K-contiguous) in two parts (X3Parts). The buffers take at most
// `budget` bytes (the caller's: hprev's, released before grad_x) and kX3SplitBytes. W_ih's parts
// go into `room` where it holds them (float32 scratch of the caller's: x3 dh's idle W_hh parts,
// whose 32 MiB at H = 1024 would otherwise raise the call's peak above cuDNN's), else into a
// buffer of their own.
bool x3_input_grad(int64_t N, int64_t G, int64_t I, const float* dG, const float* w_ih, float* grad_x, int64_t budget,
                   const Tensor& room, const at::TensorOptions& opts) {
  const int64_t chunk =
      x3_chunk_rows(std::min(kX3SplitBytes, std::max(budget - 8 * G * I, kX3MinSplitBytes)), 12 * G, N);
  if (N == 0 || !use_x3_products(2.0 * chunk * G * I)) return false;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Tensor w_split = room.defined() && room.numel() >= 2 * I * G ? room : at::empty({2, I, G}, opts);
  const X3Parts w{w_split.data_ptr<float>(), I * G, false};
  x3_split_transposed(stream, w_ih, I, G, I, w, G);
  Tensor g_split = at::empty({3, chunk, G}, opts);
  const cuda::BlasContext tf32_blas(true);
  cuda::StepGemm<float, float, float> gemm(tf32_blas, Trans::N, Trans::T, I, G, G, G, I);
  x3_products_by_rows(gemm, N, G, chunk, dG, g_split.data_ptr<float>(), w, grad_x, I, stream);
  return true;
}

// ---- Whole-sequence products on scaled fp16 parts (float32 without TF32) ----
// x3 dh's split (HalfDhStep) for a GEMM whose K runs down the operands' rows: the weight
// gradients dW[G, J] = dGᵀ[G, N] · [x | hprev][N, J]. Each column of dG and of [x | hprev] is
// scaled by the power of two that takes its largest finite magnitude over all N rows into
// [2^14, 2^15) (a first pass), then split into fp16 parts, big and remainder (half_remainder).
// Per row chunk, along K (rows):
//   S  (+)= bigᵀ · big                                  into grad_w_ih / grad_w_hh (scaled space)
//   X  (+)= [big ; rem]ᵀ · [rem_xh ; big_xh]            [G, J] scratch: both cross terms, one size
// and a last kernel writes (S + 2^-11·X, or S alone where S is not finite) times both columns'
// inverse scales. Three fp16 products where x3 runs three TF32 ones (or float32's SIMT GEMM),
// at twice TF32's rate on half the bytes; S keeps its own accumulator, as the TF32 products do.

// Largest finite magnitude of each column of src [rows, cols] (row stride ld), max-combined as
// float bits into col_max_bits (zeroed by the caller): order-free, so deterministic. A block per
// (32 columns, slab of rows): lanes walk columns (coalesced), warps rows.
__global__ void __launch_bounds__(kThreads) column_abs_max_kernel(const float* __restrict__ src, int64_t rows,
                                                                  int64_t cols, int64_t ld,
                                                                  unsigned* __restrict__ col_max_bits) {
  __shared__ float maxima[kWarpsPerBlock][32];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) / 32;
  const int64_t col = int64_t{blockIdx.x} * 32 + lane;
  float m = 0.0f;
  if (col < cols) {
    for (int64_t r = int64_t{blockIdx.y} * kWarpsPerBlock + warp; r < rows; r += int64_t{gridDim.y} * kWarpsPerBlock) {
      m = cuda::finite_abs_max(m, src[r * ld + col]);
    }
  }
  maxima[warp][lane] = m;
  __syncthreads();
  if (warp == 0 && col < cols) {
    for (int w = 1; w < kWarpsPerBlock; ++w) m = fmaxf(m, maxima[w][lane]);
    atomicMax(col_max_bits + col, __float_as_uint(m));  // non-negative floats order as their bits
  }
}

// Rows [0, rows) of src (row stride src_ld, cols columns) scaled per column (power_of_two_scales
// of col_max_bits) into fp16: big at dst_big[r * dst_ld + c], the remainder at dst_rem[r * dst_ld + c].
__global__ void __launch_bounds__(kThreads) split_half_columns_kernel(const float* __restrict__ src, int64_t src_ld,
                                                                      int64_t rows, int64_t cols,
                                                                      const unsigned* __restrict__ col_max_bits,
                                                                      c10::Half* __restrict__ dst_big,
                                                                      c10::Half* __restrict__ dst_rem, int64_t dst_ld) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; c < cols; c += int64_t{gridDim.x} * blockDim.x) {
      float scale, unscale;
      cuda::power_of_two_scales(__uint_as_float(col_max_bits[c]), scale, unscale);
      const float scaled = src[r * src_ld + c] * scale;
      const c10::Half big(scaled);
      dst_big[r * dst_ld + c] = big;
      dst_rem[r * dst_ld + c] = half_remainder(scaled, big);
    }
  }
}

// The last kernel of the products on fp16 parts: out0 [rows, cols0] (row stride ld0) and out1
// [rows, cols - cols0] (ld1) hold S, x [rows, ldx] holds X (columns: out0's, then out1's); both
// overwritten with the sum unscaled by their row's and column's powers of two (of row_max_bits
// and col_max_bits, as the parts were scaled).
__global__ void __launch_bounds__(kThreads) half_x3_out_kernel(const float* __restrict__ x, int64_t ldx, int64_t rows,
                                                               int64_t cols, const unsigned* __restrict__ row_max_bits,
                                                               const unsigned* __restrict__ col_max_bits,
                                                               float* __restrict__ out0, int64_t ld0, int64_t cols0,
                                                               float* __restrict__ out1, int64_t ld1) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float scale, row_unscale;
    cuda::power_of_two_scales(__uint_as_float(row_max_bits[r]), scale, row_unscale);
    for (int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; c < cols; c += int64_t{gridDim.x} * blockDim.x) {
      float col_unscale;
      cuda::power_of_two_scales(__uint_as_float(col_max_bits[c]), scale, col_unscale);
      float* out = c < cols0 ? out0 + r * ld0 + c : out1 + r * ld1 + (c - cols0);
      *out = half_parts_sum(*out, x[r * ldx + c]) * row_unscale * col_unscale;
    }
  }
}

// dx's A operand on fp16 parts: each row of src [rows, cols] (row stride src_ld) scaled by the power
// of two of its own largest finite magnitude (a warp per row), big at dst[r * dst_ld + c], the
// remainder at dst[r * dst_ld + off_rem + c]; the row's maximum as float bits into row_max_bits[r].
__global__ void __launch_bounds__(kThreads) split_half_rows_kernel(const float* __restrict__ src, int64_t src_ld,
                                                                   int64_t rows, int64_t cols,
                                                                   c10::Half* __restrict__ dst, int64_t dst_ld,
                                                                   int64_t off_rem,
                                                                   unsigned* __restrict__ row_max_bits) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  for (int64_t r = global_thread() / 32; r < rows; r += global_stride() / 32) {  // warp-uniform
    const float* row = src + r * src_ld;
    float m = 0.0f;
    for (int64_t c = lane; c < cols; c += 32) m = cuda::finite_abs_max(m, row[c]);
    m = cuda::warp_max(m);
    float scale, unscale;
    cuda::power_of_two_scales(m, scale, unscale);
    c10::Half* d = dst + r * dst_ld;
    for (int64_t c = lane; c < cols; c += 32) {
      const float scaled = row[c] * scale;
      const c10::Half big(scaled);
      d[c] = big;
      d[off_rem + c] = half_remainder(scaled, big);
    }
    if (lane == 0) row_max_bits[r] = __float_as_uint(m);
  }
}

// Grids of split_half_columns_kernel and half_x3_out_kernel: `cols` columns (x) by `rows` rows (y,
// at most 65535).
dim3 column_grid(int64_t cols, int64_t rows, int64_t cols_per_block) {
  return dim3(static_cast<unsigned>(std::min<int64_t>((cols + cols_per_block - 1) / cols_per_block, 1024)),
              static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, 65535))));
}

// column_abs_max_kernel over src [rows, cols] (contiguous) on `stream`: a block per 32 columns
// and 512 rows.
void column_abs_max(cudaStream_t stream, const float* src, int64_t rows, int64_t cols, unsigned* col_max_bits) {
  if (rows * cols == 0) return;
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32),
                  static_cast<unsigned>(std::min<int64_t>((rows + 511) / 512, 65535)));
  column_abs_max_kernel<<<grid, kThreads, 0, stream>>>(src, rows, cols, cols, col_max_bits);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The bytes the row chunks' buffers of products of `flops` on fp16 parts may take, or 0 where the
// products do not run on fp16 parts. They do where they have kX3MinFlops and their buffers `fit`
// (the caller's memory rule), or as SEQKERNELS_LSTM_X3_HALF_PRODUCTS says (diagnostic: 0 never, 1
// at any size); the chunks take at most `budget` bytes and kX3SplitBytes (forced: at least
// kX3MinSplitBytes).
constexpr int64_t kHalfX3MinChunkRows = 256;
int64_t half_x3_chunk_bytes(double flops, bool fit, int64_t budget) {
  const int mode = cuda::diagnostic_mode("SEQKERNELS_LSTM_X3_HALF_PRODUCTS");
  if (mode < 0 ? !fit || flops < kX3MinFlops : mode != 1) return 0;
  return std::min(kX3SplitBytes, std::max(budget, mode == 1 ? kX3MinSplitBytes : int64_t{0}));
}

// The weight gradients as above (the block comment), or false, having done nothing: where X
// ([G, J] floats) and the parts of a chunk of kHalfX3MinChunkRows rows fit within grad_x's bytes
// (lstm_backward_impl allocates grad_x after them, so the scratch stays within what dx's phase
// holds, as x3_weight_grads' does; half_x3_chunk_bytes). The chunks take what is left.
bool half_x3_weight_grads(int64_t N, int64_t G, int64_t I, int64_t Hout, const float* dG, const float* x,
                          const float* hprev, float* grad_w_ih, float* grad_w_hh, const at::TensorOptions& opts) {
  const int64_t J = I + Hout;
  const int64_t ldg = padded_to_vectors<c10::Half>(G), ldj = padded_to_vectors<c10::Half>(J);
  const int64_t row_bytes = 2 * (ldg + ldj) * int64_t(sizeof(c10::Half));  // big and remainder rows
  const int64_t budget = N * I * 4 - G * ldj * 4;  // grad_x's bytes less X's
  const int64_t chunk_bytes = half_x3_chunk_bytes(2.0 * N * G * J, budget >= kHalfX3MinChunkRows * row_bytes, budget);
  if (N == 0 || I == 0 || chunk_bytes == 0) return false;
  const int64_t chunk = x3_chunk_rows(chunk_bytes, row_bytes, N);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  Tensor maxima = at::empty({ldg + ldj}, opts.dtype(at::kInt));
  auto* g_max = reinterpret_cast<unsigned*>(maxima.data_ptr<int>());
  unsigned* xh_max = g_max + ldg;
  C10_CUDA_CHECK(cudaMemsetAsync(g_max, 0, maxima.nbytes(), stream));
  column_abs_max(stream, dG, N, G, g_max);
  column_abs_max(stream, x, N, I, xh_max);
  column_abs_max(stream, hprev, N, Hout, xh_max + I);
  // Per chunk: dG's parts [2·rows, ldg] (big rows, then remainders) and [x | hprev]'s [2·rows, ldj]
  // (remainders, then big rows): X's operands are the whole buffers, S's their big halves.
  Tensor parts = at::empty({2 * chunk * (ldg + ldj)}, opts.dtype(at::kHalf));
  Tensor cross = at::empty({G, ldj}, opts);
  c10::Half* const gp = parts.data_ptr<c10::Half>();
  c10::Half* const xp = gp + 2 * chunk * ldg;
  const cuda::BlasContext blas(false);
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    auto split = [&](const float* src, int64_t cols, const unsigned* max_bits, c10::Half* big, c10::Half* rem,
                     int64_t ld) {
      if (cols == 0) return;
      split_half_columns_kernel<<<column_grid(cols, rows, kThreads), kThreads, 0, stream>>>(
          src + r0 * cols, cols, rows, cols, max_bits, big, rem, ld);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    split(dG, G, g_max, gp, gp + rows * ldg, ldg);
    split(x, I, xh_max, xp + rows * ldj, xp, ldj);
    split(hprev, Hout, xh_max + I, xp + rows * ldj + I, xp + I, ldj);
    const float beta = r0 == 0 ? 0.f : 1.f;
    const c10::Half* x_big = xp + rows * ldj;
    // S: grad_w_ih[G, I] (+)= big_dG[rows, G]ᵀ · big_x[rows, I], and hprev's columns likewise.
    cuda::StepGemm<c10::Half, float, float> s_ih(blas, Trans::T, Trans::N, I, rows, ldg, ldj, I);
    s_ih(G, 1.f, gp, x_big, beta, grad_w_ih);
    if (Hout > 0) {
      cuda::StepGemm<c10::Half, float, float> s_hh(blas, Trans::T, Trans::N, Hout, rows, ldg, ldj, Hout);
      s_hh(G, 1.f, gp, x_big + I, beta, grad_w_hh);
    }
    // X[G, J] (+)= [big ; rem][2·rows, G]ᵀ · [rem_xh ; big_xh][2·rows, J]
    cuda::StepGemm<c10::Half, float, float> x_gemm(blas, Trans::T, Trans::N, J, 2 * rows, ldg, ldj, ldj);
    x_gemm(G, 1.f, gp, xp, beta, cross.data_ptr<float>());
  }
  half_x3_out_kernel<<<column_grid(J, G, kThreads), kThreads, 0, stream>>>(
      cross.data_ptr<float>(), ldj, G, J, g_max, xh_max, grad_w_ih, I, I, grad_w_hh, Hout);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

// The backward's grad_x[N, I] = dG[N, G] · W_ih[G, I] on fp16 parts, as the weight gradients' but
// with K along the operands' columns: dG's rows scaled each by its own power of two
// (split_half_rows_kernel, per row chunk: [big | rem] side by side), W_ih's columns by theirs
// (once: [rem ; big] along K), S (+)= big·big into grad_x's rows, X = [big | rem]·[rem ; big] into
// a [rows, I] scratch, and half_x3_out_kernel. Or false, having done nothing (half_x3_chunk_bytes:
// where W_ih's parts and kHalfX3MinChunkRows rows' buffers exceed `budget` bytes, the caller's:
// hprev's, released before grad_x, or W_ih's parts alone a quarter of it: at B = 16, H = 512,
// T = 256, where they were half, the chunks' buffers raised the training call's peak above
// cuDNN's, 128.8 against 128.5 MB on an H200). The chunks take what is left of `budget`.
bool half_x3_input_grad(int64_t N, int64_t G, int64_t I, const float* dG, const float* w_ih, float* grad_x,
                        int64_t budget, const at::TensorOptions& opts) {
  // dG's parts side by side along K, rows of 2G fp16 (16H bytes: 16-byte vectors).
  const int64_t ldi = padded_to_vectors<c10::Half>(I);
  const int64_t w_parts_bytes = 2 * G * ldi * int64_t(sizeof(c10::Half));
  const int64_t w_bytes = w_parts_bytes + ldi * 4;  // W_ih's parts, column maxima
  const int64_t row_bytes = 2 * G * int64_t(sizeof(c10::Half)) + ldi * 4 + 4;  // dG's parts, X, the row maximum
  const bool fit = 4 * w_parts_bytes <= budget && budget - w_bytes >= kHalfX3MinChunkRows * row_bytes;
  const int64_t chunk_bytes = half_x3_chunk_bytes(2.0 * N * G * I, fit, budget - w_bytes);
  if (N == 0 || I == 0 || chunk_bytes == 0) return false;
  const int64_t chunk = x3_chunk_rows(chunk_bytes, row_bytes, N);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  Tensor w_parts = at::empty({2 * G * ldi}, opts.dtype(at::kHalf));
  Tensor maxima = at::empty({ldi + chunk}, opts.dtype(at::kInt));
  auto* col_max = reinterpret_cast<unsigned*>(maxima.data_ptr<int>());
  unsigned* row_max = col_max + ldi;
  C10_CUDA_CHECK(cudaMemsetAsync(col_max, 0, ldi * sizeof(unsigned), stream));
  column_abs_max(stream, w_ih, G, I, col_max);
  c10::Half* const wp = w_parts.data_ptr<c10::Half>();
  split_half_columns_kernel<<<column_grid(I, G, kThreads), kThreads, 0, stream>>>(w_ih, I, G, I, col_max, wp + G * ldi,
                                                                                  wp, ldi);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  Tensor g_parts = at::empty({chunk * 2 * G}, opts.dtype(at::kHalf));
  Tensor cross = at::empty({chunk, ldi}, opts);
  const cuda::BlasContext blas(false);
  // S: grad_x rows [rows, I] = big[rows, G] · big_W[G, I]; X[rows, I] = [big | rem][rows, 2G] · [rem_W ; big_W]
  cuda::StepGemm<c10::Half, float, float> s_gemm(blas, Trans::N, Trans::N, I, G, 2 * G, ldi, I);
  cuda::StepGemm<c10::Half, float, float> x_gemm(blas, Trans::N, Trans::N, I, 2 * G, 2 * G, ldi, ldi);
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    split_half_rows_kernel<<<blocks_for(rows * 32), kThreads, 0, stream>>>(dG + r0 * G, G, rows, G,
                                                                          g_parts.data_ptr<c10::Half>(), 2 * G, G,
                                                                          row_max);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    s_gemm(rows, 1.f, g_parts.data_ptr<c10::Half>(), wp + G * ldi, 0.f, grad_x + r0 * I);
    x_gemm(rows, 1.f, g_parts.data_ptr<c10::Half>(), wp, 0.f, cross.data_ptr<float>());
    half_x3_out_kernel<<<column_grid(I, rows, kThreads), kThreads, 0, stream>>>(
        cross.data_ptr<float>(), ldi, rows, I, row_max, col_max, grad_x + r0 * I, I, I, nullptr, 0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return true;
}

// The forward's input projection pre[N, G] = x[N, I] · W_ihᵀ, in float32 without TF32 as
// x3_products from kX3MinFlops, in row chunks of x whose split buffers stay within
// kX3SplitBytes. Smaller GEMMs, and every other dtype, run one GEMM.
template <class scalar_t, class acc_t, class sc_t>
void input_projection(const cuda::BlasContext& blas, int64_t N, int64_t G, int64_t I, const scalar_t* x_p,
                      const scalar_t* w_ih_p, acc_t* pre_p, const at::TensorOptions& opts) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (!blas.tf32() && use_x3_products(2.0 * N * G * I)) {
      const int64_t chunk = x3_chunk_rows(kX3SplitBytes, 12 * I, N);
      const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
      Tensor w_split = at::empty({3, G, I}, opts);
      Tensor x_split = at::empty({3, chunk, I}, opts);
      const X3Parts w{w_split.data_ptr<float>(), G * I, true};
      x3_split(stream, w_ih_p, I, G, I, w);
      const cuda::BlasContext tf32_blas(true);  // the handle's settings of `blas`, TF32 compute
      cuda::StepGemm<float, float, float> gemm(tf32_blas, Trans::N, Trans::T, G, I, I, I, G);
      x3_products_by_rows(gemm, N, I, chunk, x_p, x_split.data_ptr<float>(), w, pre_p, G, stream);
      return;
    }
  }
  // Through a kept cuBLASLt plan (StepGemm): cublasGemmEx would run cuBLAS's heuristic on every
  // call, host time in front of the loop's launch, which an eager call's latency pays in full.
  cuda::StepGemm<scalar_t, acc_t, sc_t>(blas, Trans::N, Trans::T, G, I, I, I, G)(N, sc_t(1), x_p, w_ih_p, sc_t(0),
                                                                                 pre_p);
}

// float32 with TF32, for the cluster forward kernel's scaled fp16 path: pre = x·W_ihᵀ as an fp16
// GEMM (fp32 accumulation) of x and W_ih with their rows scaled by powers of two
// (scale_rows_to_half_kernel), or an empty tensor, having done nothing, where the rows are not
// 16-byte vectors. Returns the inverse scales [N + G], x's rows then W_ih's: pre's element (n, g) is
// x_n·W_ih,g after two exact products, by unscale[n] and unscale[N + g] (the kernel's).
Tensor half_scaled_projection(int64_t N, int64_t G, int64_t I, const float* x_p, const float* w_ih_p, float* pre_p,
                              const at::TensorOptions& opts) {
  if (I % 4 != 0 || !aligned_for<4>(x_p) || !aligned_for<4>(w_ih_p)) return Tensor();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  Tensor unscale = at::empty({N + G}, opts.dtype(at::kFloat));
  Tensor x_half = at::empty({N, I}, opts.dtype(at::kHalf));
  Tensor w_half = at::empty({G, I}, opts.dtype(at::kHalf));
  scale_rows_to_half(stream, x_p, N, I, x_half.data_ptr<c10::Half>(), unscale.data_ptr<float>());
  scale_rows_to_half(stream, w_ih_p, G, I, w_half.data_ptr<c10::Half>(), unscale.data_ptr<float>() + N);
  const cuda::BlasContext half_blas(false);
  input_projection<c10::Half, float, float>(half_blas, N, G, I, x_half.data_ptr<c10::Half>(),
                                            w_half.data_ptr<c10::Half>(), pre_p, opts);
  return unscale;
}

// c_n [B, H] in the input's type from the loop's cell state cbuf (acc_t), by one raw launch where
// they differ (half types). Why not cbuf.to(): it is issued after the loop's launch, while the loop
// runs, and in a training call the backward loop's launch waits behind it; Tensor::to's dispatch
// and TensorIterator set-up took ~70 us there (profiled, H200 host), the raw launch ~10.
template <class scalar_t, class acc_t>
Tensor cell_state_out(const Tensor& cbuf, const at::TensorOptions& opts, cudaStream_t stream) {
  if constexpr (std::is_same_v<acc_t, scalar_t>) {
    return cbuf;
  } else {
    Tensor c_n = at::empty(cbuf.sizes(), opts);
    const int64_t count = cbuf.numel();
    cell_state_out_kernel<scalar_t, acc_t>
        <<<blocks_for(count), kThreads, 0, stream>>>(cbuf.data_ptr<acc_t>(), c_n.data_ptr<scalar_t>(), count);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return c_n;
  }
}

template <class scalar_t>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> lstm_forward_impl(
    const LstmSizes& s, const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
    const std::optional<Tensor>& b_ih, const std::optional<Tensor>& b_hh, const std::optional<Tensor>& w_hr,
    bool reverse, bool training) {
  using acc_t = at::opmath_type<scalar_t>;
  using sc_t = scale_t<scalar_t>;
  const int64_t T = s.T, N = s.N, B = s.B, I = s.I, H = s.H, P = s.P, Hout = s.Hout, G = s.G;
  const bool proj = P > 0;
  const auto opts = x.options();
  const auto acc_opts = opts.dtype(at::toOpMathType(x.scalar_type()));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  // Every buffer, before the loop.
  Tensor pre = at::empty({N, G}, acc_opts);
  Tensor y = at::empty({N, Hout}, opts);
  Tensor hbuf = at::empty({B, Hout}, opts);
  Tensor cbuf = at::empty({B, H}, acc_opts);
  Tensor gates = at::empty({training ? N : 0, G}, opts);
  Tensor cells = at::empty({training ? N : 0, H}, opts);
  Tensor mbuf = proj ? at::empty({B, H}, opts) : Tensor();

  const scalar_t* x_p = x.data_ptr<scalar_t>();
  const scalar_t* w_ih_p = w_ih.data_ptr<scalar_t>();
  const scalar_t* w_hh_p = w_hh.data_ptr<scalar_t>();
  const scalar_t* w_hr_p = proj ? w_hr->data_ptr<scalar_t>() : nullptr;
  acc_t* pre_p = pre.data_ptr<acc_t>();
  scalar_t* y_p = y.data_ptr<scalar_t>();
  scalar_t* hbuf_p = hbuf.data_ptr<scalar_t>();
  acc_t* cbuf_p = cbuf.data_ptr<acc_t>();
  scalar_t* gates_p = training ? gates.data_ptr<scalar_t>() : nullptr;
  scalar_t* cells_p = training ? cells.data_ptr<scalar_t>() : nullptr;
  scalar_t* mbuf_p = proj ? mbuf.data_ptr<scalar_t>() : nullptr;
  // The biases go to the loop kernels as they are; each adds b_ih + b_hh itself.
  const scalar_t* b_ih_p = s.has_bias ? b_ih->data_ptr<scalar_t>() : nullptr;
  const scalar_t* b_hh_p = s.has_bias ? b_hh->data_ptr<scalar_t>() : nullptr;

  cuda::BlasContext blas(std::is_same_v<scalar_t, float> && cuda::rnn_allows_tf32());

  // The time loop (lstm_loop.cuh): the persistent kernel (lstm_persistent.cu) or one fused
  // kernel per step (lstm_fused_step.cu), each writing y, gates, cells, h_n (hbuf) and c_n
  // (cbuf) itself where it applies; else the cuBLAS loop below.
  const cudaDeviceProp& prop = *at::cuda::getCurrentDeviceProperties();
  const cuda::ClusterOperands cluster_ops = cuda::cluster_operands(sizeof(scalar_t), blas.tf32());
  const bool cluster_forward = cuda::cluster_forward_applies(s, prop.major, prop.multiProcessorCount, cluster_ops);
  const bool one_cluster_wide = cuda::kHalfType<scalar_t> && cuda::packed_one_cluster_forward(s, prop.major);
  const cuda::Loop loop = cuda::choose_loop(s, sizeof(scalar_t), cuda::kHalfType<scalar_t> || blas.tf32(),
                                            cuda::kHalfType<scalar_t>, /*backward=*/false, cluster_forward,
                                            /*row_split_backward=*/false, one_cluster_wide);

  // Input projection of every row at once: pre[N, G] = x[N, I] · W_ih[G, I]ᵀ. Where the cluster
  // kernel will multiply float32 on scaled fp16 operands, the projection does too (pre_unscale).
  // That kernel declines a W_hh or h0 it cannot read (half_scaled_inputs_aligned), so those calls go
  // straight to the plain projection.
  Tensor pre_unscale;
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (loop == cuda::Loop::kPersistent && cluster_forward && cluster_ops == cuda::ClusterOperands::kHalfScaled &&
        cuda::half_scaled_inputs_aligned(w_hh_p, h0.data_ptr<scalar_t>())) {
      pre_unscale = half_scaled_projection(N, G, I, x_p, w_ih_p, pre_p, opts);
    }
  }
  auto loop_kernel = [&](const float* unscale) {  // the chosen native loop's kernel, where it applies
    return (loop == cuda::Loop::kPersistent &&
            cuda::lstm_persistent_forward<scalar_t>(s, reverse, training, blas.tf32(), pre_p, unscale, b_ih_p, b_hh_p,
                                                    w_hh_p, h0.data_ptr<scalar_t>(), c0.data_ptr<scalar_t>(), y_p,
                                                    gates_p, cells_p, hbuf_p, cbuf_p, x)) ||
           (loop == cuda::Loop::kFused &&
            cuda::lstm_fused_forward<scalar_t>(s, reverse, training, blas.tf32(), pre_p, b_ih_p, b_hh_p, w_hh_p,
                                               h0.data_ptr<scalar_t>(), c0.data_ptr<scalar_t>(), y_p, gates_p,
                                               cells_p, hbuf_p, cbuf_p, x));
  };
  bool looped = pre_unscale.defined() && loop_kernel(pre_unscale.data_ptr<float>());
  if (!looped) {
    // (Where the scaled fp16 cluster kernel could not launch, the plain projection for the others.)
    input_projection<scalar_t, acc_t, sc_t>(blas, N, G, I, x_p, w_ih_p, pre_p, opts);
    looped = loop_kernel(nullptr);
  }
  if (looped) return {y, hbuf, cell_state_out<scalar_t, acc_t>(cbuf, opts, stream), gates, cells};
  // The cuBLAS loop's steps replayed from CUDA graphs, where that applies (above).
  Tensor replayed_h_n, replayed_c_n;
  if (lstm_forward_replayed<scalar_t>(s, reverse, training, blas, pre_p, b_ih_p, b_hh_p, w_hh, w_hr_p, h0, c0, y_p,
                                      gates_p, cells_p, replayed_h_n, replayed_c_n)) {
    return {y, replayed_h_n, replayed_c_n, gates, cells};
  }
  // With a projection, in the forward direction the recurrent GEMM reads h_{t-1} straight from
  // y (h0 at the first step): batch sizes never grow, so step t's rows are rows of step t-1, and
  // only the rows whose sequence ends at a step are copied into hbuf (h_n). In reverse the rows
  // that start late take h0, so h_{t-1} is kept whole in hbuf and copied there every step.
  const bool proj_from_y = proj && !reverse;
  if (!proj_from_y) hbuf.copy_(h0);
  cbuf.copy_(c0);
  const scalar_t* h_prev_p = proj_from_y ? h0.data_ptr<scalar_t>() : hbuf_p;
  // The per-step GEMMs, their cuBLASLt algorithms chosen once (blas.cuh).
  cuda::StepGemm<scalar_t, acc_t, sc_t> recurrent_gemm(blas, Trans::N, Trans::T, G, Hout, Hout, Hout, G);
  cuda::StepGemm<scalar_t, scalar_t, sc_t> projection_gemm(blas, Trans::N, Trans::T, P, H, H, H, P);
  // x3 steps (no projection): rec[2B, G] = hx[2B, 2H] · wx[G, 2H]ᵀ in TF32 on the parts
  // (store_x3_stacked), which the step kernel writes and adds; at a step of bt < B rows the GEMM
  // runs over rows [0, B + bt) (the rows in between are not read).
  const bool x3 = use_x3_steps<scalar_t>(s, blas.tf32());
  std::optional<cuda::BlasContext> tf32_blas;
  Tensor hx, wx, rec;
  scalar_t* hx_p = nullptr;
  scalar_t* hx_small_p = nullptr;
  const scalar_t* wx_p = nullptr;
  acc_t* rec_p = nullptr;
  std::optional<cuda::StepGemm<scalar_t, acc_t, sc_t>> x3_gemm;
  if (x3) {
    tf32_blas.emplace(true);
    hx = at::empty({2 * B, 2 * H}, opts);
    wx = at::empty({G, 2 * H}, opts);
    rec = at::empty({2 * B, G}, acc_opts);
    hx_p = hx.data_ptr<scalar_t>();
    hx_small_p = hx_p + B * 2 * H;
    wx_p = wx.data_ptr<scalar_t>();
    rec_p = rec.data_ptr<acc_t>();
    if constexpr (std::is_same_v<scalar_t, float>) {
      split_w_hh_x3(stream, w_hh_p, G, H, wx.data_ptr<float>());
      split_h0_x3(stream, h0.data_ptr<float>(), B, H, hx_p);
    }
    x3_gemm.emplace(*tf32_blas, Trans::N, Trans::T, G, 2 * H, 2 * H, 2 * H, G);
  }

  // One unit per thread (V = 1): 4x the threads of 16-byte accesses (V = 4), which the step
  // needs more at these sizes (H200, the plain loop inside a caller's CUDA graph, B <= 256,
  // 2026-11-26, docs/benchmarks.md: calls 1-15 % shorter in every cell measured).
  auto launch_step = [&](const acc_t* pre_t, scalar_t* gates_t, scalar_t* cells_t, scalar_t* m_t, scalar_t* h_t,
                         int64_t bt) {
    const dim3 grid(blocks_for(bt * H));
    auto launch = [&](auto kernel) {
      kernel<<<grid, kThreads, 0, stream>>>(pre_t, rec_p, x3 ? 2 : 0, B * G, b_ih_p, b_hh_p, cbuf_p, gates_t,
                                            cells_t, m_t, h_t, hx_p, hx_small_p, bt, H);
    };
    if (x3) {
      training ? launch(lstm_forward_step_kernel<scalar_t, acc_t, true, true>)
               : launch(lstm_forward_step_kernel<scalar_t, acc_t, false, true>);
    } else {
      training ? launch(lstm_forward_step_kernel<scalar_t, acc_t, true, false>)
               : launch(lstm_forward_step_kernel<scalar_t, acc_t, false, false>);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };

  for (int64_t step = 0; step < T; ++step) {
    const int64_t t = reverse ? T - 1 - step : step;
    const int64_t bt = s.batch_sizes[t];
    const int64_t off = s.offsets[t];
    acc_t* pre_t = pre_p + off * G;
    // pre[rows] += h_{t-1}[bt, Hout] · W_hh[G, Hout]ᵀ (x3: into rec, above)
    if (x3) {
      (*x3_gemm)(B + bt, sc_t(1), hx_p, wx_p, sc_t(0), rec_p);
    } else {
      recurrent_gemm(bt, sc_t(1), h_prev_p, w_hh_p, sc_t(1), pre_t);
    }
    scalar_t* y_t = y_p + off * Hout;
    launch_step(pre_t, training ? gates_p + off * G : nullptr, training ? cells_p + off * H : nullptr,
                proj ? mbuf_p : y_t, proj ? nullptr : hbuf_p, bt);
    if (proj) {
      // y[rows][bt, P] = m[bt, H] · W_hr[P, H]ᵀ, then h_t = y[rows].
      projection_gemm(bt, sc_t(1), mbuf_p, w_hr_p, sc_t(0), y_t);
      // Rows [first, bt) of hbuf get y_t: every row in reverse, in the forward direction the rows
      // whose sequence ends here (none run at step t + 1).
      const int64_t first = !proj_from_y ? 0 : (step + 1 < T ? s.batch_sizes[t + 1] : 0);
      if (first < bt) {
        C10_CUDA_CHECK(cudaMemcpyAsync(hbuf_p + first * P, y_t + first * P,
                                       static_cast<size_t>((bt - first) * P) * sizeof(scalar_t),
                                       cudaMemcpyDeviceToDevice, stream));
      }
      if (proj_from_y) h_prev_p = y_t;
    }
  }

  return {y, hbuf, cell_state_out<scalar_t, acc_t>(cbuf, opts, stream), gates, cells};
}

template <class scalar_t>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> lstm_backward_impl(
    const LstmSizes& s, const Tensor& grad_y, const Tensor& grad_h_n, const Tensor& grad_c_n, const Tensor& x,
    const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh, const std::optional<Tensor>& w_hr,
    const Tensor& y, const Tensor& gates, const Tensor& cells, bool reverse) {
  using acc_t = at::opmath_type<scalar_t>;
  using sc_t = scale_t<scalar_t>;
  const int64_t T = s.T, N = s.N, B = s.B, I = s.I, H = s.H, P = s.P, Hout = s.Hout, G = s.G;
  const bool proj = P > 0;
  const auto opts = x.options();
  const auto acc_opts = opts.dtype(at::toOpMathType(x.scalar_type()));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  // Every buffer, before the loop.
  Tensor dhbuf = at::empty({B, Hout}, acc_opts);
  Tensor dcbuf = at::empty({B, H}, acc_opts);
  Tensor dG = at::empty({N, G}, opts);
  Tensor hprev = at::empty({N, Hout}, opts);
  Tensor M = proj ? at::empty({N, H}, opts) : Tensor();
  Tensor dHtot = proj ? at::empty({N, P}, opts) : Tensor();
  Tensor dm = proj ? at::empty({B, H}, acc_opts) : Tensor();

  const scalar_t* gates_p = gates.data_ptr<scalar_t>();
  const scalar_t* cells_p = cells.data_ptr<scalar_t>();
  const scalar_t* y_p = y.data_ptr<scalar_t>();
  const scalar_t* grad_y_p = grad_y.data_ptr<scalar_t>();
  const scalar_t* h0_p = h0.data_ptr<scalar_t>();
  const scalar_t* c0_p = c0.data_ptr<scalar_t>();
  const scalar_t* w_hh_p = w_hh.data_ptr<scalar_t>();
  const scalar_t* w_hr_p = proj ? w_hr->data_ptr<scalar_t>() : nullptr;
  acc_t* dhbuf_p = dhbuf.data_ptr<acc_t>();
  acc_t* dcbuf_p = dcbuf.data_ptr<acc_t>();
  scalar_t* dG_p = dG.data_ptr<scalar_t>();
  scalar_t* hprev_p = hprev.data_ptr<scalar_t>();
  scalar_t* M_p = proj ? M.data_ptr<scalar_t>() : nullptr;
  scalar_t* dHtot_p = proj ? dHtot.data_ptr<scalar_t>() : nullptr;
  acc_t* dm_p = proj ? dm.data_ptr<acc_t>() : nullptr;

  cuda::BlasContext blas(std::is_same_v<scalar_t, float> && cuda::rnn_allows_tf32());

  const bool vec4 = !proj && H % 4 == 0 && aligned_for<4>(gates_p) && aligned_for<4>(cells_p) &&
                    aligned_for<4>(y_p) && aligned_for<4>(grad_y_p) && aligned_for<4>(h0_p) &&
                    aligned_for<4>(c0_p) && aligned_for<4>(dhbuf_p) && aligned_for<4>(dcbuf_p) &&
                    aligned_for<4>(dG_p) && aligned_for<4>(hprev_p);

  // The reverse-time loop (lstm_loop.cuh): the persistent kernel (lstm_persistent.cu) or one
  // fused kernel per step (lstm_fused_step.cu), each filling dG, hprev, dhbuf (grad_h0) and
  // dcbuf (grad_c0) as the cuBLAS loop below does, where it applies.
  const cudaDeviceProp& prop = *at::cuda::getCurrentDeviceProperties();
  const bool row_split_backward =
      cuda::row_split_backward_applies(s, sizeof(scalar_t), prop.major, prop.multiProcessorCount);
  const bool one_cluster_wide = cuda::kHalfType<scalar_t> && cuda::one_cluster_backward_wide(s, prop.major);
  const cuda::Loop loop = cuda::choose_loop(s, sizeof(scalar_t), cuda::kHalfType<scalar_t> || blas.tf32(),
                                            cuda::kHalfType<scalar_t>, /*backward=*/true, /*cluster_forward=*/false,
                                            row_split_backward, one_cluster_wide);
  const scalar_t* grad_h_n_p = grad_h_n.data_ptr<scalar_t>();
  const scalar_t* grad_c_n_p = grad_c_n.data_ptr<scalar_t>();
  const bool native =
      (loop == cuda::Loop::kPersistent &&
       cuda::lstm_persistent_backward<scalar_t>(s, reverse, blas.tf32(), w_hh_p, gates_p, cells_p, y_p, grad_y_p,
                                                h0_p, c0_p, grad_h_n_p, grad_c_n_p, dG_p, hprev_p, dhbuf_p, dcbuf_p,
                                                x)) ||
      (loop == cuda::Loop::kFused &&
       cuda::lstm_fused_backward<scalar_t>(s, reverse, blas.tf32(), w_hh_p, gates_p, cells_p, y_p, grad_y_p, h0_p,
                                           c0_p, grad_h_n_p, grad_c_n_p, dG_p, hprev_p, dhbuf_p, dcbuf_p, x));
  // Else the cuBLAS loop's steps replayed from CUDA graphs, where that applies (above).
  // Held until dx below, which may use the loop's idle x3 dh weights as scratch.
  Tensor grad_h0, grad_c0, idle_x3_weights;
  std::optional<ReplayedSteps> replay_held;
  const bool replayed = !native && lstm_backward_replayed<scalar_t>(s, reverse, blas, w_hh, w_hr_p, gates_p, cells_p,
                                                                    y_p, grad_y_p, h0, c0, grad_h_n, grad_c_n, dG_p,
                                                                    hprev_p, dHtot_p, M_p, grad_h0, grad_c0,
                                                                    replay_held, idle_x3_weights);
  const bool plain = !native && !replayed;
  if (plain) {
    dhbuf.copy_(grad_h_n);
    dcbuf.copy_(grad_c_n);
  }
  // The per-step GEMMs, their cuBLASLt algorithms chosen once (blas.cuh); nothing is built
  // until a step calls them.
  cuda::StepGemm<scalar_t, acc_t, sc_t> projection_grad_gemm(blas, Trans::N, Trans::N, H, P, P, H, H);
  cuda::StepGemm<scalar_t, acc_t, sc_t> recurrent_grad_gemm(blas, Trans::N, Trans::N, Hout, G, G, Hout, Hout);
  for (int64_t step = 0; step < T && plain; ++step) {
    // Reverse of the forward's processing order.
    const int64_t t = reverse ? step : T - 1 - step;
    const int64_t bt = s.batch_sizes[t];
    const int64_t off = s.offsets[t];
    // The step whose state step t started from: its first n_prev rows are the same sequences
    // as rows [0, n_prev) of step t; the other rows of step t start from h0 / c0.
    const StepLink prev = previous_step(s, t, reverse);
    const int64_t n_prev = prev.rows, prev_off = prev.off;
    const scalar_t* prev_cells = n_prev > 0 ? cells_p + prev_off * H : nullptr;
    const scalar_t* prev_y = n_prev > 0 ? y_p + prev_off * Hout : nullptr;
    scalar_t* dG_t = dG_p + off * G;
    scalar_t* hprev_t = hprev_p + off * Hout;

    if (proj) {
      scalar_t* dH_t = dHtot_p + off * P;
      lstm_backward_dh_kernel<scalar_t, acc_t>
          <<<blocks_for(bt * P), kThreads, 0, stream>>>(dhbuf_p, grad_y_p + off * P, dH_t, bt * P);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      // dm[bt, H] = dh[bt, P] · W_hr[P, H]
      projection_grad_gemm(bt, sc_t(1), dH_t, w_hr_p, sc_t(0), dm_p);
      lstm_backward_step_kernel<scalar_t, acc_t, 1, true><<<blocks_for(bt * H), kThreads, 0, stream>>>(
          gates_p + off * G, cells_p + off * H, prev_cells, prev_y, n_prev, h0_p, c0_p, nullptr, dm_p, dcbuf_p, dG_t,
          M_p + off * H, hprev_t, bt, H, Hout);
    } else if (vec4) {
      lstm_backward_step_kernel<scalar_t, acc_t, 4, false><<<blocks_for(bt * H / 4), kThreads, 0, stream>>>(
          gates_p + off * G, cells_p + off * H, prev_cells, prev_y, n_prev, h0_p, c0_p, grad_y_p + off * Hout,
          dhbuf_p, dcbuf_p, dG_t, nullptr, hprev_t, bt, H, Hout);
    } else {
      lstm_backward_step_kernel<scalar_t, acc_t, 1, false><<<blocks_for(bt * H), kThreads, 0, stream>>>(
          gates_p + off * G, cells_p + off * H, prev_cells, prev_y, n_prev, h0_p, c0_p, grad_y_p + off * Hout,
          dhbuf_p, dcbuf_p, dG_t, nullptr, hprev_t, bt, H, Hout);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // dL/dh_{t-1} of rows [0, bt): dhbuf[bt, Hout] = dG[rows][bt, G] · W_hh[G, Hout]
    recurrent_grad_gemm(bt, sc_t(1), dG_t, w_hh_p, sc_t(0), dhbuf_p);
  }

  // Whole-sequence products, once: the weight gradients first, so that hprev is released before
  // grad_x is allocated (one [N, Hout] buffer less at the call's peak).
  const scalar_t* x_p = x.data_ptr<scalar_t>();
  const scalar_t* w_ih_p = w_ih.data_ptr<scalar_t>();
  Tensor grad_w_ih = at::empty({G, I}, opts);
  Tensor grad_w_hh = at::empty({G, Hout}, opts);
  scalar_t* grad_w_ih_p = grad_w_ih.data_ptr<scalar_t>();
  scalar_t* grad_w_hh_p = grad_w_hh.data_ptr<scalar_t>();
  bool x3_weights = false;
  if constexpr (std::is_same_v<scalar_t, float>) {
    x3_weights = !blas.tf32() &&
                 (half_x3_weight_grads(N, G, I, Hout, dG_p, x_p, hprev_p, grad_w_ih_p, grad_w_hh_p, opts) ||
                  x3_weight_grads(N, G, I, Hout, dG_p, x_p, hprev_p, grad_w_ih_p, grad_w_hh_p, opts));
  }
  if (!x3_weights) {
    cuda::gemm<scalar_t, scalar_t, sc_t>(blas, Trans::T, Trans::N, G, I, N, sc_t(1), dG_p, G, x_p, I, sc_t(0),
                                         grad_w_ih_p, I);
    cuda::gemm<scalar_t, scalar_t, sc_t>(blas, Trans::T, Trans::N, G, Hout, N, sc_t(1), dG_p, G, hprev_p, Hout,
                                         sc_t(0), grad_w_hh_p, Hout);
  }
  const int64_t hprev_bytes = hprev.nbytes();
  hprev = Tensor();
  Tensor grad_x = at::empty({N, I}, opts);
  scalar_t* grad_x_p = grad_x.data_ptr<scalar_t>();
  bool x3_input = false;
  if constexpr (std::is_same_v<scalar_t, float>) {
    x3_input = !blas.tf32() && (half_x3_input_grad(N, G, I, dG_p, w_ih_p, grad_x_p, hprev_bytes, opts) ||
                                x3_input_grad(N, G, I, dG_p, w_ih_p, grad_x_p, hprev_bytes, idle_x3_weights, opts));
  }
  replay_held.reset();
  if (!x3_input) {
    cuda::gemm<scalar_t, scalar_t, sc_t>(blas, Trans::N, Trans::N, N, I, G, sc_t(1), dG_p, G, w_ih_p, I, sc_t(0),
                                         grad_x_p, I);
  }
  Tensor grad_bias;
  if (s.has_bias) {
    // Column sums of dG as a GEMM with a ones row: [1, N] · [N, G] (deterministic, fp32 accumulation).
    Tensor ones = at::ones({N}, opts);
    grad_bias = at::empty({G}, opts);
    cuda::gemm<scalar_t, scalar_t, sc_t>(blas, Trans::N, Trans::N, 1, G, N, sc_t(1), ones.data_ptr<scalar_t>(), N,
                                         dG_p, G, sc_t(0), grad_bias.data_ptr<scalar_t>(), G);
  } else {
    grad_bias = at::empty({0}, opts);
  }
  Tensor grad_w_hr;
  if (proj) {
    grad_w_hr = at::empty({P, H}, opts);
    cuda::gemm<scalar_t, scalar_t, sc_t>(blas, Trans::T, Trans::N, P, H, N, sc_t(1), dHtot_p, P, M_p, H, sc_t(0),
                                         grad_w_hr.data_ptr<scalar_t>(), H);
  } else {
    grad_w_hr = at::empty({0, 0}, opts);
  }
  if (!replayed) {
    grad_h0 = std::is_same_v<acc_t, scalar_t> ? dhbuf : dhbuf.to(x.scalar_type());
    grad_c0 = std::is_same_v<acc_t, scalar_t> ? dcbuf : dcbuf.to(x.scalar_type());
  }
  return {grad_x, grad_h0, grad_c0, grad_w_ih, grad_w_hh, grad_bias, grad_w_hr};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> lstm_forward_cuda(
    const Tensor& x, const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
    const Tensor& w_hh, const std::optional<Tensor>& b_ih, const std::optional<Tensor>& b_hh,
    const std::optional<Tensor>& w_hr, bool reverse, bool training) {
  check_on_cuda(x, "seqkernels.lstm_forward");
  // Shapes, dtypes, contiguity, and every tensor on x's device (batch_sizes: CPU int64).
  const LstmSizes s = check_lstm_forward(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr);
  const c10::cuda::CUDAGuard guard(x.device());
  return AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "seqkernels.lstm_forward", [&] {
    return lstm_forward_impl<scalar_t>(s, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse, training);
  });
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> lstm_backward_cuda(
    const Tensor& grad_y, const Tensor& grad_h_n, const Tensor& grad_c_n, const Tensor& x, const Tensor& batch_sizes,
    const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh, const std::optional<Tensor>& w_hr,
    const Tensor& y, const Tensor& gates, const Tensor& cells, bool reverse, bool has_bias) {
  check_on_cuda(x, "seqkernels.lstm_backward");
  const LstmSizes s = check_lstm_backward(grad_y, grad_h_n, grad_c_n, x, batch_sizes, h0, c0, w_ih, w_hh, w_hr, y,
                                          gates, cells, has_bias);
  const c10::cuda::CUDAGuard guard(x.device());
  return AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "seqkernels.lstm_backward", [&] {
    return lstm_backward_impl<scalar_t>(s, grad_y, grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, w_hr, y, gates, cells,
                                        reverse);
  });
}

std::tuple<Tensor, Tensor, Tensor> lstm_infer_cuda(const Tensor& input, const std::optional<Tensor>& h0,
                                                   const std::optional<Tensor>& c0, const Tensor& w_ih,
                                                   const Tensor& w_hh, const std::optional<Tensor>& b_ih,
                                                   const std::optional<Tensor>& b_hh, bool batch_first,
                                                   bool reverse) {
  return lstm_infer(input, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first, reverse, &lstm_forward_cuda);
}

}  // namespace

namespace cuda {
void release_lstm_step_graphs() {
  release_all_pools<ReplayPool>([](ReplayPool& pool) { pool.release_all(); });
}
}  // namespace cuda
}  // namespace seqkernels

TORCH_LIBRARY_IMPL(seqkernels, CUDA, m) {
  m.impl("lstm_forward", &seqkernels::lstm_forward_cuda);
  m.impl("lstm_infer", &seqkernels::lstm_infer_cuda);
  m.impl("lstm_backward", &seqkernels::lstm_backward_cuda);
}
