// Fused-step LSTM loop: one kernel per time step, the recurrent GEMM and the gate math fused,
// consecutive steps overlapped with programmatic dependent launch (PDL, sm_90).
//
// Why. The cuBLAS loop of lstm.cu launches a GEMM and a pointwise kernel per step, and the
// GEMM's gate pre-activations make a round trip through global memory between them: ~9-11 µs
// per step on an H200, bound by two launches. The persistent kernel (lstm_persistent.cu) has
// no launches but exchanges the whole state between all blocks every step, which grows with
// B·H. Here a step is one launch whose only wait is the kernel boundary, and PDL hides most of
// that boundary: step t+1's kernel is launched while step t runs, copies its slice of W_hh into
// shared memory and loads its epilogue inputs (everything that does not depend on step t), and
// only then waits (griddepcontrol.wait) for step t to finish.
//
// Shape legend: T steps, N packed rows, B = batch_sizes[0], H hidden, G = 4H gate rows
// (i, f, g, o), bt = batch_sizes[t], U hidden units per block, NT n8 tiles per block, K the
// GEMM depth (H forward, G backward), KC the k-columns of one chunk (64 bytes per row: 32
// bf16/fp16 or 16 TF32 values), E = KC / 4 the values one lane holds per row and chunk.
//
// Forward step (one launch): block (ub, bb) owns units j in [ub·U, ub·U + U) (all four gates:
// NC = 4U GEMM columns) and batch rows [bb·16·MT, +16·MT) of the step. It computes
//     D[n][c] = sum_k h_{t-1}[n][k] · W_hh[row(c)][k],   c = gate·U + u, row(c) = gate·H + j
// with mma.sync (bf16/fp16: m16n8k16; float32 with TF32 allowed: m16n8k8.tf32, without it three
// of those per product (kX3 below); fp32 accumulation): its W_hh rows in shared memory (B
// operand), h_{t-1} rows read straight from global memory (L2) into A fragments. The 8 warps
// split the block's MT m16 tiles and K (KG = 8 / MT K-groups); partial sums meet in shared
// memory and are added in a fixed order (deterministic). Then one thread per (row, unit) adds
// pre = x·W_ihᵀ and the bias, applies lstm_cell.h, and writes y, c (cbuf, in place: one thread
// owns an element), h_n where the row's sequence ends, and the saved gates/cells when training.
//
// Backward step (one launch, reverse processing order): the same ownership; the GEMM is
//     dh[n][u] = sum_r dG_succ[n][r] · W_hh[r][j0 + u]     (K = G, 8 columns: U <= 8, padded)
// where dG_succ is the dG of the step processed just before (the step that continued this
// one's state); rows whose sequence ends here take grad_h_n instead. The epilogue adds grad_y,
// applies lstm_cell_backward and writes dG, dc (dcbuf, in place) and hprev. grad_h0 = the dG of
// each sequence's first step times W_hh is left to cuBLAS after the loop (no step consumes it).
// Where the backward's W slice (32·H·sizeof(scalar_t) bytes) would leave one block per SM
// (TF32 above H ≈ 850, 16-bit above H ≈ 1700) it is not copied to shared memory: each chunk's B
// fragment is read from L2 with its A vectors (StepGeometry::w_global), so that the next step's
// blocks fit beside this step's.
//
// The k-permutation trick. mma sums over k, so any permutation of k applied to A and B alike
// leaves D unchanged. Within a chunk, lane (g, t) loads E consecutive values of an A row with
// one 16-byte load (k = chunk·KC + t·E ...) and uses them as the k-slots {2t, 2t+1, 2t+8,
// 2t+9} of two MMAs (TF32: slots {t, t+4} of two MMAs); W_hh is packed once per call (a small
// kernel) so that lane (g, t)'s 16-byte shared-memory load of chunk c, tile nt holds exactly the
// matching B values for column nt·8 + g. So a lane issues one 16-byte load per A row, one per
// B tile, and two MMAs per tile per chunk: no ldmatrix, no shuffles, no bank conflicts.
//
// PDL and memory. Only inputs that were complete before the first step (pre, W_hh, the bias,
// the saved forward tensors, grad_y, h0, c0, grad_h_n, grad_c_n) are read before
// griddepcontrol.wait; everything a step writes (y, cbuf, dG, dcbuf) is read after it, with
// ld.global.cg (L2). griddepcontrol.launch_dependents follows the wait, so at most two steps are
// in flight and a launched kernel never waits on more than its predecessor. The first step
// launches without the PDL attribute (it waits for everything before it, the input GEMM
// included), which makes "complete before the first step" true for every later step too. A
// launch after the loop (cuBLAS, the caller's next op) has no PDL attribute and waits for the
// last step. Both the attribute and the instructions exist from sm_90 on; below that the
// kernels run in plain stream order. CUDA graphs capture the launches with their
// programmatic edges.
//
// Replayed steps. Eager, the host launches every step (cudaLaunchKernelEx, ~4-6 µs of host
// time a step on these hosts). Where replayed_steps.cuh applies (equal batch sizes, no
// projection, T >= 16, the caller not capturing) a call launches a kept CUDA graph of 16 steps
// instead, with the PDL edges captured: the replay kernels take what every step shares
// (geometry, tiles, the packed W_hh, which is then a kept buffer that every call fills) as
// parameters, and derive the step's pointers from the call's arguments in kept device memory
// (ReplayedCall) and the step counter.
//
// When it runs: lstm_loop.cuh (SEQKERNELS_LSTM_BACKEND=fused forces it; auto chooses it for
// mid-sized B·H). Limits (else the cuBLAS loop): no projection; bf16, fp16 or float32 (float64
// has no tensor-core path here); H % E == 0 (bf16/fp16: H % 8, float32: H % 4) and h0 16-byte
// aligned (16-byte A loads); the forward's W slice (4U·H·sizeof(scalar_t) bytes with U >= 2,
// twice that for float32 without TF32) and the partial sums must fit shared memory (bf16: H up
// to ~14000).
//
// float32 without TF32 (kX3). Each A value and each W_hh value is split into its TF32 value and
// the TF32 value of the remainder (x = big + small + O(2^-22 |x|)); a chunk's two MMAs per tile
// become six: big·big into the first accumulator set, small·big and big·small into the second
// (the dropped small·small term and the splits' remainders are ~2^-22 of each product: float32's
// order, as in lstm_persistent_direct.cu's direct kernel). The packed W holds each fragment's big and
// small vectors side by side (twice the slice); A is split where the MMA consumes it.
#include "lstm_fused_step.cuh"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "blas.cuh"
#include "kernel_attributes.cuh"
#include "lstm_device.cuh"
#include "replayed_steps.cuh"
#include "seqkernels/lstm_cell.h"

