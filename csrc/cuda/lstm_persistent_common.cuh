// The persistent LSTM loop's shared parts (lstm_persistent.cu has the design and the list of its
// files): limits, the kernels' argument types, device helpers, the host's planning and launch
// helpers, and the entry points of the direct and cluster forward kernels.
//
// The argument types and the entry points are in namespace persistent, shared by the units; the
// helpers are in its anonymous namespace as when the loop was one file, each unit compiling its
// own copy of those it uses.
#pragma once

#include "lstm_persistent.cuh"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cluster.cuh"
#include "kernel_attributes.cuh"
#include "lstm_device.cuh"
#include "lstm_one_cluster.cuh"
#include "packed_steps.cuh"
#include "seqkernels/lstm_cell.h"

namespace seqkernels {
namespace cuda {
namespace persistent {

using u64 = unsigned long long;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBatch = 64;     // B limit of the persistent path
// One gate item (unit, batch row) per thread: U * B <= kThreads. (Two items per thread would
// double the hot loop's code, and the loop must stay small: at ~10K instructions the step time
// was bound by instruction fetch, measured on an H200.)
constexpr int kItems = 1;

// How a block forms its gate pre-activations.
enum class Path : int {
  kMma16,  // bf16 / fp16: mma.m16n8k16, fp32 accumulation, W_hh fragments in registers
  kTf32,   // float32 with TF32 allowed: mma.m16n8k8.tf32, W_hh fragments in registers
  kFma,    // float32 with TF32 off, float64: FFMA / DFMA, W_hh in shared memory
  // float32 with TF32 off, direct forward kernel only: three TF32 MMAs per product (h and W_hh
  // each split into a TF32 value and the TF32 value of its remainder; big·big + big·small +
  // small·big), float32 accuracy on tensor cores.
  kTf32x3,
  // float32 with TF32 allowed, direct forward kernel only: the 16-bit path's fp16 MMAs, W_hh's
  // fragments scaled per warp and h0's rows per row by powers of two (exact), h exchanged as fp16
  // (h_t = o·tanh(c) is in [-1, 1]); TF32's 10-bit mantissa with float32 sums, as the cluster
  // kernel's ClusterOperands::kHalfScaled.
  kHalfScaled,
  // float32 with TF32 off, direct forward kernel at B <= 8, Hp > 512 only: kTf32x3's products on
  // fp16 parts (h and W_hh, scaled as kHalfScaled's, each an fp16 value and 2^11 times its
  // remainder in fp16; 22 significant bits), two fp16 MMAs per k16 step; h exchanged as kTf32x3's.
  kHalfX3,
};

// Tensor-core shapes. Per warp, the resident B fragments are [kNT n8 tiles][kKS k-steps][2]
// 32-bit registers: K per warp <= 128 (forward: Hp <= 1024 over 8 warps) or 512 (backward:
// 4 Hp <= 4096), so 64 registers for bf16/fp16 and 128 for TF32.
template <Path P, bool kBwd>
struct MmaCfg {
  static constexpr int kStep = P == Path::kTf32 ? 8 : 16;  // k per mma
  static constexpr int kNT = kBwd ? 1 : 4;                 // n8 tiles: 4U <= 32 columns forward, U <= 8 backward
  static constexpr int kKS = (kBwd ? 512 : 128) / kStep;   // k-steps per warp
};

// 16-byte LL loads per thread per batch (64 KB per block in flight; TF32 keeps 128 registers of
// W_hh fragments and gets half).
template <Path P>
constexpr int gather_batch() {
  return P == Path::kTf32 ? 8 : 16;
}

// Sizes and shared-memory layout of one launch, computed on the host (make_geometry).
struct Geometry {
  int T, B, H, U, lg_u, nblocks, Hp;
  int Kx;          // columns of the exchanged matrix: Hp (forward: h) or 4 Hp (backward: dG)
  int nch;         // column chunks the X tile is loaded in per step (1 unless B * Kx is large)
  int CK;          // chunk width in columns (nch * CK >= Kx)
  int kpc;         // MMA: k-steps per warp per chunk
  int ldx;         // X tile row stride (elements); row bytes = 16 mod 128: conflict-free fragments
  int NCp;         // GEMM output columns per row of red (MMA: padded to 8)
  int nt;          // MMA: n8 tiles = NCp / 8
  int kp;          // K partitions of red, summed in order by the gate threads
  int fma_tiles;   // FMA: 4x4 output tiles
  int fma_tc;      // FMA: tiles per output row
  int red_stride;  // elements between K partitions of red
  int row_words;   // LL words per exchanged row = Kx * sizeof(scalar_t) / 4
  int wpb;         // LL words of one block's U-element slice = U * sizeof(scalar_t) / 4 (a power of 2)
  int lg_wpb;      // log2(wpb)
  int pad_shift;   // direct forward: 1 where each block's 16-byte slice sits in a 32-byte L2 sector of
                   // its own (row_words then counts the padding: twice the words of the row's data)
  int off_red, off_stage, off_w, off_seg;  // shared-memory layout (bytes); the X tile is at 0
  int smem;        // dynamic shared memory bytes
  int cl;          // split backward: blocks per thread-block cluster (1: no cluster)
  int nprod;       // split backward: producers of the exchanged partials (nblocks / cl)
  int ldp;         // split backward, clustered: row stride (floats) of the partials in shared memory
  int off_part;    // split backward, clustered: the partials [2][16][ldp] (bytes)
};

template <class scalar_t>
struct FwdArgs {
  using acc_t = at::opmath_type<scalar_t>;
  Geometry g;
  SegTable seg;
  bool reverse;
  const acc_t* pre;      // [N, G] x·W_ihᵀ, no bias
  const float* pre_unscale;  // [N + G] or nullptr: pre scaled per row and gate (cluster kernel, kHalf)
  const scalar_t* b_ih;  // [G] or nullptr (no bias); the kernel adds b_ih + b_hh in acc_t
  const scalar_t* b_hh;  // [G]
  const scalar_t* w_hh;  // [G, H]
  const scalar_t* h0;    // [B, H]
  const scalar_t* c0;    // [B, H]
  scalar_t* y;           // [N, H] out
  scalar_t* gates;       // [N, G] out (training): activated gates
  scalar_t* cells;       // [N, H] out (training): c_t
  scalar_t* h_n;         // [B, H] out
  acc_t* c_n;            // [B, H] out
  u64* xbuf;             // [2, B, row_words] LL exchange of h (flags zeroed before launch)
  int trace;             // SEQKERNELS_LSTM_TRACE: block 0 prints cycles per step and phase
  // The cluster forward kernel: poll the poisoned words of h_{t-1} themselves, without waiting for
  // the producers' step flags first (cluster_polls_data, lstm_persistent.cuh).
  int poll_data;
};

template <class scalar_t>
struct BwdArgs {
  using acc_t = at::opmath_type<scalar_t>;
  Geometry g;
  SegTable seg;
  bool reverse;
  const scalar_t* w_hh;      // [G, H]
  const scalar_t* gates;     // [N, G] saved activated gates
  const scalar_t* cells;     // [N, H] saved c_t
  const scalar_t* y;         // [N, H] h_t of every row
  const scalar_t* grad_y;    // [N, H]
  const scalar_t* h0;        // [B, H]
  const scalar_t* c0;        // [B, H]
  const scalar_t* grad_h_n;  // [B, H]
  const scalar_t* grad_c_n;  // [B, H]
  scalar_t* dG;              // [N, G] out: pre-activation gradients
  scalar_t* hprev;           // [N, H] out: h_{t-1} of every row
  acc_t* grad_h0;            // [B, H] out
  acc_t* grad_c0;            // [B, H] out
  u64* dbuf;                 // [2, B, row_words] LL exchange of dG, or of partial dh (split kernel);
                             // flags zeroed before launch
  int trace;                 // SEQKERNELS_LSTM_TRACE: block 0 prints cycles per step and phase
  // The row-split backward kernel: poll the poisoned words of dG itself, without waiting for the
  // producers' step flags first (cluster_polls_data, lstm_persistent.cuh).
  int poll_data;
};

namespace {

// ---------------------------------------------------------------------------------------
// Device helpers
// ---------------------------------------------------------------------------------------

// Two LL words (16 bytes): two single-copy-atomic 64-bit relaxed loads at GPU scope (L2).
__device__ __forceinline__ void ll_load(const u64* p, u64& lo, u64& hi) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(p) : "memory");
}

// The same pair if `pred` is nonzero, predicated inside the instruction (no branch); lo and hi
// keep their values otherwise.
__device__ __forceinline__ void ll_load_if(unsigned pred, const u64* p, u64& lo, u64& hi) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];\n}"
               : "+l"(lo), "+l"(hi)
               : "l"(p), "r"(pred)
               : "memory");
}

