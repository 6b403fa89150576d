// CUDA implementation of seqkernels::convrnn_forward and seqkernels::convrnn_backward: the
// circulant ("wave") convolutional RNN, the whole sequence per call (schemas and semantics in
// csrc/registration.cpp; the CPU kernel is csrc/cpu/convrnn.cpp).
//
// Shape legend: B batch, T steps, C channels, N ring size, K kernel width, CN = C·N, NP = N + K - 1
// (a padded ring row), L = K/2 (left pad of the forward convolution), R = K - 1 - L (right pad).
// acc_t is float for half types (float16, bfloat16) and scalar_t otherwise: true float32 / float64
// arithmetic, no TF32, no fast-math intrinsics.
//
// Forward: one persistent block per sequence b (grid B). The block keeps the padded state
// hpad [C, NP] (double-buffered, acc_t), the weight [C, C, K] and the bias [C] in shared memory
// for all T steps; a thread owns the ring units e = c·N + n, e ≡ threadIdx.x (mod blockDim).
//   step t: pre = x[b,t,c,n] + bias[c] + Σ_{ci,k} w[c,ci,k]·hpad_{t-1}[ci, n+k];  h = act(pre)
//   y[b,t] = h (rounded to scalar_t; the rounded value is the state, as y is what backward sees),
//   written coalesced, and into the other hpad buffer together with its circular halo copies;
//   one __syncthreads per step. x is staged through shared memory S steps at a time, double-
//   buffered: the next chunk of S·CN inputs (contiguous in memory) is copied asynchronously
//   (cp.async) while the current chunk is computed, so no step waits on global memory.
//   For C·N >= 1024, where the ring splits into 8 or 4 equal segments of at least K units
//   (C·N / G <= 512), a thread-block-cluster variant spreads each sequence over that many blocks,
//   which trade halos every few steps (see convrnn_forward_cluster_kernel;
//   SEQKERNELS_CONVRNN_CLUSTER=0 turns it off).
//   Otherwise, for K = 3 and C·N >= 1024 a tiled variant runs: a thread owns 4 consecutive units of
//   a channel and reuses each padded state value it reads for up to 3 outputs. For states of at
//   most 32 units (C·N <= 32, C·K <= 32) a warp variant runs: one warp per sequence, the state
//   in registers, taps by shuffles, no barrier (the template's shape, C = 1, N = 16).
// Backward: the same block design in reverse time, with the adjoint convolution
//   g_t = (grad_y[t] + carry_t)·act'(y_t) -> grad_x[t] (act' = 1 - y² for tanh, y > 0 for relu)
//   carry_{t-1}[ci, m] = Σ_{co,k} w[co,ci,K-1-k]·gpad_t[co, m+k]   (gpad: g padded R left, L right)
//   carry_{T-1} = grad_h_T, grad_h0 = carry_{-1}.
// The weight and bias gradients are a separate, fully parallel reduction over the B·T·N products
// grad_w[co,ci,k] = Σ g[b,t,co,n]·hpad_{t-1}[b,ci,n+k], grad_bias[co] = Σ g[b,t,co,n] (hpad_{t-1}
// from y[b,t-1], or h0 at t = 0): a fixed partition of the (b, t) rows into blocks, each writing
// its partial sums to a buffer, then a fixed-order sum over the blocks. No atomics: the result is
// bit-for-bit deterministic, independent of the device.
//
// Supported sizes: the state (2·C·NP) plus weight (C·C·K) and bias of acc_t must fit in one
// block's shared memory (227 KB on Hopper: e.g. C = 16, N = 1024, K = 9 in float32 needs 141 KB),
// and so must one (b, t) row of the weight-gradient reduction ((C·N + C·NP) acc_t); otherwise a
// RuntimeError says so (the cluster forward splits the state over blocks; backward does not
// yet). Inputs are staged only when a step's slice is a multiple of the copy unit (4 bytes; 8
// for float64): 16-bit types with odd C·N read them from global memory directly (correct,
// slower).
// Everything runs on the current stream with caching-allocator buffers: no host synchronisation,
// CUDA-graph safe. T is a loop counter, never a launch dimension; in-kernel offsets are 64-bit.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <tuple>

#include "cluster.cuh"
#include "seqkernels/convrnn_checks.h"
#include "seqkernels/error_format.h"

namespace seqkernels {
namespace {

using at::Tensor;

constexpr int kMaxSeqThreads = 512;  // threads of a persistent (per-sequence) block, at most
constexpr int kMaxStageSteps = 16;   // steps per staged chunk, at most
constexpr int64_t kStageBytes = 128 * 1024;  // shared memory for staged inputs (both buffers), at most
constexpr int kWgradThreads = 256;   // threads of a weight-gradient block
constexpr int64_t kWgradBlocks = 256;  // target number of row blocks of the weight-gradient reduction (fixed:
                                       // the partition, and so the rounding, never depends on the device)
constexpr int kReduceThreads = 128;
// The tiled persistent kernels: K = kTileK, tiles of kTileV units, used from C·N >= kTileMinUnits
// (below that a step is latency-bound and the per-unit kernels spread the work over more threads).
constexpr int kTileK = 3;
constexpr int kTileV = 4;
constexpr int64_t kTileMinUnits = 1024;

// The nonlinearity and its derivative expressed through the output y = act(pre).
template <class acc_t>
__device__ __forceinline__ acc_t activate(acc_t pre, bool relu) {
  if (relu) return pre < acc_t(0) ? acc_t(0) : pre;  // NaN propagates, as in torch.relu
  if constexpr (std::is_same_v<acc_t, double>) {
    return ::tanh(pre);
  } else {
    return tanhf(pre);
  }
}
template <class acc_t>
__device__ __forceinline__ acc_t activate_grad(acc_t dy, acc_t y, bool relu) {
  if (relu) return y > acc_t(0) ? dy : acc_t(0);
  return dy * (acc_t(1) - y * y);
}

// Writes value v of ring unit (c, n) into a padded row set pad [C, NP] at column n + left, and,
// with circular padding, into the halo columns that wrap around to it. Zero padding leaves the
// halo at the zeros it was initialised with. Circular padding has K <= N, so each halo column
// has exactly one source unit.
template <class acc_t>
__device__ __forceinline__ void write_padded(acc_t* pad, int c, int n, acc_t v, int N, int NP, int left,
                                             bool circular) {
  acc_t* row = pad + static_cast<int64_t>(c) * NP;
  const int j = n + left;
  row[j] = v;
  if (circular) {
    if (j - N >= 0) row[j - N] = v;
    if (j + N < NP) row[j + N] = v;
  }
}

// Σ_{ci,k} w_row[ci, k]·pad[ci, n + k]: one output unit of a width-K cross-correlation.
template <class acc_t>
__device__ __forceinline__ acc_t conv_unit(const acc_t* w_row,  // [C, K] the output channel's weights
                                           const acc_t* pad,    // [C, NP] padded input rows
                                           int C, int K, int NP, int n) {
  acc_t s = acc_t(0);
  for (int ci = 0; ci < C; ++ci) {
    const acc_t* wr = w_row + ci * K;
    const acc_t* pr = pad + static_cast<int64_t>(ci) * NP + n;
    for (int k = 0; k < K; ++k) s += wr[k] * pr[k];
  }
  return s;
}

// Staging through shared memory: asynchronous global -> shared copies (cp.async, sm_80+) in units
// of U bytes (8 for double, else 4: float, or two 16-bit values), so that no register holds an
// input in flight. The host stages only when every chunk is U-aligned (else S = 0, direct reads).
template <class scalar_t>
constexpr int copy_unit() {
  return sizeof(scalar_t) == 8 ? 8 : 4;
}

// Starts the copy of `bytes` (a multiple of U) from global src to shared dst, split over the
// block's threads, as one commit group of each thread.
template <int U>
__device__ __forceinline__ void copy_async(void* dst, const void* src, int64_t bytes, int tid, int nt) {
  const int64_t units = bytes / U;
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (int64_t i = tid; i < units; i += nt) {
    const unsigned int sd = static_cast<unsigned int>(__cvta_generic_to_shared(d + i * U));
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(sd), "l"(s + i * U), "n"(U) : "memory");
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits for this thread's copies; a __syncthreads must follow before other threads read them.
__device__ __forceinline__ void copy_wait() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// ---------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------

// The whole forward sequence of one batch row b = blockIdx.x. Dynamic shared memory:
// hpad [2][C, NP] acc_t, w [C, C, K] acc_t, bias [C] acc_t, then xs [2][S, C, N] scalar_t.
template <class scalar_t, class acc_t>
__global__ void __launch_bounds__(kMaxSeqThreads) convrnn_forward_kernel(
    const scalar_t* __restrict__ x,       // [B, T, C, N] inputs
    const scalar_t* __restrict__ weight,  // [C, C, K] recurrent weight (out, in, k)
    const scalar_t* __restrict__ bias,    // [C] or nullptr
    const scalar_t* __restrict__ h0,      // [B, C, N] initial state
    scalar_t* __restrict__ y,             // [B, T, C, N] out: h_1 .. h_T
    scalar_t* __restrict__ h_T,           // [B, C, N] out: h_T
    int64_t T, int C, int N, int K,
    int S,           // steps of x staged in shared memory per chunk; 0: read x from global memory
    bool circular,   // padding_mode 0 (else zeros)
    bool relu) {     // nonlinearity 1 (else tanh)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int NP = N + K - 1, L = K / 2, CN = C * N;
  acc_t* hbuf0 = reinterpret_cast<acc_t*>(smem_raw);    // [C, NP]
  acc_t* hbuf1 = hbuf0 + C * NP;                          // [C, NP]
  acc_t* w = hbuf1 + C * NP;                              // [C, C, K]
  acc_t* bs = w + C * C * K;                              // [C]
  scalar_t* xs0 = reinterpret_cast<scalar_t*>(bs + C);    // [S, C, N] staged x, two buffers
  scalar_t* xs1 = xs0 + static_cast<int64_t>(S) * CN;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t b = blockIdx.x;

  for (int i = tid; i < 2 * C * NP; i += nt) hbuf0[i] = acc_t(0);  // both buffers: the zero halo
  for (int i = tid; i < C * C * K; i += nt) w[i] = static_cast<acc_t>(weight[i]);
  for (int i = tid; i < C; i += nt) bs[i] = bias != nullptr ? static_cast<acc_t>(bias[i]) : acc_t(0);
  __syncthreads();
  const scalar_t* h0b = h0 + b * CN;
  for (int e = tid; e < CN; e += nt) {
    const int c = e / N;
    write_padded(hbuf0, c, e - c * N, static_cast<acc_t>(h0b[e]), N, NP, L, circular);
  }

  const scalar_t* xb = x + b * T * CN;
  scalar_t* yb = y + b * T * CN;
  scalar_t* hTb = h_T + b * CN;
  const bool staged = S > 0;
  const int64_t span = staged ? S : T;
  constexpr int U = copy_unit<scalar_t>();
  if (staged) copy_async<U>(xs0, xb, std::min<int64_t>(S, T) * CN * sizeof(scalar_t), tid, nt);
  int buf = 0;
  acc_t* cur = hbuf0;
  acc_t* nxt = hbuf1;
  for (int64_t t0 = 0; t0 < T; t0 += span) {
    const int64_t steps = std::min<int64_t>(span, T - t0);
    // This chunk's copies complete and visible; every thread is past the last step's barrier, so
    // the other buffer (the previous chunk's) is free for the next chunk's copies.
    const scalar_t* xs = buf ? xs1 : xs0;
    if (staged) copy_wait();
    __syncthreads();
    if (staged && t0 + span < T) {
      copy_async<U>(buf ? xs0 : xs1, xb + (t0 + span) * CN,
                    std::min<int64_t>(span, T - t0 - span) * CN * sizeof(scalar_t), tid, nt);
    }
    buf ^= 1;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t t = t0 + s;
      for (int e = tid; e < CN; e += nt) {
        const int c = e / N;
        const int n = e - c * N;
        const scalar_t xv = staged ? xs[s * CN + e] : xb[t * CN + e];
        const acc_t pre = static_cast<acc_t>(xv) + bs[c] + conv_unit(w + c * C * K, cur, C, K, NP, n);
        const scalar_t out = static_cast<scalar_t>(activate(pre, relu));
        yb[t * CN + e] = out;
        if (t == T - 1) hTb[e] = out;
        write_padded(nxt, c, n, static_cast<acc_t>(out), N, NP, L, circular);
      }
      __syncthreads();  // h_t complete in nxt, every read of cur done
      acc_t* tmp = cur;
      cur = nxt;
      nxt = tmp;
    }
  }
}

// The whole reverse-time sequence of one batch row b = blockIdx.x: grad_x and grad_h0. Dynamic
// shared memory: gpad [2][C, NP] acc_t, wt [C, C, K] acc_t (wt[ci, co, k] = w[co, ci, K-1-k]),
// then gys [2][S, C, N] and ys [2][S, C, N] scalar_t.
template <class scalar_t, class acc_t>
__global__ void __launch_bounds__(kMaxSeqThreads) convrnn_backward_kernel(
    const scalar_t* __restrict__ grad_y,    // [B, T, C, N] dL/dy
    const scalar_t* __restrict__ grad_h_T,  // [B, C, N] dL/dh_T
    const scalar_t* __restrict__ weight,    // [C, C, K] recurrent weight (out, in, k)
    const scalar_t* __restrict__ y,         // [B, T, C, N] forward outputs h_1 .. h_T
    scalar_t* __restrict__ grad_x,          // [B, T, C, N] out: g_t = dL/d(pre-activation of step t)
    scalar_t* __restrict__ grad_h0,         // [B, C, N] out: dL/dh0
    int64_t T, int C, int N, int K,
    int S,           // steps of grad_y and y staged in shared memory per chunk; 0: global reads
    bool circular, bool relu) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int NP = N + K - 1, L = K / 2, R = K - 1 - L, CN = C * N;
  acc_t* gbuf0 = reinterpret_cast<acc_t*>(smem_raw);   // [C, NP]
  acc_t* gbuf1 = gbuf0 + C * NP;                         // [C, NP]
  acc_t* wt = gbuf1 + C * NP;                            // [C, C, K] adjoint weight
  scalar_t* gys0 = reinterpret_cast<scalar_t*>(wt + C * C * K);  // [S, C, N] staged grad_y, two buffers
  scalar_t* gys1 = gys0 + static_cast<int64_t>(S) * CN;
  scalar_t* ys0 = gys1 + static_cast<int64_t>(S) * CN;            // [S, C, N] staged y, two buffers
  scalar_t* ys1 = ys0 + static_cast<int64_t>(S) * CN;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t b = blockIdx.x;