namespace seqkernels {
namespace cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxMT = 8;     // m16 tiles per block: 128 batch rows
constexpr int kMaxNT = 4;     // forward: NC = 4U <= 32 columns (U <= 8)
constexpr int kMaxItems = 4;  // epilogue (row, unit) items per thread: 16·MT·U <= 4·kThreads
// Shared memory per block up to which two blocks (this step's and the next's) fit one SM.
constexpr int kTwoPerSmBytes = 110 * 1024;

// Geometry of one direction's loop, fixed for the call (computed on the host by plan_geometry).
struct StepGeometry {
  int H;        // hidden size
  int U;        // units per block: 2, 4 or 8
  int NT;       // n8 tiles of the GEMM: U / 2 (forward, NC = 4U), 1 (backward, U <= 8 padded)
  int K;        // GEMM depth: H (forward) or G (backward)
  int nchunks;  // ceil(K / KC)
  int wvec;     // 16-byte vectors of one block's packed W slice = nchunks · NT · 32 (· 2 for x3)
  int red_ld;   // row stride (floats) of the partial sums: NT·8 rounded up to 8 mod 32 (conflict-free)
  int smem;     // dynamic shared memory bytes: W slice (unless w_global) + partial sums
  bool w_global;  // backward: B fragments read from the packed W in global memory (L2), not shared memory
};

template <class scalar_t>
struct FwdStepArgs {
  using acc_t = at::opmath_type<scalar_t>;
  StepGeometry g;
  int bt;                  // rows of this step
  int mt;                  // m16 tiles per block (1, 2, 4, 8); the grid's y covers bt rows
  int n_prev;              // rows [0, n_prev) continue from h_prev / cbuf; rows [n_prev, bt) start from h0 / c0
  int n_next;              // rows [n_next, bt) end here: their h_t is h_n
  const uint4* w;          // packed W_hh (pack_weights_kernel, forward layout)
  const acc_t* pre;        // [bt, G] x·W_ihᵀ of this step's rows, no bias
  const scalar_t* b_ih;    // [G] or nullptr (no bias); the kernel adds b_ih + b_hh in acc_t
  const scalar_t* b_hh;    // [G]
  const scalar_t* h_prev;  // [n_prev, H] h_{t-1}: the y rows of the previous step
  const scalar_t* h0;      // [B, H]
  const scalar_t* c0;      // [B, H]
  acc_t* cbuf;             // [B, H] c of every row's latest step (c_n at the end)
  scalar_t* y;             // [bt, H] out: h_t
  scalar_t* gates;         // [bt, G] out (training): activated gates
  scalar_t* cells;         // [bt, H] out (training): c_t
  scalar_t* h_n;           // [B, H] out: rows [n_next, bt)
};

template <class scalar_t>
struct BwdStepArgs {
  using acc_t = at::opmath_type<scalar_t>;
  StepGeometry g;
  int bt, mt;
  int n_succ;                // rows [0, n_succ) continue into the step processed just before (dG_succ)
  int n_prev;                // rows [0, n_prev) continue from the previous forward step (prev_cells, prev_y)
  const uint4* w;            // packed W_hh (pack_weights_kernel, backward layout)
  const scalar_t* dG_succ;   // [n_succ, G] dG rows of the successor step
  const scalar_t* grad_y;    // [bt, H]
  const scalar_t* grad_h_n;  // [B, H]
  const scalar_t* grad_c_n;  // [B, H]
  const scalar_t* gates;     // [bt, G] saved activated gates of this step
  const scalar_t* cells;     // [bt, H] saved c_t
  const scalar_t* prev_cells;  // [n_prev, H] c_{t-1}
  const scalar_t* prev_y;      // [n_prev, H] h_{t-1}
  const scalar_t* h0;        // [B, H]
  const scalar_t* c0;        // [B, H]
  acc_t* dcbuf;              // [B, H] dL/dc of every row's latest (backward) step: grad_c0 at the end
  scalar_t* dG;              // [bt, G] out: pre-activation gradients
  scalar_t* hprev;           // [bt, H] out: h_{t-1}
};

// ---------------------------------------------------------------------------------------
// Device helpers
// ---------------------------------------------------------------------------------------

// This block's packed W slice into shared memory, asynchronously (waited for by wait_copies).
__device__ __forceinline__ void copy_async(uint4* dst, const uint4* src, int nvec) {
  for (int i = threadIdx.x; i < nvec; i += kThreads) {
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst + i));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src + i) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
}

// 16 bytes of an A row at column k (k % E == 0), through L2; zeros past the row or for a
// missing row.
template <class scalar_t>
__device__ __forceinline__ uint4 load_a(const scalar_t* row, int k, int K) {
  if (row == nullptr || k >= K) return make_uint4(0u, 0u, 0u, 0u);
  return __ldcg(reinterpret_cast<const uint4*>(row + k));
}

// A loaded A vector as MMA operands: float32 values rounded to TF32, 16-bit ones as they are.
// Applied where the MMA consumes the vector, not at the load, so that a group's eight loads do
// not wait for one another's conversions: a kernel version that converted at the load had
// ptxas issue them one chunk's pair at a time (the replayed step kernel, 2026-11-26).
template <class scalar_t>
__device__ __forceinline__ uint4 mma_operand(uint4 v) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    v.x = to_tf32(__uint_as_float(v.x));
    v.y = to_tf32(__uint_as_float(v.y));
    v.z = to_tf32(__uint_as_float(v.z));
    v.w = to_tf32(__uint_as_float(v.w));
  }
  return v;
}

// x3's small parts: TF32(v - big) of each float32 value of v, big = TF32(v) (the subtraction is
// exact).
__device__ __forceinline__ uint4 tf32_remainder(uint4 v, uint4 big) {
  return make_uint4(tf32_small(__uint_as_float(v.x), big.x), tf32_small(__uint_as_float(v.y), big.y),
                    tf32_small(__uint_as_float(v.z), big.z), tf32_small(__uint_as_float(v.w), big.w));
}