// One LL word, one atomic 64-bit store.
__device__ __forceinline__ void ll_store_word(u64* p, u64 v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// One LL word: payload in the low half, flag in the high half.
__device__ __forceinline__ void ll_store(u64* p, uint32_t payload, uint32_t flag) {
  ll_store_word(p, (static_cast<u64>(flag) << 32) | payload);
}

// Both words carry flag `want` in their bits [flag_shift, 64) (32: ll_store's format; the
// direct forward kernel's TF32 pairs keep their flag higher up).
__device__ __forceinline__ bool ll_valid(u64 lo, u64 hi, unsigned want, int flag_shift = 32) {
  return static_cast<uint32_t>(lo >> flag_shift) == want && static_cast<uint32_t>(hi >> flag_shift) == want;
}

__device__ __forceinline__ u64 ll_payload(u64 lo, u64 hi) { return (lo & 0xffffffffull) | (hi << 32); }

// The slow path of a wait, out of line so that the hot loop stays small: re-reads the pair
// at p (one load in flight) until both words carry `want`.
__device__ __noinline__ ulonglong2 ll_wait(const u64* p, unsigned want, int flag_shift = 32) {
  const long long t0 = clock64();
  u64 lo, hi;
  while (true) {
    ll_load(p, lo, hi);
    if (ll_valid(lo, hi, want, flag_shift)) return make_ulonglong2(lo, hi);
    check_spin_timeout(t0, want);
  }
}

// Block-wide: copies rows [0, nrows) x words [0, ncol_words) of an LL matrix (row stride
// src_row_words, ncol_words even, 16-byte aligned rows) into shared memory (row stride
// dst_row_bytes), waiting for flag `want`. Thread t handles the word pairs t, t + kThreads, ...
// It first waits for its first pair alone (one load in flight per thread while the producers
// are still writing, so that polling does not flood L2), then reads the rest in batches of CH
// 16-byte loads; if some are not ready it waits for one of them alone and re-reads the rest.
// No barrier inside: the caller synchronises before reading the tile. The code is kept small
// on purpose (32-bit running offsets, one out-of-line wait): it runs in every step.
template <int CH>
__device__ __forceinline__ void ll_gather(const u64* src, int src_row_words, int ncol_words, int nrows,
                                          unsigned want, unsigned char* dst, int dst_row_bytes) {
  const int ppr = ncol_words >> 1;  // word pairs per row
  if (nrows <= 0 || ppr <= 0) return;
  const int dr = kThreads / ppr, dc = kThreads - dr * ppr;
  int r = static_cast<int>(threadIdx.x) / ppr;
  int c = static_cast<int>(threadIdx.x) - r * ppr;
  if (r >= nrows) return;
  int soff = r * src_row_words + 2 * c;  // words
  int doff = r * dst_row_bytes + 8 * c;  // bytes
  const int s_step = dr * src_row_words + 2 * dc, s_wrap = src_row_words - 2 * ppr;
  const int d_step = dr * dst_row_bytes + 8 * dc, d_wrap = dst_row_bytes - 8 * ppr;
  auto advance = [&]() {
    r += dr;
    c += dc;
    soff += s_step;
    doff += d_step;
    if (c >= ppr) {
      c -= ppr;
      ++r;
      soff += s_wrap;
      doff += d_wrap;
    }
  };
  {
    const ulonglong2 v = ll_wait(src + soff, want);
    *reinterpret_cast<u64*>(dst + doff) = ll_payload(v.x, v.y);
    advance();
  }
#pragma unroll 1
  while (r < nrows) {
    u64 lo[CH], hi[CH];
    int so[CH], dof[CH];
    unsigned pending = 0;
#pragma unroll
    for (int e = 0; e < CH; ++e) {
      if (r < nrows) {
        so[e] = soff;
        dof[e] = doff;
        ll_load(src + soff, lo[e], hi[e]);
        pending |= 1u << e;
        advance();
      }
    }
    while (true) {
      int first = -1;
#pragma unroll
      for (int e = 0; e < CH; ++e) {
        if ((pending >> e) & 1u) {
          if (ll_valid(lo[e], hi[e], want)) {
            *reinterpret_cast<u64*>(dst + dof[e]) = ll_payload(lo[e], hi[e]);
            pending &= ~(1u << e);
          } else if (first < 0) {
            first = so[e];
          }
        }
      }
      if (pending == 0) break;
      (void)ll_wait(src + first, want);  // one of them, alone; then re-read the others
#pragma unroll
      for (int e = 0; e < CH; ++e) {
        if ((pending >> e) & 1u) ll_load(src + so[e], lo[e], hi[e]);
      }
    }
  }
}

// Sum of red[q * stride + idx] over q in [0, kp), in a fixed order (deterministic). KP > 0:
// the depth is the compile-time KP (a pairwise tree); KP == 0: the run-time kp, in a loop
// that is deliberately not unrolled (code size, see kItems).
template <int KP, class acc_t>
__device__ __forceinline__ acc_t sum_partials(const acc_t* red, int kp, int stride, int idx) {
  if constexpr (KP > 0) {
    acc_t v[KP];
#pragma unroll
    for (int q = 0; q < KP; ++q) v[q] = red[q * stride + idx];
#pragma unroll
    for (int w = 1; w < KP; w *= 2) {
#pragma unroll
      for (int q = 0; q + w < KP; q += 2 * w) v[q] += v[q + w];
    }
    return v[0];
  } else {
    acc_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int q = 0;
#pragma unroll 1
    for (; q + 4 <= kp; q += 4) {
      s0 += red[(q + 0) * stride + idx];
      s1 += red[(q + 1) * stride + idx];
      s2 += red[(q + 2) * stride + idx];
      s3 += red[(q + 3) * stride + idx];
    }
#pragma unroll 1
    for (; q < kp; ++q) s0 += red[q * stride + idx];
    return (s0 + s1) + (s2 + s3);
  }
}

template <class T>
struct Vec4 {
  T v[4];
};
__device__ __forceinline__ Vec4<float> lds4(const float* p) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  return {{q.x, q.y, q.z, q.w}};
}
__device__ __forceinline__ Vec4<double> lds4(const double* p) {
  const double2 a = reinterpret_cast<const double2*>(p)[0];
  const double2 b = reinterpret_cast<const double2*>(p)[1];
  return {{a.x, a.y, b.x, b.y}};
}