  for (int i = tid; i < 2 * C * NP; i += nt) gbuf0[i] = acc_t(0);
  for (int i = tid; i < C * C * K; i += nt) {
    const int k = i % K;
    const int co = (i / K) % C;
    const int ci = i / (C * K);
    wt[i] = static_cast<acc_t>(weight[(static_cast<int64_t>(co) * C + ci) * K + (K - 1 - k)]);
  }
  const scalar_t* gyb = grad_y + b * T * CN;
  const scalar_t* yb = y + b * T * CN;
  scalar_t* gxb = grad_x + b * T * CN;
  const bool staged = S > 0;
  const int64_t span = staged ? S : T;
  constexpr int U = copy_unit<scalar_t>();
  if (staged) {
    const int64_t lo = std::max<int64_t>(0, T - span);
    copy_async<U>(gys0, gyb + lo * CN, (T - lo) * CN * sizeof(scalar_t), tid, nt);
    copy_async<U>(ys0, yb + lo * CN, (T - lo) * CN * sizeof(scalar_t), tid, nt);
  }
  int buf = 0;
  acc_t* cur = gbuf0;  // g_{t+1} padded
  acc_t* nxt = gbuf1;
  for (int64_t hi = T; hi > 0; hi -= span) {
    const int64_t lo = std::max<int64_t>(0, hi - span);
    const scalar_t* gys = buf ? gys1 : gys0;
    const scalar_t* ys = buf ? ys1 : ys0;
    if (staged) copy_wait();
    __syncthreads();
    if (staged && lo > 0) {
      const int64_t lo2 = std::max<int64_t>(0, lo - span);
      copy_async<U>(buf ? gys0 : gys1, gyb + lo2 * CN, (lo - lo2) * CN * sizeof(scalar_t), tid, nt);
      copy_async<U>(buf ? ys0 : ys1, yb + lo2 * CN, (lo - lo2) * CN * sizeof(scalar_t), tid, nt);
    }
    buf ^= 1;
    for (int64_t t = hi - 1; t >= lo; --t) {
      for (int e = tid; e < CN; e += nt) {
        const int c = e / N;
        const int n = e - c * N;
        const acc_t carry = t == T - 1 ? static_cast<acc_t>(grad_h_T[b * CN + e])
                                       : conv_unit(wt + c * C * K, cur, C, K, NP, n);
        const int64_t off = staged ? (t - lo) * CN + e : t * CN + e;
        const scalar_t gy = staged ? gys[off] : gyb[off];
        const scalar_t yv = staged ? ys[off] : yb[off];
        const acc_t g = activate_grad(static_cast<acc_t>(gy) + carry, static_cast<acc_t>(yv), relu);
        gxb[t * CN + e] = static_cast<scalar_t>(g);
        write_padded(nxt, c, n, g, N, NP, R, circular);
      }
      __syncthreads();
      acc_t* tmp = cur;
      cur = nxt;
      nxt = tmp;
    }
  }
  // grad_h0 = carry_{-1}: the adjoint convolution of g_0 (cur after the loop; T >= 1).
  for (int e = tid; e < CN; e += nt) {
    const int c = e / N;
    grad_h0[b * CN + e] = static_cast<scalar_t>(conv_unit(wt + c * C * K, cur, C, K, NP, e - c * N));
  }
}

// ---------------------------------------------------------------------------------------
// Warp kernels (states of at most 32 units, C·N <= 32, and C·K <= 32 taps): one warp per
// sequence, lane e = c·N + n holds its unit's state in a register for all T steps and reads its
// K·C taps from the other lanes with shuffles: no shared memory, no block barrier, so a step
// costs a chain of shuffles, FMAs and the activation. x (backward: grad_y and y) is loaded
// kWarpPrefetch steps ahead into registers (the step loop is unrolled by that much), off the
// dependency chain. Same summation order as conv_unit, so the same values as the block kernels.
// ---------------------------------------------------------------------------------------

constexpr int kWarpMaxUnits = 32;
constexpr int kWarpsPerBlock = 4;  // sequences per block
constexpr int kWarpPrefetch = 8;   // steps loaded ahead
constexpr int kWarpFewTaps = 4;    // a second, shorter instantiation for C·K <= 4 (the template's C = 1, K = 3)

// The taps of one lane's unit (c, n): tap j = ci·K + k reads ring unit (ci, n + k - left) of the
// state (wrapped around the ring, or 0 outside it with zero padding) with weight w[j].
template <class acc_t, int TAPS>
struct WarpRingTaps {
  acc_t w[TAPS];
  int src[TAPS];         // the lane holding the tap's unit
  unsigned int valid;    // bit j: tap j lies on the ring (zero padding), else it reads 0
  int count;             // C·K

  // weight_at(ci, k): the tap's weight for this lane's channel (only called for active lanes).
  template <class WeightAt>
  __device__ __forceinline__ WarpRingTaps(int C, int N, int K, int left, int n, bool active, bool circular,
                                          WeightAt weight_at)
      : valid(0), count(C * K) {
#pragma unroll
    for (int j = 0; j < TAPS; ++j) {
      w[j] = acc_t(0);
      src[j] = 0;
      if (j < count && active) {
        const int ci = j / K, k = j - ci * K;
        int m = n + k - left;
        bool on_ring = true;
        if (circular) {
          m = ((m % N) + N) % N;
        } else {
          on_ring = m >= 0 && m < N;
        }
        src[j] = ci * N + (on_ring ? m : 0);
        valid |= on_ring ? (1u << j) : 0u;
        w[j] = weight_at(ci, k);
      }
    }
  }

  // state[src[j]] (0 off the ring): every lane of the warp must call it (a shuffle).
  __device__ __forceinline__ acc_t tap(acc_t h, int j) const {
    const acc_t v = __shfl_sync(0xffffffffu, h, src[j]);
    return ((valid >> j) & 1u) ? v : acc_t(0);
  }