// The block's GEMM: warp w takes m16 tile w % mt of the block's rows and K-group w / mt (a
// contiguous run of chunks), and writes its partial sums to red[(kgroup·16·mt + row) · red_ld
// + column]. a_row(r) gives block row r's A row (nullptr: a zero row; the rows that exist are a
// prefix of the block's rows). kNT is the largest tile count of the kernel; g.NT the actual one.
// kWGlobal (one tile only): ws is the block's packed W slice in global memory, and each chunk's
// B fragment is loaded with its A vectors (same round trip) instead of from shared memory.
// kX3 (float32 without TF32): the slice holds a big and a small vector per fragment, and each
// MMA becomes three (the top of the file).
template <class scalar_t, int kNT, bool kWGlobal, bool kX3, class RowFn>
__device__ __forceinline__ void block_gemm(const StepGeometry& g, int mt, const uint4* ws, const RowFn& a_row,
                                           float* red) {
  static_assert(!kX3 || std::is_same_v<scalar_t, float>, "x3 splits float32");
  constexpr int kParts = kX3 ? 2 : 1;  // W vectors per fragment
  constexpr int E = 16 / static_cast<int>(sizeof(scalar_t));
  constexpr int KC = 4 * E;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  const int kgroups = kWarps / mt, mt_w = warp % mt, kg = warp / mt;
  const int cpw = (g.nchunks + kgroups - 1) / kgroups;
  const int c_begin = kg * cpw, c_end = min(g.nchunks, c_begin + cpw);
  const scalar_t* r0 = a_row(mt_w * 16 + gq);
  const scalar_t* r1 = a_row(mt_w * 16 + gq + 8);
  // Whether the warp's m16 tile has any row (valid rows are a prefix, so its first row says):
  // uniform across the warp, as mma.sync needs every lane.
  const bool tile_has_rows = a_row(mt_w * 16) != nullptr;
  // Two accumulator sets (the chunk's first and second MMA): two independent MMA chains.
  float acc[2][kNT][4];
#pragma unroll
  for (int q = 0; q < 2; ++q)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) acc[q][nt][0] = acc[q][nt][1] = acc[q][nt][2] = acc[q][nt][3] = 0.f;
  if (tile_has_rows) {
    static_assert(!kWGlobal || kNT == 1, "W from global memory: one n8 tile");
    constexpr int kGroup = 4;  // chunks whose A loads are in flight together (8: register spills)
#pragma unroll 1
    for (int c0 = c_begin; c0 < c_end; c0 += kGroup) {
      uint4 lo[kGroup], hi[kGroup], wg[kWGlobal ? kGroup * kParts : 1];
#pragma unroll
      for (int e = 0; e < kGroup; ++e) {
        const int k = (c0 + e) * KC + tq * E;
        const bool in = c0 + e < c_end;
        lo[e] = load_a(in ? r0 : nullptr, k, g.K);
        hi[e] = load_a(in ? r1 : nullptr, k, g.K);
        if constexpr (kWGlobal) {
#pragma unroll
          for (int q = 0; q < kParts; ++q) {
            wg[e * kParts + q] = in ? __ldg(ws + ((c0 + e) * kParts + q) * 32 + lane) : make_uint4(0u, 0u, 0u, 0u);
          }
        }
      }
#pragma unroll
      for (int e = 0; e < kGroup; ++e) {
        if (c0 + e < c_end) {
          const uint4* wc = ws + (c0 + e) * g.NT * kParts * 32 + lane;
          if constexpr (kX3) {
            const uint4 lb = mma_operand<scalar_t>(lo[e]), hb = mma_operand<scalar_t>(hi[e]);
            const uint4 ls = tf32_remainder(lo[e], lb), hs = tf32_remainder(hi[e], hb);
            const uint32_t a1[4] = {lb.x, hb.x, lb.y, hb.y}, a1s[4] = {ls.x, hs.x, ls.y, hs.y};
            const uint32_t a2[4] = {lb.z, hb.z, lb.w, hb.w}, a2s[4] = {ls.z, hs.z, ls.w, hs.w};
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              if (nt < g.NT) {
                const uint4 b = kWGlobal ? wg[kWGlobal ? e * kParts : 0] : wc[nt * kParts * 32];
                const uint4 bs = kWGlobal ? wg[kWGlobal ? e * kParts + 1 : 0] : wc[(nt * kParts + 1) * 32];
                // big·big into acc[0]; the small terms into acc[1] (added to acc[0] below).
                MmaInst<scalar_t>::run(acc[0][nt], a1, b.x, b.y);
                MmaInst<scalar_t>::run(acc[0][nt], a2, b.z, b.w);
                MmaInst<scalar_t>::run(acc[1][nt], a1s, b.x, b.y);
                MmaInst<scalar_t>::run(acc[1][nt], a2s, b.z, b.w);
                MmaInst<scalar_t>::run(acc[1][nt], a1, bs.x, bs.y);
                MmaInst<scalar_t>::run(acc[1][nt], a2, bs.z, bs.w);
              }
            }
          } else {
            const uint4 l = mma_operand<scalar_t>(lo[e]), h = mma_operand<scalar_t>(hi[e]);
            const uint32_t a1[4] = {l.x, h.x, l.y, h.y};
            const uint32_t a2[4] = {l.z, h.z, l.w, h.w};
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              if (nt < g.NT) {
                const uint4 b = kWGlobal ? wg[kWGlobal ? e : 0] : wc[nt * 32];
                MmaInst<scalar_t>::run(acc[0][nt], a1, b.x, b.y);
                MmaInst<scalar_t>::run(acc[1][nt], a2, b.z, b.w);
              }
            }
          }
        }
      }
    }
  }
  float* rr = red + ((kg * mt + mt_w) * 16 + gq) * g.red_ld + 2 * tq;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    if (nt < g.NT) {
      *reinterpret_cast<float2*>(rr + nt * 8) = make_float2(acc[0][nt][0] + acc[1][nt][0], acc[0][nt][1] + acc[1][nt][1]);
      *reinterpret_cast<float2*>(rr + 8 * g.red_ld + nt * 8) =
          make_float2(acc[0][nt][2] + acc[1][nt][2], acc[0][nt][3] + acc[1][nt][3]);
    }
  }
}

// Sum of the K-groups' partial sums of block row r, column col, in a fixed order.
__device__ __forceinline__ float sum_partials(const float* red, const StepGeometry& g, int mt, int r, int col) {
  const int kgroups = kWarps / mt;
  const int stride = 16 * mt * g.red_ld;
  const float* p = red + r * g.red_ld + col;
  float s = 0.f;
  for (int q = 0; q < kgroups; ++q) s += p[q * stride];
  return s;
}

// Epilogue item p of this thread: block row r, unit u (global j); valid when the row exists in
// this step and j < H.
struct Item {
  int r, u, j;
  bool valid;
};

__device__ __forceinline__ Item make_item(const StepGeometry& g, int rows, int p) {
  const int i = threadIdx.x + p * kThreads;
  Item it;
  it.r = i / g.U;
  it.u = i - it.r * g.U;
  it.j = blockIdx.x * g.U + it.u;
  it.valid = it.r < rows && it.j < g.H;
  return it;
}