// The resident recurrent weights and the per-step product
//   red[kpart][n][c] (+)= sum over k in kpart of this chunk of X[n][k] * Wres[k][c],
// X = the step's [bt, CK] tile in shared memory (row stride ldx), Wres[k][c] given at load
// time by wf(k, c) over the whole K (chunks included). Rows n >= bt of the tile hold finite
// stale values (or zeros): their results are never read.
template <class scalar_t, Path P, bool kBwd, class Enable = void>
struct Resident {  // Path::kFma: Wres in shared memory, [nch * CK][NCp]
  using acc_t = at::opmath_type<scalar_t>;
  template <class WF>
  __device__ void load(const WF& wf, const Geometry& g, scalar_t* ws) {
    const int rows = g.nch * g.CK;
    for (int i = threadIdx.x; i < rows * g.NCp; i += kThreads) {
      const int k = i / g.NCp;
      ws[i] = wf(k, i - k * g.NCp);
    }
  }
  // Thread: one 4x4 output tile (rows n0.., columns c0..) over the k-vectors kpart, kpart + kp, ...
  __device__ void gemm(const Geometry& g, const scalar_t* xs, const scalar_t* ws, int chunk, int bt,
                       acc_t* red) const {
    const int tid = threadIdx.x;
    const int tile = tid % g.fma_tiles;
    const int kpart = tid / g.fma_tiles;
    if (kpart >= g.kp) return;
    const int n0 = (tile / g.fma_tc) * 4;
    const int c0 = (tile % g.fma_tc) * 4;
    if (n0 >= bt) return;
    acc_t acc[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][c] = 0;
    const scalar_t* wbase = ws + static_cast<int64_t>(chunk) * g.CK * g.NCp + c0;
    const int nv = g.CK / 4;
    for (int v = kpart; v < nv; v += g.kp) {
      const int k = 4 * v;
      Vec4<acc_t> x[4], w[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) x[r] = lds4(xs + (n0 + r) * g.ldx + k);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) w[kk] = lds4(wbase + (k + kk) * g.NCp);
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[r][c] = fma(x[r].v[kk], w[kk].v[c], acc[r][c]);
    }
    acc_t* out = red + kpart * g.red_stride + n0 * g.NCp + c0;
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (chunk == 0) {
          out[r * g.NCp + c] = acc[r][c];
        } else {
          out[r * g.NCp + c] += acc[r][c];
        }
      }
  }
};