  // Σ_j w[j]·state[src[j]]: every lane of the warp must call it (shuffles), with its own state h.
  __device__ __forceinline__ acc_t conv(acc_t h) const {
    acc_t s = acc_t(0);
#pragma unroll
    for (int j = 0; j < TAPS; ++j) {
      if (j < count) {  // warp-uniform
        const acc_t v = __shfl_sync(0xffffffffu, h, src[j]);
        s += w[j] * (((valid >> j) & 1u) ? v : acc_t(0));
      }
    }
    return s;
  }
};

template <class scalar_t, class acc_t, int TAPS>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) convrnn_forward_warp_kernel(
    const scalar_t* __restrict__ x,       // [B, T, C, N] inputs
    const scalar_t* __restrict__ weight,  // [C, C, K] recurrent weight (out, in, k)
    const scalar_t* __restrict__ bias,    // [C] or nullptr
    const scalar_t* __restrict__ h0,      // [B, C, N] initial state
    scalar_t* __restrict__ y,             // [B, T, C, N] out: h_1 .. h_T
    scalar_t* __restrict__ h_T,           // [B, C, N] out: h_T
    int64_t B, int64_t T, int C, int N, int K, bool circular, bool relu) {
  constexpr int P = kWarpPrefetch;
  const int lane = threadIdx.x % 32;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (b >= B) return;  // whole warps only
  const int CN = C * N;
  const bool active = lane < CN;
  const int c = active ? lane / N : 0;
  const int n = active ? lane - c * N : 0;
  const WarpRingTaps<acc_t, TAPS> taps(C, N, K, K / 2, n, active, circular, [&](int ci, int k) {
    return static_cast<acc_t>(weight[(static_cast<int64_t>(c) * C + ci) * K + k]);
  });
  const acc_t bias_c = bias != nullptr && active ? static_cast<acc_t>(bias[c]) : acc_t(0);
  acc_t h = active ? static_cast<acc_t>(h0[b * CN + lane]) : acc_t(0);
  const scalar_t* xb = x + b * T * CN + lane;
  scalar_t* yb = y + b * T * CN + lane;

  scalar_t xq[P];  // xq[p]: x of the next step t ≡ p (mod P)
#pragma unroll
  for (int p = 0; p < P; ++p) xq[p] = active && p < T ? xb[p * CN] : scalar_t(0);
  for (int64_t t0 = 0; t0 < T; t0 += P) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t t = t0 + p;
      if (t < T) {  // warp-uniform
        const acc_t s = taps.conv(h);
        const acc_t xv = static_cast<acc_t>(xq[p]);
        if (active && t + P < T) xq[p] = xb[(t + P) * CN];
        const scalar_t out = static_cast<scalar_t>(activate(xv + bias_c + s, relu));
        if (active) yb[t * CN] = out;
        h = static_cast<acc_t>(out);  // the rounded value is the state (as in the block kernels)
      }
    }
  }
  if (active) h_T[b * CN + lane] = static_cast<scalar_t>(h);
}

// Element strides of the incoming gradients, which may have any layout (autograd hands over
// expanded, stride-0 gradients for sums; reading them in place saves a copy and its launch).
struct GradStrides {
  int64_t yb, yt, yc, yn;  // grad_y [B, T, C, N]
  int64_t hb, hc, hn;      // grad_h_T [B, C, N]
};

// Reverse time: g_t = (grad_y[t] + carry_t)·act'(y_t), carry_t = the adjoint convolution of
// g_{t+1} (grad_h_T at t = T - 1), grad_h0 = the adjoint convolution of g_0.
// With few taps (TAPS <= kWarpFewTaps, the template's shape) the kernel also sums this
// sequence's weight and bias gradients, Σ_t g_t[c, n]·h_{t-1}[ci, n + k - K/2] and Σ_t g_t[c, n],
// from the values it already holds (h_{t-1} is the next step's prefetched y, read by shuffles):
// wgrad_partial[b] = this sequence's [C·C·K (+ C)] sums, which convrnn_wgrad_reduce_kernel adds
// over b. That replaces the separate partial kernel, its launch and its second pass over
// grad_x and y. Each lane sums P steps at a time, then adds the block to its total (shorter
// rounding chains over long sequences); lanes of a channel are added by a fixed shuffle tree.
template <class scalar_t, class acc_t, int TAPS>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) convrnn_backward_warp_kernel(
    const scalar_t* __restrict__ grad_y,    // [B, T, C, N] dL/dy, strides gs.y*
    const scalar_t* __restrict__ grad_h_T,  // [B, C, N] dL/dh_T, strides gs.h*
    const scalar_t* __restrict__ weight,    // [C, C, K] recurrent weight (out, in, k)
    const scalar_t* __restrict__ h0,        // [B, C, N] initial state
    const scalar_t* __restrict__ y,         // [B, T, C, N] forward outputs h_1 .. h_T
    scalar_t* __restrict__ grad_x,          // [B, T, C, N] out: g_t
    scalar_t* __restrict__ grad_h0,         // [B, C, N] out: dL/dh0
    acc_t* __restrict__ wgrad_partial,      // [B, n_out] out (TAPS <= kWarpFewTaps only)
    GradStrides gs, int64_t B, int64_t T, int C, int N, int K, bool circular, bool relu, bool has_bias) {
  constexpr int P = kWarpPrefetch;
  constexpr bool kWgrad = TAPS <= kWarpFewTaps;
  const int lane = threadIdx.x % 32;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (b >= B) return;
  const int CN = C * N;
  const bool active = lane < CN;
  const int c = active ? lane / N : 0;
  const int n = active ? lane - c * N : 0;
  // carry[c, n] = Σ_{co,k} w[co, c, K-1-k]·g[co, n + k - R] (conv_unit's order over the adjoint wt)
  const WarpRingTaps<acc_t, TAPS> taps(C, N, K, K - 1 - K / 2, n, active, circular, [&](int co, int k) {
    return static_cast<acc_t>(weight[(static_cast<int64_t>(co) * C + c) * K + (K - 1 - k)]);
  });
  // The forward's taps of this lane's unit (weights unused): h_{t-1}[ci, n + k - K/2].
  const WarpRingTaps<acc_t, TAPS> fwd(C, N, K, K / 2, n, active, circular, [](int, int) { return acc_t(0); });
  const scalar_t* gyb = grad_y + b * gs.yb + c * gs.yc + n * gs.yn;
  const scalar_t* yb = y + b * T * CN + lane;
  scalar_t* gxb = grad_x + b * T * CN + lane;
  const acc_t carry_T = active ? static_cast<acc_t>(grad_h_T[b * gs.hb + c * gs.hc + n * gs.hn]) : acc_t(0);
  const acc_t h0v = kWgrad && active ? static_cast<acc_t>(h0[b * CN + lane]) : acc_t(0);

  scalar_t gq[P], yq[P];  // slot p: step t = T - 1 - p (mod P)
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int64_t t = T - 1 - p;
    gq[p] = active && t >= 0 ? gyb[t * gs.yt] : scalar_t(0);
    yq[p] = active && t >= 0 ? yb[t * CN] : scalar_t(0);
  }
  acc_t wsum[kWgrad ? TAPS + 1 : 1];  // this lane's totals: taps j < C·K, then the bias