// After the wait: each item's value carried in `buf` [B, H] (c forward, dL/dc backward) by the
// step before, through L2, for rows < n_carried; the initial value `init` [B, H] (c0,
// grad_c_n) for the rows that have no such step.
template <class acc_t, class scalar_t>
__device__ __forceinline__ void load_carried(const Item (&items)[kMaxItems], int row0, int64_t H, int n_carried,
                                             const acc_t* buf, const scalar_t* init, acc_t (&out)[kMaxItems]) {
#pragma unroll
  for (int p = 0; p < kMaxItems; ++p) {
    const Item& it = items[p];
    if (it.valid) {
      const int64_t b = row0 + it.r;
      out[p] = b < n_carried ? __ldcg(buf + b * H + it.j) : static_cast<acc_t>(init[b * H + it.j]);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------

// W_hh packed for block_gemm: vector ((ub·nchunks + c)·NT + nt)·32 + lane holds, for lane
// (g, t), the E values B[k][n] at k = c·KC + t·E ... + E-1 and column n = nt·8 + g of unit block
// ub, where forward B[k][n] = W_hh[gate·H + ub·U + u][k] (n = gate·U + u) and backward
// B[k][n] = W_hh[k][ub·U + n] (n < U); zero outside W_hh. float32 is stored as TF32 bits; kX3
// (float32 without TF32): two vectors per fragment, ((... + nt)·2 + part)·32 + lane, part 0 the
// TF32 values, part 1 the TF32 values of the remainders.
template <class scalar_t, bool kBackward, bool kX3>
__global__ void __launch_bounds__(kThreads) pack_weights_kernel(const scalar_t* __restrict__ w_hh,  // [G, H]
                                                                uint4* __restrict__ out,  // [unit blocks · wvec]
                                                                StepGeometry g, int64_t total) {
  constexpr int E = 16 / static_cast<int>(sizeof(scalar_t));
  constexpr int KC = 4 * E;
  const int64_t H = g.H;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int lane = static_cast<int>(v & 31);
    int64_t rest = v >> 5;
    const int part = kX3 ? static_cast<int>(rest & 1) : 0;
    if constexpr (kX3) rest >>= 1;
    const int nt = static_cast<int>(rest % g.NT);
    rest /= g.NT;
    const int c = static_cast<int>(rest % g.nchunks);
    const int64_t ub = rest / g.nchunks;
    const int n = nt * 8 + (lane >> 2);
    const int64_t k0 = static_cast<int64_t>(c) * KC + (lane & 3) * E;
    union {
      uint4 v4;
      scalar_t s[E];
      uint32_t u[4];
    } pk;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t k = k0 + e;
      scalar_t val = static_cast<scalar_t>(0.0f);
      if constexpr (kBackward) {
        const int64_t j = ub * g.U + n;
        if (n < g.U && j < H && k < 4 * H) val = w_hh[k * H + j];
      } else {
        const int gate = n / g.U;
        const int64_t j = ub * g.U + (n - gate * g.U);
        if (j < H && k < H) val = w_hh[(gate * H + j) * H + k];
      }
      pk.s[e] = val;
    }
    if constexpr (std::is_same_v<scalar_t, float>) {
#pragma unroll
      for (int e = 0; e < 4; ++e) pk.u[e] = tf32_part(__uint_as_float(pk.u[e]), part);
    }
    out[v] = pk.v4;
  }
}

// The four gate values of a unit into its row of a [rows, G] tensor (i, f, g, o at stride H).
template <class scalar_t, class acc_t>
__device__ __forceinline__ void store_gates(scalar_t* row, int64_t H, const LstmGates<acc_t>& v) {
  row[0] = static_cast<scalar_t>(v.i);
  row[H] = static_cast<scalar_t>(v.f);
  row[2 * H] = static_cast<scalar_t>(v.g);
  row[3 * H] = static_cast<scalar_t>(v.o);
}

// One forward time step (see the top of the file): the geometry, the packed W and the tiles
// from `launch` (kernel parameters), the rest from `a`.
template <class scalar_t, bool kTraining, bool kX3>
__device__ __forceinline__ void forward_step(const FwdStepArgs<scalar_t>& launch, const FwdStepArgs<scalar_t>& a) {
  using acc_t = at::opmath_type<scalar_t>;
  const StepGeometry& g = launch.g;
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* ws = reinterpret_cast<uint4*>(smem);                                  // [wvec] packed W slice
  float* red = reinterpret_cast<float*>(smem + static_cast<size_t>(g.wvec) * 16);  // [KG][16·mt][red_ld]
  const int64_t H = g.H, G = 4 * H;
  const int row0 = blockIdx.y * 16 * launch.mt;
  const int rows = min(16 * launch.mt, launch.bt - row0);

  // 1. What does not depend on the previous step: the W slice, pre and the bias.
  copy_async(ws, launch.w + static_cast<int64_t>(blockIdx.x) * g.wvec, g.wvec);
  Item items[kMaxItems];
  acc_t pre_r[kMaxItems][4];
#pragma unroll
  for (int p = 0; p < kMaxItems; ++p) {
    items[p] = make_item(g, rows, p);
    const Item& it = items[p];
    if (it.valid) {
      const acc_t* pr = a.pre + static_cast<int64_t>(row0 + it.r) * G + it.j;
#pragma unroll
      for (int q = 0; q < 4; ++q) pre_r[p][q] = pr[q * H] + bias_sum(a.b_ih, a.b_hh, q * H + it.j);
    }
  }

  // 2. The previous step is complete (and visible); let the next step's kernel start.
  pdl_wait();
  pdl_launch_dependents();
  acc_t c_prev[kMaxItems];
  load_carried(items, row0, H, a.n_prev, a.cbuf, a.c0, c_prev);

  // 3. Gate pre-activations of the block's rows and units.
  wait_copies();
  block_gemm<scalar_t, kMaxNT, false, kX3>(g, launch.mt, ws, [&](int r) -> const scalar_t* {
    const int b = row0 + r;
    if (r >= rows) return nullptr;
    return b < a.n_prev ? a.h_prev + b * H : a.h0 + b * H;
  }, red);
  __syncthreads();

  // 4. Gate math and outputs.
#pragma unroll
  for (int p = 0; p < kMaxItems; ++p) {
    const Item& it = items[p];
    if (!it.valid) continue;
    acc_t pq[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) pq[q] = pre_r[p][q] + sum_partials(red, g, launch.mt, it.r, q * g.U + it.u);
    LstmGates<acc_t> act;
    acc_t c, m;
    lstm_cell_forward<CudaMath>(LstmGates<acc_t>{pq[0], pq[1], pq[2], pq[3]}, c_prev[p], act, c, m);
    const int64_t b = row0 + it.r;
    const scalar_t h = static_cast<scalar_t>(m);
    a.cbuf[b * H + it.j] = c;
    a.y[b * H + it.j] = h;
    if (b >= a.n_next) a.h_n[b * H + it.j] = h;
    if constexpr (kTraining) {
      store_gates(a.gates + b * G + it.j, H, act);
      a.cells[b * H + it.j] = static_cast<scalar_t>(c);
    }
  }
}

// One backward time step (see the top of the file), its arguments split as forward_step's.
// kWGlobal: the W slice stays in global memory (StepGeometry::w_global).
template <class scalar_t, bool kWGlobal, bool kX3>
__device__ __forceinline__ void backward_step(const BwdStepArgs<scalar_t>& launch, const BwdStepArgs<scalar_t>& a) {
  using acc_t = at::opmath_type<scalar_t>;
  const StepGeometry& g = launch.g;
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* ws = reinterpret_cast<uint4*>(smem);
  float* red = reinterpret_cast<float*>(smem + (kWGlobal ? 0 : static_cast<size_t>(g.wvec) * 16));
  const uint4* w_slice = launch.w + static_cast<int64_t>(blockIdx.x) * g.wvec;
  const int64_t H = g.H, G = 4 * H;
  const int row0 = blockIdx.y * 16 * launch.mt;
  const int rows = min(16 * launch.mt, launch.bt - row0);

  // 1. What does not depend on the previous (backward) step.
  if constexpr (!kWGlobal) copy_async(ws, w_slice, g.wvec);
  Item items[kMaxItems];
  acc_t act_r[kMaxItems][4], c_r[kMaxItems], cp_r[kMaxItems], dh_r[kMaxItems];
  scalar_t hp_r[kMaxItems];
#pragma unroll
  for (int p = 0; p < kMaxItems; ++p) {
    items[p] = make_item(g, rows, p);
    const Item& it = items[p];
    if (it.valid) {
      const int64_t b = row0 + it.r;
      const scalar_t* gr = a.gates + b * G + it.j;
#pragma unroll
      for (int q = 0; q < 4; ++q) act_r[p][q] = static_cast<acc_t>(gr[q * H]);
      c_r[p] = static_cast<acc_t>(a.cells[b * H + it.j]);
      const bool cont = b < a.n_prev;
      cp_r[p] = static_cast<acc_t>(cont ? a.prev_cells[b * H + it.j] : a.c0[b * H + it.j]);
      hp_r[p] = cont ? a.prev_y[b * H + it.j] : a.h0[b * H + it.j];
      dh_r[p] = static_cast<acc_t>(a.grad_y[b * H + it.j]);
      if (b >= a.n_succ) dh_r[p] += static_cast<acc_t>(a.grad_h_n[b * H + it.j]);
    }
  }

  // 2. The previous backward step is complete (and visible); let the next one start.
  pdl_wait();
  pdl_launch_dependents();
  acc_t dc_r[kMaxItems];
  load_carried(items, row0, H, a.n_succ, a.dcbuf, a.grad_c_n, dc_r);

  // 3. dh of the rows that continue into the successor step: dG_succ · W_hh[:, own units].
  const bool gemm = row0 < a.n_succ;
  if constexpr (!kWGlobal) wait_copies();
  if (gemm) {
    block_gemm<scalar_t, 1, kWGlobal, kX3>(g, launch.mt, kWGlobal ? w_slice : ws, [&](int r) -> const scalar_t* {
      const int b = row0 + r;
      return b < a.n_succ ? a.dG_succ + b * G : nullptr;
    }, red);
  }
  __syncthreads();

  // 4. Gate backward and outputs.
#pragma unroll
  for (int p = 0; p < kMaxItems; ++p) {
    const Item& it = items[p];
    if (!it.valid) continue;
    const int64_t b = row0 + it.r;
    const acc_t dh = dh_r[p] + (b < a.n_succ ? sum_partials(red, g, launch.mt, it.r, it.u) : acc_t(0));
    LstmGates<acc_t> d;
    acc_t dc_prev, m;
    lstm_cell_backward<CudaMath>(LstmGates<acc_t>{act_r[p][0], act_r[p][1], act_r[p][2], act_r[p][3]}, c_r[p],
                                 cp_r[p], dh, dc_r[p], d, dc_prev, m);
    a.dcbuf[b * H + it.j] = dc_prev;
    store_gates(a.dG + b * G + it.j, H, d);
    a.hprev[b * H + it.j] = hp_r[p];
  }
}

template <class scalar_t, bool kTraining, bool kX3>
__global__ void __launch_bounds__(kThreads, 2) lstm_fused_forward_step_kernel(const __grid_constant__ FwdStepArgs<scalar_t> a) {
  forward_step<scalar_t, kTraining, kX3>(a, a);
}

template <class scalar_t, bool kWGlobal, bool kX3>
__global__ void __launch_bounds__(kThreads, 2) lstm_fused_backward_step_kernel(const __grid_constant__ BwdStepArgs<scalar_t> a) {
  backward_step<scalar_t, kWGlobal, kX3>(a, a);
}

// The steps replayed from kept CUDA graphs (replayed_steps.cuh): a captured launch's arguments
// are fixed, so the call's pointers come from kept device memory. `base` holds them as a step's
// arguments for time 0 (pre, y, gates, cells, dG, ... at row 0; the state and initial-state
// pointers as they are); the fixed launch arguments (geometry, packed W, bt = B, mt) are the
// kernel's; the forward's h_prev comes from y, the backward's prev_cells / prev_y hold cells / y.
// The call has equal batch sizes, so time t's rows start at t·B.
template <class Args>
struct ReplayedCall {
  Args base;
  int64_t T;
  int64_t step;  // the processing step the next chunk starts at
  bool reverse;  // the layer's direction
};

// Processing step `step` of a replayed forward: time t = step (T - 1 - step when reverse); it
// continues from the step before in processing order and hands on to the one after.
template <class scalar_t>
__device__ __forceinline__ FwdStepArgs<scalar_t> replayed_forward_args(const FwdStepArgs<scalar_t>& fixed,
                                                                       const ReplayedCall<FwdStepArgs<scalar_t>>& c,
                                                                       int64_t step) {
  const int64_t B = fixed.bt, H = fixed.g.H, G = 4 * H;
  const ReplayedTimes times = replayed_forward_times(step, c.T, c.reverse);
  const int64_t t = times.t, prev_t = times.prev_t;
  FwdStepArgs<scalar_t> a = fixed;
  a.n_prev = times.has_prev ? fixed.bt : 0;
  a.n_next = step + 1 < c.T ? fixed.bt : 0;
  a.pre = c.base.pre + t * B * G;
  a.b_ih = c.base.b_ih;
  a.b_hh = c.base.b_hh;
  a.h_prev = times.has_prev ? c.base.y + prev_t * B * H : nullptr;
  a.h0 = c.base.h0;
  a.c0 = c.base.c0;
  a.cbuf = c.base.cbuf;
  a.y = c.base.y + t * B * H;
  a.gates = c.base.gates != nullptr ? c.base.gates + t * B * G : nullptr;
  a.cells = c.base.cells != nullptr ? c.base.cells + t * B * H : nullptr;
  a.h_n = c.base.h_n;
  return a;
}

// Processing step `step` of a replayed backward (the forward's order reversed): time t = T - 1 -
// step (step when reverse); its successor is the backward step before it, its predecessor the
// forward step before it.
template <class scalar_t>
__device__ __forceinline__ BwdStepArgs<scalar_t> replayed_backward_args(const BwdStepArgs<scalar_t>& fixed,
                                                                        const ReplayedCall<BwdStepArgs<scalar_t>>& c,
                                                                        int64_t step) {
  const int64_t B = fixed.bt, H = fixed.g.H, G = 4 * H;
  const ReplayedTimes times = replayed_backward_times(step, c.T, c.reverse);
  const int64_t t = times.t, prev_t = times.prev_t;
  const bool has_prev = times.has_prev;
  const int64_t succ_t = c.reverse ? t - 1 : t + 1;
  BwdStepArgs<scalar_t> a = fixed;
  a.n_succ = step > 0 ? fixed.bt : 0;
  a.n_prev = has_prev ? fixed.bt : 0;
  a.dG_succ = step > 0 ? c.base.dG + succ_t * B * G : nullptr;
  a.grad_y = c.base.grad_y + t * B * H;
  a.grad_h_n = c.base.grad_h_n;
  a.grad_c_n = c.base.grad_c_n;
  a.gates = c.base.gates + t * B * G;
  a.cells = c.base.cells + t * B * H;
  a.prev_cells = has_prev ? c.base.prev_cells + prev_t * B * H : nullptr;
  a.prev_y = has_prev ? c.base.prev_y + prev_t * B * H : nullptr;
  a.h0 = c.base.h0;
  a.c0 = c.base.c0;
  a.dcbuf = c.base.dcbuf;
  a.dG = c.base.dG + t * B * G;
  a.hprev = c.base.hprev + t * B * H;
  return a;
}

// Step k of a replayed chunk. The call is read before griddepcontrol.wait: the prologue wrote
// it, and the counter moved, before the chunk's first step started (which launches without
// PDL), and every later step of the chunk starts after that one. Each thread derives the step's
// pointers itself (registers); the geometry, packed W and tiles stay kernel parameters, as in
// the plain kernel. Nsight Compute, H200, T = 32, kernels serialised: a replayed step takes
// 1-7 % longer than a plain one (float32 B = 64, H = 512: 14.4 against 13.8 µs); one thread
// staging the pointers in shared memory behind a block barrier was no faster (14.5 µs).
template <class scalar_t, bool kTraining, bool kX3>
__global__ void __launch_bounds__(kThreads, 2) lstm_fused_forward_replay_step_kernel(
    const __grid_constant__ FwdStepArgs<scalar_t> fixed, const ReplayedCall<FwdStepArgs<scalar_t>>* __restrict__ call,
    int k) {
  forward_step<scalar_t, kTraining, kX3>(fixed, replayed_forward_args(fixed, *call, call->step + k));
}

template <class scalar_t, bool kWGlobal, bool kX3>
__global__ void __launch_bounds__(kThreads, 2) lstm_fused_backward_replay_step_kernel(
    const __grid_constant__ BwdStepArgs<scalar_t> fixed, const ReplayedCall<BwdStepArgs<scalar_t>>* __restrict__ call,
    int k) {
  backward_step<scalar_t, kWGlobal, kX3>(fixed, replayed_backward_args(fixed, *call, call->step + k));
}

// ---------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------

template <class scalar_t>
constexpr bool kHasMma = kHalfType<scalar_t> || std::is_same_v<scalar_t, float>;

// Calls f(std::bool_constant<kX3>{}): kX3 for float32 without TF32 (three MMAs per product), else
// not; only float32 instantiates the x3 kernels.
template <class scalar_t, class F>
bool with_x3(bool tf32, F&& f) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (!tf32) return f(std::true_type{});
  }
  return f(std::false_type{});
}