template <class scalar_t, Path P, bool kBwd>
struct Resident<scalar_t, P, kBwd, std::enable_if_t<P != Path::kFma>> {  // tensor cores, Wres in registers
  using Cfg = MmaCfg<P, kBwd>;
  static constexpr int kStep = Cfg::kStep, kNT = Cfg::kNT, kKS = Cfg::kKS;
  // B fragments: fragment f of this warp is chunk f / kpc, k-step f % kpc; k0 = chunk * CK +
  // (warp * kpc + f % kpc) * kStep. m16n8k16: b0 = {W[k0+2t][col], W[k0+2t+1][col]},
  // b1 = the same 8 rows further; m16n8k8.tf32: b0 = W[k0+t][col], b1 = W[k0+t+4][col];
  // col = nt * 8 + lane / 4, t = lane % 4.
  uint32_t b[kNT][kKS][2];

  template <class WF>
  __device__ void load(const WF& wf, const Geometry& g, scalar_t*) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int f = 0; f < kKS; ++f) {
        uint32_t b0 = 0, b1 = 0;
        if (nt < g.nt && f < g.nch * g.kpc) {
          const int chunk = f / g.kpc;
          const int k0 = chunk * g.CK + (warp * g.kpc + (f - chunk * g.kpc)) * kStep;
          const int col = nt * 8 + gq;
          if constexpr (P == Path::kTf32) {
            b0 = to_tf32(static_cast<float>(wf(k0 + tq, col)));
            b1 = to_tf32(static_cast<float>(wf(k0 + tq + 4, col)));
          } else {
            b0 = pack2(wf(k0 + 2 * tq, col), wf(k0 + 2 * tq + 1, col));
            b1 = pack2(wf(k0 + 2 * tq + 8, col), wf(k0 + 2 * tq + 9, col));
          }
        }
        b[nt][f][0] = b0;
        b[nt][f][1] = b1;
      }
    }
  }

  // Warp w covers columns [w * kpc * kStep, (w + 1) * kpc * kStep) of the chunk and writes its
  // partial sums to red[w]. A fragments from the X tile (row-major [n][k]):
  //   m16n8k16: a0 = X[m0+g][k+2t..], a1 = X[m0+g+8][k+2t..], a2/a3 = the same at k+8
  //   m16n8k8:  a0 = X[m0+g][k+t], a1 = X[m0+g+8][k+t], a2/a3 = the same at k+4
  __device__ void gemm(const Geometry& g, const scalar_t* xs, const scalar_t*, int chunk, int bt,
                       float* red) const {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    const int f_lo = chunk * g.kpc, f_hi = f_lo + g.kpc;
    const int kw = warp * g.kpc * kStep;
    float* rw = red + warp * g.red_stride;
    // With a single n-tile (backward) even and odd k-steps accumulate separately: two
    // independent MMA chains instead of one of up to 64 dependent MMAs.
    constexpr int kSets = kNT == 1 ? 2 : 1;
    for (int m0 = 0; m0 < bt; m0 += 16) {
      float acc_s[kSets][kNT][4];
#pragma unroll
      for (int q = 0; q < kSets; ++q)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) acc_s[q][nt][0] = acc_s[q][nt][1] = acc_s[q][nt][2] = acc_s[q][nt][3] = 0.f;
      const scalar_t* x0 = xs + (m0 + gq) * g.ldx;
      const scalar_t* x1 = x0 + 8 * g.ldx;
#pragma unroll
      for (int f = 0; f < kKS; ++f) {
        if (f >= f_lo && f < f_hi) {
          const int k = kw + (f - f_lo) * kStep;
          uint32_t a[4];
          if constexpr (P == Path::kTf32) {
            a[0] = to_tf32(x0[k + tq]);
            a[1] = to_tf32(x1[k + tq]);
            a[2] = to_tf32(x0[k + tq + 4]);
            a[3] = to_tf32(x1[k + tq + 4]);
          } else {
            a[0] = *reinterpret_cast<const uint32_t*>(x0 + k + 2 * tq);
            a[1] = *reinterpret_cast<const uint32_t*>(x1 + k + 2 * tq);
            a[2] = *reinterpret_cast<const uint32_t*>(x0 + k + 8 + 2 * tq);
            a[3] = *reinterpret_cast<const uint32_t*>(x1 + k + 8 + 2 * tq);
          }
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            if (nt < g.nt) MmaInst<scalar_t>::run(acc_s[f % kSets][nt], a, b[nt][f][0], b[nt][f][1]);
          }
        }
      }
      float acc[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[nt][e] = kSets == 2 ? acc_s[0][nt][e] + acc_s[kSets - 1][nt][e] : acc_s[0][nt][e];
        }
      // C fragment: c0/c1 = (row m0+g, columns 2t, 2t+1), c2/c3 = row m0+g+8.
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        if (nt < g.nt) {
          float* r0 = rw + (m0 + gq) * g.NCp + nt * 8 + 2 * tq;
          float* r1 = r0 + 8 * g.NCp;
          if (chunk == 0) {
            r0[0] = acc[nt][0];
            r0[1] = acc[nt][1];
            r1[0] = acc[nt][2];
            r1[1] = acc[nt][3];
          } else {
            r0[0] += acc[nt][0];
            r0[1] += acc[nt][1];
            r1[0] += acc[nt][2];
            r1[1] += acc[nt][3];
          }
        }
      }
    }
  }
};