#pragma unroll
  for (int j = 0; j <= (kWgrad ? TAPS : 0); ++j) wsum[j] = acc_t(0);
  acc_t g = acc_t(0);  // g_{t+1}
  for (int64_t t0 = T - 1; t0 >= 0; t0 -= P) {
    acc_t wblock[kWgrad ? TAPS + 1 : 1];  // the sums over this block of P steps
#pragma unroll
    for (int j = 0; j <= (kWgrad ? TAPS : 0); ++j) wblock[j] = acc_t(0);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t t = t0 - p;
      if (t >= 0) {  // warp-uniform
        const acc_t carry = t == T - 1 ? carry_T : taps.conv(g);
        const acc_t gy = static_cast<acc_t>(gq[p]);
        const acc_t yv = static_cast<acc_t>(yq[p]);
        // y_{t-1} sits in the next slot (slot 0, refilled with t0 - P at p = 0, when p = P - 1).
        const acc_t yprev = t >= 1 ? static_cast<acc_t>(yq[(p + 1) % P]) : h0v;
        if (active && t - P >= 0) {
          gq[p] = gyb[(t - P) * gs.yt];
          yq[p] = yb[(t - P) * CN];
        }
        g = activate_grad(gy + carry, yv, relu);
        if (active) gxb[t * CN] = static_cast<scalar_t>(g);
        if constexpr (kWgrad) {
#pragma unroll
          for (int j = 0; j < TAPS; ++j) {
            if (j < taps.count) wblock[j] += g * fwd.tap(yprev, j);  // warp-uniform condition
          }
          wblock[TAPS] += g;
        }
      }
    }
    if constexpr (kWgrad) {
#pragma unroll
      for (int j = 0; j <= TAPS; ++j) wsum[j] += wblock[j];
    }
  }
  const acc_t dh0 = taps.conv(g);
  if (active) grad_h0[b * CN + lane] = static_cast<scalar_t>(dh0);
  if constexpr (kWgrad) {
    // Per channel co: the sum over its lanes, in a fixed shuffle order.
    const int CK = C * K, n_out = C * CK + (has_bias ? C : 0);
    acc_t* out = wgrad_partial + b * n_out;
    for (int co = 0; co < C; ++co) {  // warp-uniform
#pragma unroll
      for (int j = 0; j <= TAPS; ++j) {
        if (j < CK || j == TAPS) {
          acc_t v = active && c == co ? wsum[j] : acc_t(0);
#pragma unroll
          for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
          if (lane == 0) {
            if (j < CK) {
              out[co * CK + j] = v;
            } else if (has_bias) {
              out[C * CK + co] = v;
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Tiled persistent kernels (fixed K = KT, used for C·N >= kTileMinUnits): a thread owns tiles of
// V consecutive ring units of one channel, so each padded input value read from shared memory
// serves up to KT outputs and each weight V outputs (the per-unit kernels above are bound by
// shared-memory traffic at these sizes). Rows of a padded buffer are NPs = tile_row_stride(N)
// wide: ceil(N/V)·V + KT - 1, so a tile's window never leaves its row; rounded up to 4 values
// ("aligned") where shared memory allows, so that each window starts 16-byte aligned and is read
// with vector loads (scalar loads at a stride of V values from the lanes of a warp hit the same
// banks V ways; 2026-11-21 H200: 4.5% faster at (8, 1024, 6, 256, 3)). The columns past
// N + KT - 1 stay zero and only feed outputs n >= N, which are discarded.
// ---------------------------------------------------------------------------------------

template <int KT, int V>
__host__ __device__ constexpr int tile_row_stride(int N, bool aligned) {
  return aligned ? ((N + V - 1) / V * V + KT - 1 + 3) / 4 * 4 : (N + V - 1) / V * V + KT - 1;
}

// win[j] = pr[j] for j < W, with 16-byte loads (pr 16-byte aligned, in shared memory).
template <int W, class acc_t>
__device__ __forceinline__ void load_window(const acc_t* pr, acc_t (&win)[W]) {
  static_assert(std::is_same_v<acc_t, float> || std::is_same_v<acc_t, double>, "acc_t is float or double");
  constexpr int E = 16 / sizeof(acc_t);  // values per 16-byte load
  constexpr int VEC = W / E * E;
#pragma unroll
  for (int j = 0; j < VEC; j += E) {
    if constexpr (E == 4) {
      const float4 q = *reinterpret_cast<const float4*>(pr + j);
      win[j] = q.x;
      win[j + 1] = q.y;
      win[j + 2] = q.z;
      win[j + 3] = q.w;
    } else {
      const double2 q = *reinterpret_cast<const double2*>(pr + j);
      win[j] = q.x;
      win[j + 1] = q.y;
    }
  }
  if constexpr (E == 4 && W - VEC >= 2) {
    const float2 q = *reinterpret_cast<const float2*>(pr + VEC);
    win[VEC] = q.x;
    win[VEC + 1] = q.y;
    if constexpr (W - VEC == 3) win[VEC + 2] = pr[VEC + 2];
  } else {
#pragma unroll
    for (int j = VEC; j < W; ++j) win[j] = pr[j];
  }
}

// acc[v] = Σ_{ci,k} w_row[ci, k]·pad[ci, n0 + v + k] for v < V (same summation order as conv_unit).
template <int KT, int V, class acc_t>
__device__ __forceinline__ void conv_tile(const acc_t* w_row,  // [C, KT] the output channel's weights
                                          const acc_t* pad,    // [C, NPs] padded input rows
                                          int C, int NPs, int n0,
                                          bool aligned,  // rows 16-byte aligned (tile_row_stride): vector loads
                                          acc_t (&acc)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) acc[v] = acc_t(0);
  for (int ci = 0; ci < C; ++ci) {
    const acc_t* pr = pad + static_cast<int64_t>(ci) * NPs + n0;
    acc_t win[V + KT - 1];
    if (aligned) {
      load_window(pr, win);
    } else {
#pragma unroll
      for (int j = 0; j < V + KT - 1; ++j) win[j] = pr[j];
    }
#pragma unroll
    for (int k = 0; k < KT; ++k) {
      const acc_t wv = w_row[ci * KT + k];
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] += wv * win[v + k];
    }
  }
}

// write_padded for rows of stride NPs (NPl = N + K - 1 logical columns).
template <class acc_t>
__device__ __forceinline__ void write_padded_rows(acc_t* pad, int NPs, int c, int n, acc_t v, int N, int NPl,
                                                  int left, bool circular) {
  acc_t* row = pad + static_cast<int64_t>(c) * NPs;
  const int j = n + left;
  row[j] = v;
  if (circular) {
    if (j - N >= 0) row[j - N] = v;
    if (j + N < NPl) row[j + N] = v;
  }
}

// convrnn_forward_kernel with tiles. Dynamic shared memory: hpad [2][C, NPs], w [C, C, KT],
// bias [C] (acc_t), then xs [2][S, C, N] scalar_t.
template <class scalar_t, class acc_t, int KT, int V>
__global__ void __launch_bounds__(kMaxSeqThreads) convrnn_forward_tiled_kernel(
    const scalar_t* __restrict__ x,       // [B, T, C, N] inputs
    const scalar_t* __restrict__ weight,  // [C, C, KT] recurrent weight (out, in, k)
    const scalar_t* __restrict__ bias,    // [C] or nullptr
    const scalar_t* __restrict__ h0,      // [B, C, N] initial state
    scalar_t* __restrict__ y,             // [B, T, C, N] out: h_1 .. h_T
    scalar_t* __restrict__ h_T,           // [B, C, N] out: h_T
    int64_t T, int C, int N,
    int S,           // steps of x staged in shared memory per chunk; 0: read x from global memory
    bool aligned,    // rows of tile_row_stride(N, true) values, read with vector loads
    bool circular, bool relu) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int K = KT;
  const int NPl = N + K - 1, L = K / 2, CN = C * N;
  const int NT = (N + V - 1) / V, NPs = tile_row_stride<KT, V>(N, aligned), Q = C * NT;
  acc_t* hbuf0 = reinterpret_cast<acc_t*>(smem_raw);    // [C, NPs]
  acc_t* hbuf1 = hbuf0 + C * NPs;                         // [C, NPs]
  acc_t* w = hbuf1 + C * NPs;                             // [C, C, K]
  acc_t* bs = w + C * C * K;                              // [C]
  scalar_t* xs0 = reinterpret_cast<scalar_t*>(bs + C);    // [S, C, N] staged x, two buffers
  scalar_t* xs1 = xs0 + static_cast<int64_t>(S) * CN;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t b = blockIdx.x;

  for (int i = tid; i < 2 * C * NPs; i += nt) hbuf0[i] = acc_t(0);
  for (int i = tid; i < C * C * K; i += nt) w[i] = static_cast<acc_t>(weight[i]);
  for (int i = tid; i < C; i += nt) bs[i] = bias != nullptr ? static_cast<acc_t>(bias[i]) : acc_t(0);
  __syncthreads();
  const scalar_t* h0b = h0 + b * CN;
  for (int e = tid; e < CN; e += nt) {
    const int c = e / N;
    write_padded_rows(hbuf0, NPs, c, e - c * N, static_cast<acc_t>(h0b[e]), N, NPl, L, circular);
  }

  const scalar_t* xb = x + b * T * CN;
  scalar_t* yb = y + b * T * CN;
  scalar_t* hTb = h_T + b * CN;
  const bool staged = S > 0;
  const int64_t span = staged ? S : T;
  constexpr int U = copy_unit<scalar_t>();
  if (staged) copy_async<U>(xs0, xb, std::min<int64_t>(S, T) * CN * sizeof(scalar_t), tid, nt);
  int buf = 0;
  acc_t* cur = hbuf0;
  acc_t* nxt = hbuf1;
  for (int64_t t0 = 0; t0 < T; t0 += span) {
    const int64_t steps = std::min<int64_t>(span, T - t0);
    const scalar_t* xs = buf ? xs1 : xs0;
    if (staged) copy_wait();
    __syncthreads();
    if (staged && t0 + span < T) {
      copy_async<U>(buf ? xs0 : xs1, xb + (t0 + span) * CN,
                    std::min<int64_t>(span, T - t0 - span) * CN * sizeof(scalar_t), tid, nt);
    }
    buf ^= 1;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t t = t0 + s;
      for (int q = tid; q < Q; q += nt) {
        const int c = q / NT;
        const int n0 = (q - c * NT) * V;
        acc_t acc[V];
        conv_tile<KT, V>(w + c * C * K, cur, C, NPs, n0, aligned, acc);
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const int n = n0 + v;
          if (n < N) {
            const int e = c * N + n;
            const scalar_t xv = staged ? xs[s * CN + e] : xb[t * CN + e];
            const acc_t pre = static_cast<acc_t>(xv) + bs[c] + acc[v];
            const scalar_t out = static_cast<scalar_t>(activate(pre, relu));
            yb[t * CN + e] = out;
            if (t == T - 1) hTb[e] = out;
            write_padded_rows(nxt, NPs, c, n, static_cast<acc_t>(out), N, NPl, L, circular);
          }
        }
      }
      __syncthreads();
      acc_t* tmp = cur;
      cur = nxt;
      nxt = tmp;
    }
  }
}

// convrnn_backward_kernel with tiles. Dynamic shared memory: gpad [2][C, NPs], wt [C, C, KT]
// (acc_t), then gys [2][S, C, N] and ys [2][S, C, N] scalar_t.
template <class scalar_t, class acc_t, int KT, int V>
__global__ void __launch_bounds__(kMaxSeqThreads) convrnn_backward_tiled_kernel(
    const scalar_t* __restrict__ grad_y,    // [B, T, C, N] dL/dy
    const scalar_t* __restrict__ grad_h_T,  // [B, C, N] dL/dh_T
    const scalar_t* __restrict__ weight,    // [C, C, KT] recurrent weight (out, in, k)
    const scalar_t* __restrict__ y,         // [B, T, C, N] forward outputs h_1 .. h_T
    scalar_t* __restrict__ grad_x,          // [B, T, C, N] out
    scalar_t* __restrict__ grad_h0,         // [B, C, N] out
    int64_t T, int C, int N, int S,
    bool aligned,  // rows of tile_row_stride(N, true) values, read with vector loads
    bool circular, bool relu) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int K = KT;
  const int NPl = N + K - 1, L = K / 2, R = K - 1 - L, CN = C * N;
  const int NT = (N + V - 1) / V, NPs = tile_row_stride<KT, V>(N, aligned), Q = C * NT;
  acc_t* gbuf0 = reinterpret_cast<acc_t*>(smem_raw);   // [C, NPs]
  acc_t* gbuf1 = gbuf0 + C * NPs;                        // [C, NPs]
  acc_t* wt = gbuf1 + C * NPs;                           // [C, C, K] adjoint weight
  scalar_t* gys0 = reinterpret_cast<scalar_t*>(wt + C * C * K);  // [S, C, N] staged grad_y, two buffers
  scalar_t* gys1 = gys0 + static_cast<int64_t>(S) * CN;
  scalar_t* ys0 = gys1 + static_cast<int64_t>(S) * CN;            // [S, C, N] staged y, two buffers
  scalar_t* ys1 = ys0 + static_cast<int64_t>(S) * CN;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t b = blockIdx.x;
  (void)L;

  for (int i = tid; i < 2 * C * NPs; i += nt) gbuf0[i] = acc_t(0);
  for (int i = tid; i < C * C * K; i += nt) {
    const int k = i % K;
    const int co = (i / K) % C;
    const int ci = i / (C * K);
    wt[i] = static_cast<acc_t>(weight[(static_cast<int64_t>(co) * C + ci) * K + (K - 1 - k)]);
  }
  const scalar_t* gyb = grad_y + b * T * CN;
  const scalar_t* yb = y + b * T * CN;
  scalar_t* gxb = grad_x + b * T * CN;
  const bool staged = S > 0;
  const int64_t span = staged ? S : T;
  constexpr int U = copy_unit<scalar_t>();
  if (staged) {
    const int64_t lo = std::max<int64_t>(0, T - span);
    copy_async<U>(gys0, gyb + lo * CN, (T - lo) * CN * sizeof(scalar_t), tid, nt);
    copy_async<U>(ys0, yb + lo * CN, (T - lo) * CN * sizeof(scalar_t), tid, nt);
  }
  int buf = 0;
  acc_t* cur = gbuf0;
  acc_t* nxt = gbuf1;
  for (int64_t hi = T; hi > 0; hi -= span) {
    const int64_t lo = std::max<int64_t>(0, hi - span);
    const scalar_t* gys = buf ? gys1 : gys0;
    const scalar_t* ys = buf ? ys1 : ys0;
    if (staged) copy_wait();
    __syncthreads();
    if (staged && lo > 0) {
      const int64_t lo2 = std::max<int64_t>(0, lo - span);
      copy_async<U>(buf ? gys0 : gys1, gyb + lo2 * CN, (lo - lo2) * CN * sizeof(scalar_t), tid, nt);
      copy_async<U>(buf ? ys0 : ys1, yb + lo2 * CN, (lo - lo2) * CN * sizeof(scalar_t), tid, nt);
    }
    buf ^= 1;
    for (int64_t t = hi - 1; t >= lo; --t) {
      for (int q = tid; q < Q; q += nt) {
        const int c = q / NT;
        const int n0 = (q - c * NT) * V;
        acc_t carry[V];
        if (t == T - 1) {
#pragma unroll
          for (int v = 0; v < V; ++v) {
            carry[v] = n0 + v < N ? static_cast<acc_t>(grad_h_T[b * CN + c * N + n0 + v]) : acc_t(0);
          }
        } else {
          conv_tile<KT, V>(wt + c * C * K, cur, C, NPs, n0, aligned, carry);
        }
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const int n = n0 + v;
          if (n < N) {
            const int e = c * N + n;
            const int64_t off = staged ? (t - lo) * CN + e : t * CN + e;
            const scalar_t gy = staged ? gys[off] : gyb[off];
            const scalar_t yv = staged ? ys[off] : yb[off];
            const acc_t g = activate_grad(static_cast<acc_t>(gy) + carry[v], static_cast<acc_t>(yv), relu);
            gxb[t * CN + e] = static_cast<scalar_t>(g);
            write_padded_rows(nxt, NPs, c, n, g, N, NPl, R, circular);
          }
        }
      }
      __syncthreads();
      acc_t* tmp = cur;
      cur = nxt;
      nxt = tmp;
    }
  }
  for (int q = tid; q < Q; q += nt) {
    const int c = q / NT;
    const int n0 = (q - c * NT) * V;
    acc_t carry[V];
    conv_tile<KT, V>(wt + c * C * K, cur, C, NPs, n0, aligned, carry);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (n0 + v < N) grad_h0[b * CN + c * N + n0 + v] = static_cast<scalar_t>(carry[v]);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Thread-block-cluster forward (sm_90): one cluster of G blocks per sequence, for large states
// (C·N >= kClusterMinUnits), where one block per sequence leaves most SMs idle and each of its
// threads carries several units through a long dependency chain per step. Block r of the
// cluster owns the ring segment n in [r·Ns, (r+1)·Ns) (Ns = N / G) of every channel.
// Halos travel between blocks only every H steps (ghost zones): a block keeps its segment with
// halos H·L wide on the left and H·R on the right (row width NPs = Ns + H·(K - 1), column j holds
// ring unit r·Ns + j - H·L), and after an exchange computes H steps on its own, each step on a
// region one tap narrower on either side (step q = 0 .. H-1 of a block: columns
// [L·(q+1), NPs - R·(q+1))), so that the H-th step yields exactly the segment; the units of the
// neighbours' segments it recomputes on the way are the price of not synchronising with them.
// One thread per unit of the widest region (C·(Ns + (H-1)·(K-1)) threads), the state double-
// buffered in shared memory with one __syncthreads per step. At an exchange, each thread whose
// unit lies in a neighbour's halo sends its h with st.async into that neighbour's inbox, which
// counts the bytes on the inbox's mbarrier (distributed shared memory); the neighbour waits on
// its mbarrier and copies the inbox into its halo columns. Two inboxes, alternating: a block
// sends exchange k only after it received its neighbour's exchange k-1, which the neighbour
// sent after copying out exchange k-2 from the same inbox. No cluster-wide barrier per step:
// barrier.cluster's release compiles to a GPU-scope memory fence that also waits for the
// step's outstanding x loads and y stores. µs per step at (8, 1024, 6, 256, 3), float32, H200,
// 2026-11-21: 0.82 with a cluster barrier per step, 0.60 with an st.async exchange every step,
// 0.46 with this kernel (ncu had shown the step bound by instruction issue, ~190 instructions
// per warp and step, mostly address and branch arithmetic: hence the channel-fastest layout and
// the 16-byte window loads below). Zero padding keeps the columns off the ring at 0 (never
// computed). x is loaded kClusterPrefetch steps ahead into registers. Same summation order as
// conv_unit, so the same values as the block kernels. Used only where G blocks can be
// co-resident (cudaOccupancyMaxActiveClusters), else the one-block kernels run.
// ---------------------------------------------------------------------------------------

constexpr int kClusterMaxBlocks = 8;     // the portable cluster size limit
constexpr int kClusterMaxThreads = 512;  // one thread per column of the widest region (128 registers)
constexpr int kClusterPrefetch = 8;      // steps of x loaded ahead
constexpr int kClusterMaxExchangeSteps = 4;  // H at most
constexpr int64_t kClusterMinUnits = 1024;
constexpr int kClusterUnrolledK = 3;     // the instantiations with the taps unrolled: K = 3, C <= 8
constexpr int kClusterUnrolledMaxC = 8;

using cuda::cluster_address;  // cluster.cuh
using cuda::mbarrier_arrive_expect;
using cuda::mbarrier_init;
using cuda::mbarrier_wait;
using cuda::shared_address;
using cuda::store_async;

// The state is stored channel-fastest, hseg[col][ci] with rows of CS channels: a unit's taps
// (columns j - L .. j + R of every input channel) are one contiguous window. KT > 0: K = KT and
// CS = PC (C rounded up to 4 or 8, the padding channels zero): the window is read with 16-byte
// loads, the thread's weights held in registers, the taps unrolled. KT = 0: any C and K, CS = C,
// scalar loads. Either way conv_unit's summation order (ci outer, k inner).
// Dynamic shared memory: bars [2] (uint64), hseg [2][NPs, CS], inbox [2][C, H·(K-1)], w [C, C, K],
// bias [C] (acc_t).
template <class scalar_t, class acc_t, int KT, int PC>
__global__ void __launch_bounds__(kClusterMaxThreads, 1) convrnn_forward_cluster_kernel(
    const scalar_t* __restrict__ x,       // [B, T, C, N] inputs
    const scalar_t* __restrict__ weight,  // [C, C, K] recurrent weight (out, in, k)
    const scalar_t* __restrict__ bias,    // [C] or nullptr
    const scalar_t* __restrict__ h0,      // [B, C, N] initial state
    scalar_t* __restrict__ y,             // [B, T, C, N] out: h_1 .. h_T
    scalar_t* __restrict__ h_T,           // [B, C, N] out: h_T
    int64_t T, int C, int N, int K,
    int H,  // steps between halo exchanges
    bool circular, bool relu) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int G = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int L = K / 2, R = K - 1 - L, WL = H * L, WR = H * R, W = WL + WR;
  const int Ns = N / G, NPs = Ns + W, U = Ns + (H - 1) * (K - 1), CN = C * N;
  const int CS = KT > 0 ? PC : C;                            // channels per column in hseg
  const int buf = NPs * CS;                                  // one state buffer
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem_raw);    // [2] one per inbox
  acc_t* hseg = reinterpret_cast<acc_t*>(smem_raw + 16);     // [2][NPs, CS] (16-byte aligned)
  acc_t* inbox = hseg + 2 * buf;                             // [2][C, W]: left halo, then right
  acc_t* w = inbox + 2 * C * W;                              // [C, C, K]
  acc_t* bs = w + C * C * K;                                 // [C]
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t b = blockIdx.x / G;
  // Halo traffic, with zero padding not across the ring's ends: this block receives C·WL values
  // from its left neighbour and C·WR from its right one per exchange.
  const bool from_left = circular || rank > 0, from_right = circular || rank < G - 1;
  const bool exchanges = W > 0 && T > H;
  const uint32_t halo_bytes = static_cast<uint32_t>(((from_left ? WL : 0) + (from_right ? WR : 0)) * C * sizeof(acc_t));

  if (tid == 0) {
    mbarrier_init(&bars[0], 1);
    mbarrier_init(&bars[1], 1);
    if (exchanges) mbarrier_arrive_expect(&bars[1], halo_bytes);  // exchange 1 lands in inbox 1
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  for (int i = tid; i < 2 * buf; i += nt) hseg[i] = acc_t(0);  // padding channels and zero padding stay 0
  for (int i = tid; i < C * C * K; i += nt) w[i] = static_cast<acc_t>(weight[i]);
  for (int i = tid; i < C; i += nt) bs[i] = bias != nullptr ? static_cast<acc_t>(bias[i]) : acc_t(0);
  __syncthreads();
  // h0 of the segment and of its halo columns (buffer 0): column col holds ring unit r·Ns + col - WL.
  const scalar_t* h0b = h0 + b * CN;
  for (int i = tid; i < NPs * C; i += nt) {
    const int col = i / C, ci = i - col * C;
    int m = rank * Ns + col - WL;
    bool on_ring = true;
    if (circular) {
      m = (m + N) % N;  // |m| < N: H·L, H·R <= Ns
    } else {
      on_ring = m >= 0 && m < N;
    }
    if (on_ring) hseg[col * CS + ci] = static_cast<acc_t>(h0b[ci * N + m]);
  }

  // This thread's unit: channel c (fastest: a warp's lanes share windows) at column j = L + u of
  // the widest region, ring unit m.
  const bool active = tid < C * U;
  const int u = active ? tid / C : 0;
  const int c = active ? tid - u * C : 0;
  const int j = L + u;
  int m = rank * Ns + j - WL;
  bool on_ring = active;
  if (circular) {
    m = (m + N) % N;
  } else {
    on_ring = on_ring && m >= 0 && m < N;
  }
  const bool in_segment = j >= WL && j < WL + Ns;
  const int64_t e = static_cast<int64_t>(c) * N + (on_ring ? m : 0);
  // At an exchange a segment unit feeds the left block's right halo (its first WR units) and the
  // right block's left halo (its last WL units).
  const bool to_left = on_ring && in_segment && j < WL + WR && from_left;
  const bool to_right = on_ring && in_segment && j >= Ns && from_right;  // j >= WL + Ns - WL
  const uint32_t inbox_bytes = static_cast<uint32_t>(C * W * sizeof(acc_t));
  const uint32_t inbox_local = shared_address(inbox), bars_local = shared_address(bars);
  const int left = (rank + G - 1) % G, right = (rank + 1) % G;
  const uint32_t left_slot = cluster_address(inbox_local, left) + (c * W + WL + (j - WL)) * sizeof(acc_t);
  const uint32_t right_slot = cluster_address(inbox_local, right) + (c * W + (j - Ns)) * sizeof(acc_t);
  const uint32_t left_bars = cluster_address(bars_local, left), right_bars = cluster_address(bars_local, right);
  const acc_t bias_c = bs[c];
  constexpr int TAPS = KT > 0 ? KT * PC : 1;
  acc_t w_reg[TAPS];  // w[c, ci, k] at ci·KT + k, 0 for padding channels (KT > 0)
#pragma unroll
  for (int i = 0; i < TAPS; ++i) {
    const int ci = KT > 0 ? i / KT : 0, k = KT > 0 ? i - ci * KT : 0;
    w_reg[i] = KT > 0 && ci < C ? w[(c * C + ci) * K + k] : acc_t(0);
  }
  const acc_t* window = hseg + (j - L) * CS;  // + the buffer's offset
  acc_t* own = hseg + j * CS + c;
  const scalar_t* xnext = x + b * T * CN + e;  // x of the next step to load
  scalar_t* yt = y + b * T * CN + e;           // y of the current step
  cluster.sync();  // every block's barriers and buffers initialised before any write into them

  constexpr int P = kClusterPrefetch;
  scalar_t xq[P];  // xq[p]: x of the next step t ≡ p (mod P)
#pragma unroll
  for (int p = 0; p < P; ++p) {
    xq[p] = on_ring && p < T ? *xnext : scalar_t(0);
    xnext += CN;
  }
  int q = 0;  // step within the current exchange period
  for (int64_t t0 = 0; t0 < T; t0 += P) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t t = t0 + p;  // step t computes h_{t+1} from h_t (buffer t mod 2)
      if (t < T) {               // block-uniform
        const int cur = static_cast<int>(t & 1) * buf, nxt = buf - cur;
        if (q == 0 && t > 0 && exchanges) {
          // h_t arrived with exchange k = t / H in inbox k mod 2: copy it into the halo columns.
          const int64_t k = t / H;
          const int box = static_cast<int>(k & 1);
          mbarrier_wait(&bars[box], static_cast<uint32_t>(((k - 1) / 2) & 1));
          if (tid == 0 && (k + 1) * H < T) mbarrier_arrive_expect(&bars[box ^ 1], halo_bytes);  // exchange k + 1
          const acc_t* in = inbox + box * C * W;
          for (int i = tid; i < C * W; i += nt) {
            const int ci = i / W, col = i - ci * W;  // col < WL: left halo, else right halo
            if (col < WL ? from_left : from_right) hseg[cur + (col < WL ? col : Ns + col) * CS + ci] = in[i];
          }
          __syncthreads();
        }
        const bool live = on_ring && j >= L * (q + 1) && j < NPs - R * (q + 1);  // this step's region
        const bool load = on_ring && t + P < T;
        const scalar_t xv = xq[p];
        if (load) xq[p] = *xnext;
        xnext += CN;
        if (live) {
          acc_t conv = acc_t(0);
          if constexpr (KT > 0) {
            acc_t win[KT * PC];  // win[k·PC + ci] = h_t[ci, column j - L + k]
            load_window(window + cur, win);
#pragma unroll
            for (int ci = 0; ci < PC; ++ci) {
#pragma unroll
              for (int k = 0; k < KT; ++k) conv += w_reg[ci * KT + k] * win[k * PC + ci];
            }
          } else {
            const acc_t* w_row = w + c * C * K;
            for (int ci = 0; ci < C; ++ci) {
              for (int k = 0; k < K; ++k) conv += w_row[ci * K + k] * window[cur + k * C + ci];
            }
          }
          const scalar_t out = static_cast<scalar_t>(activate(static_cast<acc_t>(xv) + bias_c + conv, relu));
          const acc_t h = static_cast<acc_t>(out);  // the rounded value is the state
          own[nxt] = h;
          if (in_segment) {
            *yt = out;
            if (t == T - 1) h_T[b * CN + e] = out;
          }
          if (q == H - 1 && t + 1 < T && exchanges) {  // h_{t+1} goes to the neighbours
            const uint32_t box = static_cast<uint32_t>(((t + 1) / H) & 1);
            if (to_left) store_async(left_slot + box * inbox_bytes, h, left_bars + box * sizeof(uint64_t));
            if (to_right) store_async(right_slot + box * inbox_bytes, h, right_bars + box * sizeof(uint64_t));
          }
        }
        yt += CN;
        __syncthreads();  // h_{t+1} complete in nxt, every read of cur done
        q = q == H - 1 ? 0 : q + 1;
      }
    }
  }
  cluster.sync();  // every exchange was waited for inside the loop; no block exits before the others
}