// Whether the fused-step loop can take the call at all (lstm.cu has chosen it already), before
// any geometry.
// float32 runs with or without TF32 (kX3, the top of the file).
template <class scalar_t>
bool applies(const LstmSizes& s, const void* a_base) {
  if constexpr (!kHasMma<scalar_t>) {
    return false;
  } else {
    constexpr int E = 16 / static_cast<int>(sizeof(scalar_t));
    if (s.P > 0 || s.B < 1 || s.H < 1 || s.H % E != 0 || s.H > INT32_MAX / 4) return false;
    return reinterpret_cast<std::uintptr_t>(a_base) % 16 == 0;  // A rows: 16-byte loads
  }
}

// Units per block: the fewest of 2, 4, 8 that keep the unit blocks within one per SM (so that
// the next step's blocks fit beside them), fewer where the forward's W slice (4U rows) would not
// let two blocks share an SM; false when even U = 2 does not fit shared memory. The backward's
// slice is 8 columns whatever U (NT = 1), so there a smaller U would only multiply the blocks,
// each copying the whole slice and re-reading all of dG_succ: TF32 at H = 1024 (a 128 KiB slice)
// ran 512 blocks of U = 2 in four waves, 14-17 ms a training call at B <= 16 (docs/kernels.md).
// kX3: two W vectors per fragment (the slice doubles).
template <class scalar_t, bool kX3>
bool plan_geometry(const LstmSizes& s, bool backward, const cudaDeviceProp& prop, StepGeometry& g) {
  const int sz = static_cast<int>(sizeof(scalar_t));
  const int E = 16 / sz, KC = 4 * E;
  g.H = static_cast<int>(s.H);
  g.K = backward ? 4 * g.H : g.H;
  g.nchunks = (g.K + KC - 1) / KC;
  auto fill = [&](int U) {
    g.U = U;
    g.NT = backward ? 1 : U / 2;
    g.wvec = g.nchunks * g.NT * 32 * (kX3 ? 2 : 1);
    g.red_ld = g.NT * 8;
    while (g.red_ld % 32 != 8) g.red_ld += 8;
    g.smem = g.wvec * 16 + kWarps * 16 * g.red_ld * static_cast<int>(sizeof(float));
  };
  int U = 8;
  for (int u : {2, 4, 8}) {
    if ((g.H + u - 1) / u <= prop.multiProcessorCount) {
      U = u;
      break;
    }
  }
  fill(U);
  while (!backward && g.smem > kTwoPerSmBytes && U > 2) {
    U /= 2;
    fill(U);
  }
  // A backward slice that leaves one block per SM stays in global memory: then the next step's
  // blocks fit beside this step's and start under PDL (TF32 B = 16, H = 1024: the backward op
  // 3.56 -> 3.25 ms, the training call 7 % shorter; H200, docs/benchmarks.md).
  g.w_global = backward && g.smem > kTwoPerSmBytes;
  if (g.w_global) g.smem -= g.wvec * 16;
  return static_cast<size_t>(g.smem) <= prop.sharedMemPerBlockOptin;
}