// Copies the step table into shared memory (block-wide).
__device__ __forceinline__ void copy_step_table(const SegTable& src, SegTable* dst) {
  const int* s = reinterpret_cast<const int*>(&src);
  int* d = reinterpret_cast<int*>(dst);
  for (int i = threadIdx.x; i < static_cast<int>(sizeof(SegTable) / sizeof(int)); i += kThreads) d[i] = s[i];
}

// Zeroes the X tile (so that padding columns and rows are finite zeros) and copies the step
// table into shared memory.
__device__ __forceinline__ void init_shared(unsigned char* smem, const Geometry& g, const SegTable& src,
                                            SegTable* dst, int x_bytes) {
  uint4* x = reinterpret_cast<uint4*>(smem);
  for (int i = threadIdx.x; i < x_bytes / 16; i += kThreads) x[i] = make_uint4(0, 0, 0, 0);
  copy_step_table(src, dst);
}

// Gate item p of this thread: unit u (global j) of batch row n.
struct Item {
  int u, n, j;
  bool exists;  // n < B
  bool valid;   // n < B and j < H (padding units of the last block only publish zeros)
};

__device__ __forceinline__ Item make_item(const Geometry& g, int p) {
  const int i = threadIdx.x + p * kThreads;
  Item it;
  it.u = i & (g.U - 1);
  it.n = i >> g.lg_u;
  it.j = blockIdx.x * g.U + it.u;
  it.exists = it.n < g.B;
  it.valid = it.exists && it.j < g.H;
  return it;
}