// Partial sums of the weight and bias gradients over one block's rows r = b·T + t in
// [blockIdx.x·rows_per_block, ...). Output o < C·C·K is grad_w[co, ci, k] (o = (co·C + ci)·K + k),
// o in [C·C·K, C·C·K + C) is grad_bias[o - C·C·K]. Thread tid works on output
// blockIdx.y·(blockDim/S) + tid/S and the ring units n ≡ tid (mod S); the S threads of an output
// are adjacent lanes of one warp and are summed by shuffles in a fixed order. Dynamic shared memory:
// gs [RB, C, N] and hs [RB, C, NP] acc_t (RB rows staged at a time).
template <class scalar_t, class acc_t>
__global__ void __launch_bounds__(kWgradThreads) convrnn_wgrad_partial_kernel(
    const scalar_t* __restrict__ g,   // [B, T, C, N] grad_x (pre-activation gradients)
    const scalar_t* __restrict__ y,   // [B, T, C, N] forward outputs
    const scalar_t* __restrict__ h0,  // [B, C, N] initial state
    acc_t* __restrict__ partial,      // [gridDim.x, n_out] out: this block's sums
    int64_t T, int64_t rows,          // rows = B·T
    int64_t rows_per_block, int C, int N, int K,
    int RB,     // rows staged in shared memory at a time
    int S,      // threads per output (a power of two, <= 32)
    int n_out,  // C·C·K (+ C with bias)
    bool circular) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int NP = N + K - 1, L = K / 2, CN = C * N, CCK = C * C * K;
  acc_t* gs = reinterpret_cast<acc_t*>(smem_raw);  // [RB, C, N]
  acc_t* hs = gs + static_cast<int64_t>(RB) * CN;  // [RB, C, NP]
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t r0 = blockIdx.x * rows_per_block;
  const int64_t r1 = std::min(rows, r0 + rows_per_block);

  const int o = blockIdx.y * (nt / S) + tid / S;
  const int part = tid % S;
  const bool valid = o < n_out;
  const bool is_bias = o >= CCK;
  int co = 0, ci = 0, k = 0;
  if (valid) {
    if (is_bias) {
      co = o - CCK;
    } else {
      k = o % K;
      ci = (o / K) % C;
      co = o / (C * K);
    }
  }
  for (int64_t i = tid; i < static_cast<int64_t>(RB) * C * NP; i += nt) hs[i] = acc_t(0);  // the zero halo
  acc_t acc = acc_t(0);
  for (int64_t rs = r0; rs < r1; rs += RB) {
    const int nr = static_cast<int>(std::min<int64_t>(RB, r1 - rs));
    __syncthreads();  // the previous rows are consumed (and the halo zeroed)
    for (int64_t i = tid; i < static_cast<int64_t>(nr) * CN; i += nt) {
      const int rr = static_cast<int>(i / CN);
      const int e = static_cast<int>(i - static_cast<int64_t>(rr) * CN);
      const int64_t r = rs + rr;
      gs[i] = static_cast<acc_t>(g[r * CN + e]);
      const int64_t t = r % T;
      const scalar_t hv = t > 0 ? y[(r - 1) * CN + e] : h0[(r / T) * CN + e];
      const int c = e / N;
      write_padded(hs + static_cast<int64_t>(rr) * C * NP, c, e - c * N, static_cast<acc_t>(hv), N, NP, L, circular);
    }
    __syncthreads();
    if (valid) {
      for (int rr = 0; rr < nr; ++rr) {
        const acc_t* gr = gs + static_cast<int64_t>(rr) * CN + co * N;
        if (is_bias) {
          for (int n = part; n < N; n += S) acc += gr[n];
        } else {
          const acc_t* hr = hs + (static_cast<int64_t>(rr) * C + ci) * NP + k;
          for (int n = part; n < N; n += S) acc += gr[n] * hr[n];
        }
      }
    }
  }
  for (int off = S / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (valid && part == 0) partial[static_cast<int64_t>(blockIdx.x) * n_out + o] = acc;
}