// m16 tiles per block for bt rows: all rows in one block up to 128, else blocks of 128.
int tiles_per_block(int bt) {
  int mt = 1;
  while (mt < kMaxMT && 16 * mt < bt) mt *= 2;
  return mt;
}

// What a loop (forward or backward) sets up once per call, and its per-step launch.
struct StepLoop {
  StepGeometry g;
  at::Tensor packed;  // W_hh in pack_weights_kernel's layout, alive for the whole loop
  bool pdl = false;   // overlap the steps (sm_90+)

  // The geometry; false when the call does not fit (nothing launched).
  template <class scalar_t, bool kBackward, bool kX3>
  bool plan(const LstmSizes& s) {
    const cudaDeviceProp& prop = *at::cuda::getCurrentDeviceProperties();
    if (!plan_geometry<scalar_t, kX3>(s, kBackward, prop, g)) return false;
    pdl = pdl_supported(prop);
    return true;
  }

  int64_t packed_vectors() const { return (g.H + g.U - 1) / g.U * static_cast<int64_t>(g.wvec); }

  // W_hh packed for the geometry into `dest` (packed_vectors() 16-byte vectors), on `stream`.
  template <class scalar_t, bool kBackward, bool kX3>
  void pack(const scalar_t* w_hh, at::Tensor dest, cudaStream_t stream) {
    packed = std::move(dest);
    const int64_t total = packed_vectors();
    const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t{1} << 16);
    pack_weights_kernel<scalar_t, kBackward, kX3><<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)), kThreads, 0,
                                               stream>>>(w_hh, reinterpret_cast<uint4*>(packed.data_ptr()), g, total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  const uint4* weights() const { return reinterpret_cast<const uint4*>(packed.data_ptr()); }

  // The kernel's shared-memory limit for the geometry; once per loop, before its launches.
  template <class... Params>
  void allow_smem(void (*kernel)(Params...)) const {
    ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), g.smem);
  }

  // One step's kernel over bt rows (mt m16 tiles per block) on `stream`; with `overlap` (sm_90+)
  // it carries the PDL attribute, so that it overlaps the step launched before it.
  template <class... Params, class... Args>
  void launch(void (*kernel)(Params...), cudaStream_t stream, int bt, int mt, bool overlap, Args&&... args) const {
    launch_kernel(kernel,
                  dim3(static_cast<unsigned>((g.H + g.U - 1) / g.U), static_cast<unsigned>((bt + 16 * mt - 1) / (16 * mt))),
                  dim3(kThreads), static_cast<size_t>(g.smem), stream, pdl && overlap, std::forward<Args>(args)...);
  }
};