// SEQKERNELS_LSTM_TRACE: the means per step of a persistent kernel's PhaseTrace (lstm_device.cuh):
// wait + gather of the exchanged matrix, the product, the partial-sum exchange (where a kernel
// marks one), the gate math, publication and output stores.
__device__ void report_trace(const PhaseTrace& tr, const char* what, const Geometry& g) {
  if (!tr.on) return;
  const double t = g.T;
  printf("seqkernels trace %s: T=%d B=%d H=%d blocks=%d U=%d chunks=%d | ns/step %.0f (%.2f GHz) | cycles/step: total"
         " %.0f = wait+gather %.0f + product %.0f + exchange %.0f + gates %.0f + publish/stores %.0f\n",
         what, g.T, g.B, g.H, g.nblocks, g.U, g.nch, tr.ns_per_step(g.T), tr.clock_ghz(g.T), (tr.last - tr.begin) / t,
         tr.acc[0] / t, tr.acc[1] / t, tr.acc[4] / t, tr.acc[2] / t, tr.acc[3] / t);
}

// ---------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
inline int round_up(int a, int b) { return ceil_div(a, b) * b; }
inline size_t align16(size_t x) { return (x + 15) & ~size_t{15}; }

// Geometry for U units per block; false when the resident weights or the shared memory of
// one block do not fit.
// What every geometry shares: the sizes, U units per block, and the LL exchange's row layout
// (Kx columns: h forward, dG backward; elem_size bytes per element).
inline void base_geometry(const LstmSizes& s, int U, int elem_size, bool backward, Geometry& g) {
  g = Geometry{};
  g.T = static_cast<int>(s.T);
  g.B = static_cast<int>(s.B);
  g.H = static_cast<int>(s.H);
  g.U = U;
  g.lg_u = U == 4 ? 2 : 3;
  g.nblocks = ceil_div(g.H, U);
  g.Hp = g.nblocks * U;
  g.Kx = backward ? 4 * g.Hp : g.Hp;
  g.wpb = U * elem_size / 4;
  g.lg_wpb = 0;
  while ((1 << g.lg_wpb) < g.wpb) ++g.lg_wpb;
  g.row_words = g.Kx * elem_size / 4;
}