// Sums the partials of the row blocks in block order: grad_w and grad_bias.
template <class scalar_t, class acc_t>
__global__ void __launch_bounds__(kReduceThreads) convrnn_wgrad_reduce_kernel(
    const acc_t* __restrict__ partial,  // [n_blocks, n_out]
    int64_t n_blocks, int n_out, int CCK,
    scalar_t* __restrict__ grad_w,      // [C, C, K] out
    scalar_t* __restrict__ grad_bias) { // [C] out, or nullptr (n_out == CCK)
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= n_out) return;
  acc_t s = acc_t(0);
  for (int64_t blk = 0; blk < n_blocks; ++blk) s += partial[blk * n_out + o];
  if (o < CCK) {
    grad_w[o] = static_cast<scalar_t>(s);
  } else {
    grad_bias[o - CCK] = static_cast<scalar_t>(s);
  }
}

// ---------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------

void check_on_cuda(const Tensor& t, const char* op) {
  TORCH_CHECK(t.defined() && t.is_cuda(), op, ": tensors must be on a CUDA device (the CUDA kernel was dispatched to)");
}

int round_up(int v, int m) { return (v + m - 1) / m * m; }

int max_smem_per_block() {
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  return static_cast<int>(prop->sharedMemPerBlockOptin);
}

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
}