// What fixes a replayed fused loop's captured chunk besides the device and thread: the pass,
// dtype (float32: TF32 or x3), B, H and mode. The packed W_hh is a kept buffer that every call
// fills, so W_hh's address and values are not part of it.
template <class scalar_t, bool kX3>
std::string fused_replay_key(const char* pass, const LstmSizes& s, bool training) {
  std::string key = pass;
  key += ' ';
  key += c10::toString(c10::CppTypeToScalarType<scalar_t>::value);
  if (kX3) key += " x3";
  for (const int64_t v : {s.B, s.H, int64_t(training)}) {
    key += ' ';
    key += std::to_string(v);
  }
  return key;
}

// A fused loop's steps replayed from kept CUDA graphs (replayed_steps.cuh); false, having
// launched nothing, where the capture fails (the plain fused loop runs then). `base` holds the
// call's pointers (ReplayedCall); kernel(fixed, call, k) runs step k of a chunk, `fixed` being
// the launch arguments every step shares (the captured kernels keep it: it holds no pointer of
// the call that captured them).
template <class scalar_t, bool kBackward, bool kX3, class Args, class Kernel>
bool run_replayed(StepLoop& loop, const LstmSizes& s, bool reverse, bool training, const char* pass,
                  const scalar_t* w_hh, const Args& base, Kernel kernel, const at::Tensor& like) {
  using Call = ReplayedCall<Args>;
  ReplayedSteps replay(fused_replay_key<scalar_t, kX3>(pass, s, training), "the fused loop's");
  if (replay.capture_failed()) return false;
  const auto bytes = like.options().dtype(at::kByte);
  at::Tensor packed = replay.buffer(0, {loop.packed_vectors() * 16}, bytes);
  at::Tensor call = replay.buffer(1, {static_cast<int64_t>(sizeof(Call))}, bytes);
  auto* call_p = reinterpret_cast<Call*>(call.data_ptr());
  const cudaStream_t stream = replay.stream();
  const int B = static_cast<int>(s.B), mt = tiles_per_block(B);
  Args fixed{};
  fixed.g = loop.g;
  fixed.bt = B;
  fixed.mt = mt;
  fixed.w = reinterpret_cast<const uint4*>(packed.data_ptr());
  loop.allow_smem(kernel);
  auto step = [&](int k, cudaStream_t on) { loop.launch(kernel, on, B, mt, /*overlap=*/k > 0, fixed, call_p, k); };
  if (!replay.captured()) {
    const c10::cuda::CUDAStreamGuard on_capture_stream(replay.capture_stream());
    if (!replay.capture_chunk(&call_p->step, [&](cudaStream_t cs) {
          for (int k = 0; k < kReplaySteps; ++k) step(k, cs);
        })) {
      return false;
    }
  }
  loop.pack<scalar_t, kBackward, kX3>(w_hh, packed, stream);
  replay_store_args_kernel<<<1, 1, 0, stream>>>(call_p, Call{base, s.T, 0, reverse});
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  replay.launch_chunks(s.T / kReplaySteps);
  for (int k = 0; k < s.T % kReplaySteps; ++k) step(k, stream);
  return true;
}

template <class scalar_t, bool kTraining, bool kX3>
bool run_forward(const LstmSizes& s, bool reverse, FwdStepArgs<scalar_t> args, const scalar_t* w_hh,
                 const at::opmath_type<scalar_t>* pre, scalar_t* y, scalar_t* gates, scalar_t* cells,
                 const at::Tensor& like) {
  StepLoop loop;
  if (!loop.plan<scalar_t, false, kX3>(s)) return false;
  if (replay_applies(s)) {
    FwdStepArgs<scalar_t> base = args;
    base.pre = pre;
    base.y = y;
    base.gates = gates;
    base.cells = cells;
    if (run_replayed<scalar_t, false, kX3>(loop, s, reverse, kTraining, "fused forward", w_hh, base,
                                           &lstm_fused_forward_replay_step_kernel<scalar_t, kTraining, kX3>, like)) {
      return true;
    }
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  loop.pack<scalar_t, false, kX3>(w_hh, at::empty({loop.packed_vectors() * 16}, like.options().dtype(at::kByte)),
                                  stream);
  args.g = loop.g;
  args.w = loop.weights();
  auto kernel = &lstm_fused_forward_step_kernel<scalar_t, kTraining, kX3>;
  loop.allow_smem(kernel);
  const int64_t T = s.T, H = s.H, G = s.G;
  for (int64_t step = 0; step < T; ++step) {
    const int64_t t = reverse ? T - 1 - step : step;
    const int64_t off = s.offsets[t];
    const StepLink prev = previous_step(s, t, reverse);
    args.bt = static_cast<int>(s.batch_sizes[t]);
    args.mt = tiles_per_block(args.bt);
    args.n_prev = static_cast<int>(prev.rows);
    args.n_next = static_cast<int>(next_step(s, t, reverse).rows);
    args.pre = pre + off * G;
    args.h_prev = prev.rows > 0 ? y + prev.off * H : nullptr;
    args.y = y + off * H;
    args.gates = kTraining ? gates + off * G : nullptr;
    args.cells = kTraining ? cells + off * H : nullptr;
    // Every step after the first overlaps the one before (PDL).
    loop.launch(kernel, stream, args.bt, args.mt, step > 0, args);
  }
  return true;
}

}  // namespace