template <class scalar_t, Path P, bool kBwd>
bool make_geometry(const LstmSizes& s, const cudaDeviceProp& prop, int U, Geometry& g) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int sz = sizeof(scalar_t);
  base_geometry(s, U, sz, kBwd, g);
  const int NC = kBwd ? U : 4 * U;
  const int Bp16 = round_up(g.B, 16);
  if constexpr (P != Path::kFma) {
    g.NCp = round_up(NC, 8);
    g.nt = g.NCp / 8;
    g.kp = kWarps;
  } else {
    g.NCp = NC;
    g.fma_tc = NC / 4;
    g.fma_tiles = ceil_div(g.B, 4) * g.fma_tc;
    g.kp = std::min(32, kThreads / g.fma_tiles);
  }
  g.red_stride = Bp16 * g.NCp;
  for (int nch : {1, 2, 4, 8}) {
    if constexpr (P != Path::kFma) {
      using Cfg = MmaCfg<P, kBwd>;
      const int nks = ceil_div(g.Kx, kWarps * Cfg::kStep);
      const int kpc = ceil_div(nks, nch);
      if (nch > 1 && (nch - 1) * kpc >= nks) return false;  // more chunks would only add empty ones
      if (nch * kpc > Cfg::kKS) continue;                    // not enough resident fragments
      g.kpc = kpc;
      g.CK = kWarps * kpc * Cfg::kStep;
    } else {
      const int ck = round_up(ceil_div(g.Kx, nch), 8);
      if (nch > 1 && (nch - 1) * ck >= g.Kx) return false;
      g.CK = ck;
    }
    g.nch = nch;
    g.ldx = g.CK;
    while ((g.ldx * sz) % 128 != 16) g.ldx += 16 / sz;
    size_t off = static_cast<size_t>(Bp16) * g.ldx * sz;
    off = align16(off);
    g.off_red = static_cast<int>(off);
    off += static_cast<size_t>(g.kp) * g.red_stride * sizeof(acc_t);
    off = align16(off);
    g.off_stage = static_cast<int>(off);
    off += static_cast<size_t>(g.B) * (kBwd ? 4 * U : U) * sz;
    off = align16(off);
    g.off_w = static_cast<int>(off);
    if (P == Path::kFma) off += static_cast<size_t>(nch) * g.CK * g.NCp * sz;
    off = align16(off);
    g.off_seg = static_cast<int>(off);
    off += sizeof(SegTable);
    if (off <= prop.sharedMemPerBlockOptin) {
      g.smem = static_cast<int>(off);
      return true;
    }
  }
  return false;
}

// Whether all g.nblocks blocks of the kernel (in clusters of g.cl where g.cl > 1) can be resident
// at once; prepares the kernel for its dynamic shared memory.
inline bool co_resident(const void* fn, const Geometry& g, const cudaDeviceProp& prop) {
  ensure_dynamic_smem(fn, g.smem);
  const int per_sm = max_blocks_per_sm(fn, kThreads, g.smem);
  if (per_sm <= 0 || per_sm * prop.multiProcessorCount < g.nblocks) return false;
  return g.cl <= 1 || max_active_clusters(fn, kThreads, g.smem, g.cl) * g.cl >= g.nblocks;
}

// Picks U (4, then 8 units per block) such that the geometry (make(U, g)) fits and all blocks
// can be co-resident, and prepares the kernel for its dynamic shared memory.
// A geometry with g.cl > 1 is launched in clusters of g.cl blocks: then the clusters that fit
// at once (the occupancy API's answer for clusters, which keeps each cluster within one GPC)
// must hold every block.
template <class Kernel, class MakeGeometry>
bool plan(const LstmSizes& s, const cudaDeviceProp& prop, Kernel kernel, Geometry& g, MakeGeometry make) {
  for (int U : {4, 8}) {
    if (U * s.B > kItems * kThreads) continue;  // one gate item (unit, row) per thread
    if (!make(U, g)) continue;
    if (g.nblocks > prop.multiProcessorCount * 8) continue;
    if (co_resident(reinterpret_cast<const void*>(kernel), g, prop)) return true;
  }
  return false;
}