// Launch shape of a persistent per-sequence kernel: threads, staged steps S and shared memory.
struct SeqPlan {
  int threads = 0;
  int S = 0;
  size_t smem = 0;
};

// units: work items of a step (ring units, or tiles); fixed_bytes: state + weight in shared
// memory; per_step_bytes: the staged inputs of one step (one buffer); stage: whether the inputs
// can be copied asynchronously (U-aligned chunks), else S = 0 (direct global reads).
SeqPlan plan_sequence(const ConvRnnSizes& s, int64_t units, size_t fixed_bytes, size_t per_step_bytes, bool stage,
                      const char* op) {
  const int64_t limit = max_smem_per_block();
  TORCH_CHECK(static_cast<int64_t>(fixed_bytes) <= limit, op, ": C = ", num(s.C), ", N = ", num(s.N), ", K = ", num(s.K),
              " is not supported on CUDA yet: the state and weight need ", num(static_cast<int64_t>(fixed_bytes)),
              " bytes of shared memory, one block has ", num(limit),
              " (the persistent kernel keeps them in one block; reduce C·(N + K - 1) or C·C·K)");
  SeqPlan p;
  const int64_t per_thread = (units + kMaxSeqThreads - 1) / kMaxSeqThreads;
  p.threads = round_up(static_cast<int>((units + per_thread - 1) / per_thread), 32);
  int64_t S = 0;
  if (stage) {
    const int64_t step2 = 2 * static_cast<int64_t>(per_step_bytes);  // double-buffered
    S = std::min<int64_t>({s.T, static_cast<int64_t>(kMaxStageSteps), kStageBytes / step2,
                           (limit - static_cast<int64_t>(fixed_bytes)) / step2});
  }
  p.S = static_cast<int>(std::max<int64_t>(S, 0));
  p.smem = fixed_bytes + 2 * static_cast<size_t>(p.S) * per_step_bytes;
  return p;
}

// Whether the per-step slices of t (contiguous [.., C, N]) can be copied in units of U bytes.
template <class scalar_t>
bool stageable(const Tensor& t, int64_t CN) {
  constexpr int U = copy_unit<scalar_t>();
  return (CN * static_cast<int64_t>(sizeof(scalar_t))) % U == 0 &&
         reinterpret_cast<std::uintptr_t>(t.data_ptr<scalar_t>()) % U == 0;
}

// Shared memory of a tiled kernel besides its staged inputs: the two padded state rows sets,
// the weight and (forward) the bias, in acc_t.
template <class acc_t>
size_t tiled_fixed_bytes(const ConvRnnSizes& s, bool aligned, bool with_bias) {
  const int64_t NPs = tile_row_stride<kTileK, kTileV>(static_cast<int>(s.N), aligned);
  return static_cast<size_t>(2 * s.C * NPs + s.C * s.C * s.K + (with_bias ? s.C : 0)) * sizeof(acc_t);
}

// The warp kernels take states of at most 32 units with at most 32 taps (C·K; only zero
// padding allows K > N).
bool fits_one_warp(const ConvRnnSizes& s) { return s.C * s.N <= kWarpMaxUnits && s.C * s.K <= kWarpMaxUnits; }

// The shorter warp-kernel instantiation suffices.
bool few_taps(const ConvRnnSizes& s) { return s.C * s.K <= kWarpFewTaps; }

unsigned int warp_kernel_blocks(const ConvRnnSizes& s) {
  return static_cast<unsigned int>((s.B + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// Blocks per sequence of the cluster forward kernel: the largest G in {8, 4} that splits the
// ring into equal segments of at least K units (so each halo comes from one neighbour) with a
// thread for each unit of a segment; 0 where no G fits, the state is small (one block is quicker), or
// SEQKERNELS_CONVRNN_CLUSTER=0 turns the cluster kernel off (for comparisons and tests).
int cluster_blocks(const ConvRnnSizes& s) {
  if (s.C * s.N < kClusterMinUnits) return 0;
  const char* env = std::getenv("SEQKERNELS_CONVRNN_CLUSTER");
  if (env != nullptr && env[0] == '0' && env[1] == '\0') return 0;
  for (int G = kClusterMaxBlocks; G >= 4; G /= 2) {  // G = 2 would need C·N <= 1024
    if (s.N % G == 0 && s.N / G >= s.K && s.C * (s.N / G) <= kClusterMaxThreads) return G;
  }
  return 0;
}

// Launches the cluster forward kernel where cluster_blocks() allows it and the device can hold a
// cluster of its blocks; returns false (nothing launched) otherwise.
template <class scalar_t>
bool launch_forward_cluster(const ConvRnnSizes& s, const Tensor& x, const Tensor& weight,
                            const std::optional<Tensor>& bias, const Tensor& h0, Tensor& y, Tensor& h_T,
                            cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const int G = cluster_blocks(s);
  if (G == 0 || s.B > 0x7fffffff / G) return false;  // grid B·G blocks
  const int C = static_cast<int>(s.C), N = static_cast<int>(s.N), K = static_cast<int>(s.K);
  const int Ns = N / G, L = K / 2, R = K - 1 - L, reach = std::max(L, R);
  // Steps between halo exchanges: halos of at most one neighbour's segment, the widest region
  // (Ns + (H-1)·(K-1) columns per channel) within a block's threads.
  int H = reach == 0 ? 1 : std::min(kClusterMaxExchangeSteps, Ns / reach);
  while (H > 1 && C * (Ns + (H - 1) * (K - 1)) > kClusterMaxThreads) --H;
  const int W = H * (K - 1), NPs = Ns + W;
  // K = 3 with C <= 8: the vectorised instantiation, channels padded to 4 or 8.
  const bool unrolled = K == kClusterUnrolledK && C <= kClusterUnrolledMaxC;
  const int CS = !unrolled ? C : C <= 4 ? 4 : 8;
  const size_t smem = 16 + static_cast<size_t>(2 * NPs * CS + 2 * C * W + C * C * K + C) * sizeof(acc_t);
  if (smem > static_cast<size_t>(max_smem_per_block())) return false;
  auto kernel = !unrolled ? convrnn_forward_cluster_kernel<scalar_t, acc_t, 0, 0>
                : C <= 4  ? convrnn_forward_cluster_kernel<scalar_t, acc_t, kClusterUnrolledK, 4>
                          : convrnn_forward_cluster_kernel<scalar_t, acc_t, kClusterUnrolledK, 8>;
  allow_smem(kernel, smem);
  cudaLaunchAttribute cluster_dim;
  cluster_dim.id = cudaLaunchAttributeClusterDimension;
  cluster_dim.val.clusterDim.x = static_cast<unsigned int>(G);
  cluster_dim.val.clusterDim.y = 1;
  cluster_dim.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned int>(s.B * G));
  config.blockDim = dim3(static_cast<unsigned int>(round_up(C * (Ns + (H - 1) * (K - 1)), 32)));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &cluster_dim;
  config.numAttrs = 1;
  int clusters = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
  if (clusters < 1) return false;
  const scalar_t* bias_ptr = s.has_bias ? bias->data_ptr<scalar_t>() : nullptr;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), bias_ptr,
                                    h0.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), h_T.data_ptr<scalar_t>(), s.T, C,
                                    N, K, H, s.circular, s.relu));
  return true;
}

template <class scalar_t>
std::tuple<Tensor, Tensor> convrnn_forward_impl(const ConvRnnSizes& s, const Tensor& x, const Tensor& weight,
                                                const std::optional<Tensor>& bias, const Tensor& h0) {
  using acc_t = at::opmath_type<scalar_t>;
  const int C = static_cast<int>(s.C), N = static_cast<int>(s.N), K = static_cast<int>(s.K);
  Tensor y = at::empty({s.B, s.T, s.C, s.N}, x.options());
  Tensor h_T = at::empty({s.B, s.C, s.N}, x.options());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (fits_one_warp(s)) {
    const auto kernel = few_taps(s) ? convrnn_forward_warp_kernel<scalar_t, acc_t, kWarpFewTaps>
                                    : convrnn_forward_warp_kernel<scalar_t, acc_t, kWarpMaxUnits>;
    kernel<<<warp_kernel_blocks(s), 32 * kWarpsPerBlock, 0, stream>>>(
        x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), s.has_bias ? bias->data_ptr<scalar_t>() : nullptr,
        h0.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), h_T.data_ptr<scalar_t>(), s.B, s.T, C, N, K, s.circular,
        s.relu);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {y, h_T};
  }
  if (launch_forward_cluster<scalar_t>(s, x, weight, bias, h0, y, h_T, stream)) return {y, h_T};
  if (s.K == kTileK && s.C * s.N >= kTileMinUnits) {
    const int64_t NT = (s.N + kTileV - 1) / kTileV;
    const bool aligned = tiled_fixed_bytes<acc_t>(s, true, true) <= static_cast<size_t>(max_smem_per_block());
    const SeqPlan p = plan_sequence(s, s.C * NT, tiled_fixed_bytes<acc_t>(s, aligned, true),
                                    static_cast<size_t>(s.C * s.N) * sizeof(scalar_t),
                                    stageable<scalar_t>(x, s.C * s.N), "seqkernels.convrnn_forward");
    auto kernel = convrnn_forward_tiled_kernel<scalar_t, acc_t, kTileK, kTileV>;
    allow_smem(kernel, p.smem);
    kernel<<<static_cast<unsigned int>(s.B), p.threads, p.smem, stream>>>(
        x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), s.has_bias ? bias->data_ptr<scalar_t>() : nullptr,
        h0.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), h_T.data_ptr<scalar_t>(), s.T, C, N, p.S, aligned,
        s.circular, s.relu);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {y, h_T};
  }
  const size_t fixed = (2 * s.C * (s.N + s.K - 1) + s.C * s.C * s.K + s.C) * sizeof(acc_t);
  const SeqPlan p = plan_sequence(s, s.C * s.N, fixed, static_cast<size_t>(s.C * s.N) * sizeof(scalar_t),
                                  stageable<scalar_t>(x, s.C * s.N), "seqkernels.convrnn_forward");
  auto kernel = convrnn_forward_kernel<scalar_t, acc_t>;
  allow_smem(kernel, p.smem);
  kernel<<<static_cast<unsigned int>(s.B), p.threads, p.smem, stream>>>(
      x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), s.has_bias ? bias->data_ptr<scalar_t>() : nullptr,
      h0.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), h_T.data_ptr<scalar_t>(), s.T, C, N, K, p.S, s.circular,
      s.relu);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {y, h_T};
}