template <class scalar_t>
bool lstm_fused_forward(const LstmSizes& s, bool reverse, bool training, bool tf32,
                        const at::opmath_type<scalar_t>* pre, const scalar_t* b_ih, const scalar_t* b_hh,
                        const scalar_t* w_hh, const scalar_t* h0, const scalar_t* c0, scalar_t* y, scalar_t* gates,
                        scalar_t* cells, scalar_t* h_n, at::opmath_type<scalar_t>* c_n, const at::Tensor& like) {
  if (!applies<scalar_t>(s, h0)) return false;
  if constexpr (!kHasMma<scalar_t>) {
    return false;
  } else {
    FwdStepArgs<scalar_t> args{};
    args.b_ih = b_ih;
    args.b_hh = b_hh;
    args.h0 = h0;
    args.c0 = c0;
    args.cbuf = c_n;
    args.h_n = h_n;
    return with_x3<scalar_t>(tf32, [&](auto x3) {
      constexpr bool kX3 = decltype(x3)::value;
      return training ? run_forward<scalar_t, true, kX3>(s, reverse, args, w_hh, pre, y, gates, cells, like)
                      : run_forward<scalar_t, false, kX3>(s, reverse, args, w_hh, pre, y, gates, cells, like);
    });
  }
}

namespace {

// The backward loop's steps (replayed where replay_applies, else launched one by one); grad_h0
// is left to the caller.
template <class scalar_t, bool kX3>
bool run_backward(const LstmSizes& s, bool reverse, const scalar_t* w_hh, const scalar_t* gates,
                  const scalar_t* cells, const scalar_t* y, const scalar_t* grad_y, const scalar_t* h0,
                  const scalar_t* c0, const scalar_t* grad_h_n, const scalar_t* grad_c_n, scalar_t* dG,
                  scalar_t* hprev, at::opmath_type<scalar_t>* grad_c0, const at::Tensor& like) {
  StepLoop loop;
  if (!loop.plan<scalar_t, true, kX3>(s)) return false;
  BwdStepArgs<scalar_t> args{};
  args.grad_h_n = grad_h_n;
  args.grad_c_n = grad_c_n;
  args.h0 = h0;
  args.c0 = c0;
  args.dcbuf = grad_c0;
  BwdStepArgs<scalar_t> base = args;
  base.grad_y = grad_y;
  base.gates = gates;
  base.cells = cells;
  base.prev_cells = cells;
  base.prev_y = y;
  base.dG = dG;
  base.hprev = hprev;
  const bool w_global = loop.g.w_global;
  const bool replayed =
      replay_applies(s) &&
      run_replayed<scalar_t, true, kX3>(loop, s, reverse, /*training=*/true, "fused backward", w_hh, base,
                                        w_global ? &lstm_fused_backward_replay_step_kernel<scalar_t, true, kX3>
                                                 : &lstm_fused_backward_replay_step_kernel<scalar_t, false, kX3>,
                                        like);
  if (replayed) return true;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  loop.pack<scalar_t, true, kX3>(w_hh, at::empty({loop.packed_vectors() * 16}, like.options().dtype(at::kByte)),
                                 stream);
  args.g = loop.g;
  args.w = loop.weights();
  auto kernel = w_global ? &lstm_fused_backward_step_kernel<scalar_t, true, kX3>
                         : &lstm_fused_backward_step_kernel<scalar_t, false, kX3>;
  loop.allow_smem(kernel);
  const int64_t T = s.T, H = s.H, G = s.G;
  for (int64_t step = 0; step < T; ++step) {
    // Reverse of the forward's processing order.
    const int64_t t = reverse ? step : T - 1 - step;
    const int64_t off = s.offsets[t];
    // The step processed just before continued this step's state (its dG gives dh); the
    // forward step this one continued gives c_{t-1} and h_{t-1}.
    const StepLink succ = next_step(s, t, reverse), prev = previous_step(s, t, reverse);
    args.bt = static_cast<int>(s.batch_sizes[t]);
    args.mt = tiles_per_block(args.bt);
    args.n_succ = static_cast<int>(succ.rows);
    args.n_prev = static_cast<int>(prev.rows);
    args.dG_succ = succ.rows > 0 ? dG + succ.off * G : nullptr;
    args.grad_y = grad_y + off * H;
    args.gates = gates + off * G;
    args.cells = cells + off * H;
    args.prev_cells = prev.rows > 0 ? cells + prev.off * H : nullptr;
    args.prev_y = prev.rows > 0 ? y + prev.off * H : nullptr;
    args.dG = dG + off * G;
    args.hprev = hprev + off * H;
    loop.launch(kernel, stream, args.bt, args.mt, step > 0, args);
  }
  return true;
}

}  // namespace

template <class scalar_t>
bool lstm_fused_backward(const LstmSizes& s, bool reverse, bool tf32, const scalar_t* w_hh, const scalar_t* gates,
                         const scalar_t* cells, const scalar_t* y, const scalar_t* grad_y, const scalar_t* h0,
                         const scalar_t* c0, const scalar_t* grad_h_n, const scalar_t* grad_c_n, scalar_t* dG,
                         scalar_t* hprev, at::opmath_type<scalar_t>* grad_h0, at::opmath_type<scalar_t>* grad_c0,
                         const at::Tensor& like) {
  using acc_t = at::opmath_type<scalar_t>;
  if (!applies<scalar_t>(s, dG)) return false;
  if constexpr (!kHasMma<scalar_t>) {
    return false;
  } else {
    const bool ran = with_x3<scalar_t>(tf32, [&](auto x3) {
      return run_backward<scalar_t, decltype(x3)::value>(s, reverse, w_hh, gates, cells, y, grad_y, h0, c0, grad_h_n,
                                                         grad_c_n, dG, hprev, grad_c0, like);
    });
    if (!ran) return false;
    // grad_h0: no step consumes dL/dh_{-1}, so dG of every sequence's first step times W_hh
    // here: rows [first, bt) of step t start there (the others continue an earlier step).
    const int64_t T = s.T, H = s.H, G = s.G;
    BlasContext blas(std::is_same_v<scalar_t, float> && tf32);
    using sc_t = float;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t bt = s.batch_sizes[t];
      const int64_t first = previous_step(s, t, reverse).rows;
      if (first >= bt) continue;
      gemm<scalar_t, acc_t, sc_t>(blas, Trans::N, Trans::N, bt - first, H, G, sc_t(1), dG + (s.offsets[t] + first) * G,
                                  G, w_hh, H, sc_t(0), grad_h0 + first * H, H);
    }
    return true;
  }
}

#define SK_INSTANTIATE_FUSED(T)                                                                                    \
  template bool lstm_fused_forward<T>(const LstmSizes&, bool, bool, bool, const at::opmath_type<T>*,               \
                                      const T*, const T*, const T*, const T*, const T*, T*, T*, T*, T*,           \
                                      at::opmath_type<T>*, const at::Tensor&);                                     \
  template bool lstm_fused_backward<T>(const LstmSizes&, bool, bool, const T*, const T*, const T*, const T*,       \
                                       const T*, const T*, const T*, const T*, const T*, T*, T*, at::opmath_type<T>*, \
                                       at::opmath_type<T>*, const at::Tensor&);
SK_INSTANTIATE_FUSED(float)
SK_INSTANTIATE_FUSED(double)
SK_INSTANTIATE_FUSED(c10::Half)
SK_INSTANTIATE_FUSED(c10::BFloat16)
#undef SK_INSTANTIATE_FUSED

}  // namespace cuda
}  // namespace seqkernels