// Cooperative launch (all blocks co-resident, or an error, never a partial grid), in clusters
// of g.cl blocks where g.cl > 1.
template <class Kernel, class Args>
bool launch_cooperative(Kernel kernel, const Args& args, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(args.g.nblocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(args.g.smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (args.g.cl > 1) {
    attr[1] = cluster_dimension(args.g.cl);
    cfg.numAttrs = 2;
  }
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, args);
  if (err == cudaErrorCooperativeLaunchTooLarge) {
    (void)cudaGetLastError();  // not co-resident after all (e.g. an MPS SM limit): fall back
    return false;
  }
  C10_CUDA_CHECK(err);
  return true;
}

inline int trace_requested() {
  const char* env = std::getenv("SEQKERNELS_LSTM_TRACE");
  return env != nullptr && env[0] != '\0' && std::string(env) != "0";
}

// Whether the persistent kernel can take the call at all (lstm.cu has chosen it already).
inline bool common_preconditions(const LstmSizes& s, const cudaDeviceProp& prop) {
  return s.P == 0 && s.B >= 1 && s.B <= kMaxBatch && s.H >= 1 && prop.cooperativeLaunch;
}

// The exchange buffer and the cooperative launch of a planned kernel. The buffer has `words`
// 8-byte words (0: the LL buffer's [2, B, row_words]); its first poison_bytes are set to 0xff,
// the rest (flags) zeroed, on the current stream.
template <class Kernel, class Args>
bool launch_with_exchange(Kernel kernel, Args& args, u64*& buffer, const at::Tensor& like, int64_t words = 0,
                          size_t poison_bytes = 0) {
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (words == 0) words = 2 * static_cast<int64_t>(args.g.B) * args.g.row_words;
  at::Tensor buf = at::empty({words}, like.options().dtype(at::kLong));
  TORCH_CHECK(poison_bytes <= buf.nbytes(), "seqkernels: exchange buffer smaller than its poisoned part");
  unsigned char* const bytes = static_cast<unsigned char*>(buf.data_ptr());
  if (poison_bytes > 0) C10_CUDA_CHECK(cudaMemsetAsync(bytes, 0xff, poison_bytes, stream));
  C10_CUDA_CHECK(cudaMemsetAsync(bytes + poison_bytes, 0, buf.nbytes() - poison_bytes, stream));
  buffer = reinterpret_cast<u64*>(buf.data_ptr());
  return launch_cooperative(kernel, args, stream);
}

// A compile-time int as a value: the host picks a kernel instance by trying its template
// arguments in turn (run_forward, run_backward).
template <int V>
using IntConst = std::integral_constant<int, V>;

// Calls f(std::integral_constant<Path, path>{}) with the arithmetic path of a dtype: tensor
// cores for half types and for float32 with TF32 allowed, FMA otherwise. Only the paths a
// dtype can take are instantiated.
template <class scalar_t, class F>
bool with_path(bool tf32, F&& f) {
  if constexpr (kHalfType<scalar_t>) {
    return f(std::integral_constant<Path, Path::kMma16>{});
  } else {
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (tf32) return f(std::integral_constant<Path, Path::kTf32>{});
    }
    return f(std::integral_constant<Path, Path::kFma>{});
  }
}

}  // namespace

// The direct forward kernel (DP: kMma16, kTf32, kTf32x3 or kHalfScaled) where one of its instances
// takes the call; false otherwise, having launched nothing (lstm_persistent_direct.cu).
template <class scalar_t, Path DP, bool kTraining>
bool run_direct_forward(const LstmSizes& s, const cudaDeviceProp& prop, FwdArgs<scalar_t>& args,
                        const at::Tensor& like);

// SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD (diagnostic) as -1 (unset), 0 or 1
// (lstm_persistent_cluster.cu).
int cluster_forward_mode();

// The cluster forward kernel where one of its instances takes the call; false otherwise, having
// launched nothing (lstm_persistent_cluster.cu).
template <class scalar_t, bool kTraining, ClusterOperands kOps>
bool run_cluster_forward(const LstmSizes& s, const cudaDeviceProp& prop, FwdArgs<scalar_t>& args,
                         const at::Tensor& like);

// The row-split backward kernel (bf16 / fp16 only: H = 1024, B <= 16) where
// row_split_backward_applies; false otherwise, having launched nothing (lstm_row_split_backward.cu).
template <class scalar_t>
bool run_row_split_backward(const LstmSizes& s, const cudaDeviceProp& prop, BwdArgs<scalar_t>& args,
                            const at::Tensor& like);

}  // namespace persistent
}  // namespace cuda
}  // namespace seqkernels