// grad_w and grad_bias from per-row-block partial sums [n_blocks, n_out], added in block order.
template <class scalar_t, class acc_t>
void launch_wgrad_reduce(const ConvRnnSizes& s, const Tensor& partial, Tensor& grad_w, Tensor& grad_bias,
                         cudaStream_t stream) {
  const int n_out = static_cast<int>(partial.size(1));
  convrnn_wgrad_reduce_kernel<scalar_t, acc_t><<<(n_out + kReduceThreads - 1) / kReduceThreads, kReduceThreads, 0, stream>>>(
      partial.data_ptr<acc_t>(), partial.size(0), n_out, static_cast<int>(s.C * s.C * s.K), grad_w.data_ptr<scalar_t>(),
      s.has_bias ? grad_bias.data_ptr<scalar_t>() : nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// grad_y and grad_h_T may have any strides (the warp kernel reads them in place; the block
// kernels get contiguous copies).
template <class scalar_t>
std::tuple<Tensor, Tensor, Tensor, Tensor> convrnn_backward_impl(const ConvRnnSizes& s, const Tensor& grad_y_any,
                                                                 const Tensor& grad_h_T_any, const Tensor& weight,
                                                                 const Tensor& h0, const Tensor& y) {
  using acc_t = at::opmath_type<scalar_t>;
  const int C = static_cast<int>(s.C), N = static_cast<int>(s.N), K = static_cast<int>(s.K);
  const int64_t CN = s.C * s.N, NP = s.N + s.K - 1;
  const int CCK = C * C * K;
  const int n_out = CCK + (s.has_bias ? C : 0);
  const auto opts = y.options();
  const auto acc_opts = opts.dtype(at::toOpMathType(y.scalar_type()));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  Tensor grad_x = at::empty({s.B, s.T, s.C, s.N}, opts);
  Tensor grad_h0 = at::empty({s.B, s.C, s.N}, opts);
  Tensor grad_w = at::empty({s.C, s.C, s.K}, opts);
  Tensor grad_bias = at::empty({s.has_bias ? s.C : 0}, opts);

  // 1. Reverse-time sequence: grad_x (= g) and grad_h0 (and, fused, the weight gradient's sums).
  if (fits_one_warp(s)) {
    const GradStrides gs{grad_y_any.stride(0), grad_y_any.stride(1), grad_y_any.stride(2), grad_y_any.stride(3),
                         grad_h_T_any.stride(0), grad_h_T_any.stride(1), grad_h_T_any.stride(2)};
    const bool fused_wgrad = few_taps(s);
    Tensor partial = fused_wgrad ? at::empty({s.B, n_out}, acc_opts) : Tensor();
    const auto kernel = fused_wgrad ? convrnn_backward_warp_kernel<scalar_t, acc_t, kWarpFewTaps>
                                    : convrnn_backward_warp_kernel<scalar_t, acc_t, kWarpMaxUnits>;
    kernel<<<warp_kernel_blocks(s), 32 * kWarpsPerBlock, 0, stream>>>(
        grad_y_any.data_ptr<scalar_t>(), grad_h_T_any.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
        h0.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), grad_x.data_ptr<scalar_t>(), grad_h0.data_ptr<scalar_t>(),
        fused_wgrad ? partial.data_ptr<acc_t>() : nullptr, gs, s.B, s.T, C, N, K, s.circular, s.relu, s.has_bias);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (fused_wgrad) {
      launch_wgrad_reduce<scalar_t, acc_t>(s, partial, grad_w, grad_bias, stream);
      return {grad_x, grad_w, grad_bias, grad_h0};
    }
  } else {
    const Tensor grad_y = grad_y_any.contiguous();
    const Tensor grad_h_T = grad_h_T_any.contiguous();
    const bool stage_bwd = stageable<scalar_t>(grad_y, CN) && stageable<scalar_t>(y, CN);
    if (s.K == kTileK && CN >= kTileMinUnits) {
      const int64_t NT = (s.N + kTileV - 1) / kTileV;
      const bool aligned = tiled_fixed_bytes<acc_t>(s, true, false) <= static_cast<size_t>(max_smem_per_block());
      const SeqPlan p = plan_sequence(s, s.C * NT, tiled_fixed_bytes<acc_t>(s, aligned, false),
                                      2 * static_cast<size_t>(CN) * sizeof(scalar_t),
                                      stage_bwd, "seqkernels.convrnn_backward");
      auto kernel = convrnn_backward_tiled_kernel<scalar_t, acc_t, kTileK, kTileV>;
      allow_smem(kernel, p.smem);
      kernel<<<static_cast<unsigned int>(s.B), p.threads, p.smem, stream>>>(
          grad_y.data_ptr<scalar_t>(), grad_h_T.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
          y.data_ptr<scalar_t>(), grad_x.data_ptr<scalar_t>(), grad_h0.data_ptr<scalar_t>(), s.T, C, N, p.S, aligned,
          s.circular, s.relu);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      const size_t fixed = (2 * s.C * NP + s.C * s.C * s.K) * sizeof(acc_t);
      const SeqPlan p = plan_sequence(s, s.C * s.N, fixed, 2 * static_cast<size_t>(CN) * sizeof(scalar_t),
                                      stage_bwd, "seqkernels.convrnn_backward");
      auto kernel = convrnn_backward_kernel<scalar_t, acc_t>;
      allow_smem(kernel, p.smem);
      kernel<<<static_cast<unsigned int>(s.B), p.threads, p.smem, stream>>>(
          grad_y.data_ptr<scalar_t>(), grad_h_T.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
          y.data_ptr<scalar_t>(), grad_x.data_ptr<scalar_t>(), grad_h0.data_ptr<scalar_t>(), s.T, C, N, K, p.S,
          s.circular, s.relu);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }

  // 2. Weight and bias gradients: fixed row partition, partial sums, fixed-order total.
  {
    const int64_t rows = s.B * s.T;
    const int64_t rows_per_block = (rows + kWgradBlocks - 1) / kWgradBlocks;
    const int64_t n_blocks = (rows + rows_per_block - 1) / rows_per_block;
    const int64_t row_bytes = (CN + s.C * NP) * static_cast<int64_t>(sizeof(acc_t));
    const int64_t limit = max_smem_per_block();
    TORCH_CHECK(row_bytes <= limit, "seqkernels.convrnn_backward: C = ", num(s.C), ", N = ", num(s.N),
                " is not supported on CUDA yet: one row of the weight-gradient reduction needs ", num(static_cast<int64_t>(row_bytes)),
                " bytes of shared memory, one block has ", num(limit));
    const int64_t RB = std::max<int64_t>(1, std::min<int64_t>(rows_per_block, (48 * 1024) / row_bytes));
    int S = 1;
    while (S < 32 && 2 * S * n_out <= kWgradThreads && 2 * S <= N) S *= 2;
    const int outs_per_block = kWgradThreads / S;
    const int64_t grid_y = (n_out + outs_per_block - 1) / outs_per_block;
    TORCH_CHECK(grid_y <= 65535, "seqkernels.convrnn_backward: C·C·K = ", num(CCK), " is too large for the CUDA kernel");
    Tensor partial = at::empty({n_blocks, n_out}, acc_opts);
    const size_t smem = static_cast<size_t>(RB * row_bytes);
    auto kernel = convrnn_wgrad_partial_kernel<scalar_t, acc_t>;
    allow_smem(kernel, smem);
    kernel<<<dim3(static_cast<unsigned int>(n_blocks), static_cast<unsigned int>(grid_y)), kWgradThreads, smem,
             stream>>>(grad_x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), h0.data_ptr<scalar_t>(),
                       partial.data_ptr<acc_t>(), s.T, rows, rows_per_block, C, N, K, static_cast<int>(RB), S, n_out,
                       s.circular);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    launch_wgrad_reduce<scalar_t, acc_t>(s, partial, grad_w, grad_bias, stream);
  }
  return {grad_x, grad_w, grad_bias, grad_h0};
}

std::tuple<Tensor, Tensor> convrnn_forward_cuda(const Tensor& x, const Tensor& weight,
                                                const std::optional<Tensor>& bias, const Tensor& h0,
                                                int64_t padding_mode, int64_t nonlinearity) {
  // Shapes, dtypes, contiguity, flags, and every tensor on x's device.
  const ConvRnnSizes s = check_convrnn_forward(x, weight, bias, h0, padding_mode, nonlinearity);
  check_on_cuda(x, "seqkernels.convrnn_forward");
  TORCH_CHECK(s.B <= 0x7fffffff && s.C * s.N <= 0x7fffffff && s.C * s.C * s.K <= 0x7fffffff,
              "seqkernels.convrnn_forward: sizes too large for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(x.device());
  return AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "seqkernels.convrnn_forward",
                                         [&] { return convrnn_forward_impl<scalar_t>(s, x, weight, bias, h0); });
}

std::tuple<Tensor, Tensor, Tensor, Tensor> convrnn_backward_cuda(const Tensor& grad_y, const Tensor& grad_h_T,
                                                                 const Tensor& weight, const Tensor& h0,
                                                                 const Tensor& y, int64_t padding_mode,
                                                                 int64_t nonlinearity, bool has_bias) {
  const ConvRnnSizes s =
      check_convrnn_backward(grad_y, grad_h_T, weight, h0, y, padding_mode, nonlinearity, has_bias);
  check_on_cuda(y, "seqkernels.convrnn_backward");
  TORCH_CHECK(s.B <= 0x7fffffff && s.C * s.N <= 0x7fffffff && s.C * s.C * s.K <= 0x7fffffff,
              "seqkernels.convrnn_backward: sizes too large for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(y.device());
  return AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "seqkernels.convrnn_backward", [&] {
    return convrnn_backward_impl<scalar_t>(s, grad_y, grad_h_T, weight, h0, y);
  });
}

}  // namespace
}  // namespace seqkernels

TORCH_LIBRARY_IMPL(seqkernels, CUDA, m) {
  m.impl("convrnn_forward", &seqkernels::convrnn_forward_cuda);
  m.impl("convrnn_backward", &seqkernels::convrnn_backward_cuda);
}
