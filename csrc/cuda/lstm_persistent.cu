// Persistent small-batch LSTM kernels: one cooperative launch runs a layer's whole time loop.
//
// Why. At small batch a time step of the cuBLAS path (csrc/cuda/lstm.cu: one recurrent GEMM
// and one pointwise kernel per step) costs ~8 µs of launches and of GEMM set-up, while the
// arithmetic of a step is a fraction of a microsecond. Here the grid stays resident for all
// T steps, W_hh stays on chip (registers or shared memory), and the blocks exchange the
// recurrent state through L2.
//
// Shape legend: T steps, N packed rows, B = batch_sizes[0], H hidden, G = 4H gate rows
// (i, f, g, o), U hidden units per block (4 or 8), Hp = nblocks * U (H padded), bt =
// batch_sizes[t]. acc_t is float for half types and scalar_t otherwise.
//
// Decomposition (forward). Block b owns units j in [b*U, b*U + U) and all four gates of them,
// so the gate math, c and h of those units stay in the block. Per step it needs all of
// h_{t-1} [bt, H] and computes
//     D[n][c] = sum_k h_{t-1}[n][k] * W_hh[row(c)][k],   c = gate*U + u, row(c) = gate*H + j
// with h_{t-1} staged in shared memory (the A operand, batch rows in m16 tiles) and its 4U
// rows of W_hh resident (the B operand): in registers as tensor-core fragments for bf16/fp16
// (mma.m16n8k16, fp32 accumulation) and for float32 with TF32 allowed (mma.m16n8k8.tf32,
// operands rounded to TF32 like cuBLAS's FAST_TF32); in shared memory for FFMA/DFMA (float32
// with TF32 off, float64: full precision; float32's direct forward kernel below multiplies on
// tensor cores instead, three TF32 MMAs per product). K is split over the 8 warps (FMA: over thread
// groups); the partial sums meet in shared memory and are added in a fixed order. Then the
// gate threads (one per (unit, batch row)) add pre = x·W_ihᵀ (one cuBLAS GEMM before the
// kernel) and the bias, apply lstm_cell.h, keep c in a register for the whole sequence,
// write y (and the saved gates/cells when training), and publish h_t.
//
// Exchange and synchronisation: one wait per step, no separate grid barrier. h_t is
// published in an "LL" (low-latency, as in NCCL) buffer: every 8-byte word holds 4 bytes of
// payload and a 4-byte flag = step + 1, written with one 64-bit store, which the memory
// model makes single-copy atomic. A consumer reads the words of h_{t-1} (16-byte vector loads
// = two atomic 64-bit accesses) and re-reads those whose flag is not yet its step: a word is
// valid exactly when it carries the expected flag, so no fence, counter or barrier is
// needed, and a step costs one store-to-load trip through L2 instead of a barrier followed by
// a load. Two buffers alternate (step s writes buffer s % 2); a block can only write step s
// after it has read every block's step s-1, which those wrote only after reading step s-2
// from the buffer being overwritten, so no word is overwritten before it was read. Flags are
// zeroed by a cudaMemsetAsync on the current stream before each launch (stale flags from an
// earlier launch could otherwise match), which a CUDA graph captures like the launch itself.
// The wait needs every block resident: the kernel is launched cooperatively
// (cudaLaunchKernelEx + cudaLaunchAttributeCooperative, capturable), after the occupancy API
// confirmed that nblocks fit; otherwise the host returns false and lstm.cu runs its cuBLAS
// loop, so a launch never deadlocks. A wait that exceeds 10 s traps instead of hanging.
//
// Backward (reverse processing order). Block b owns the same units. Phase 1: the gate
// backward of its units (lstm_cell_backward) with dh_t = dh_state + grad_y, writing
// dG[rows] (for the weight GEMMs after the loop) and h_{t-1} gathered into hprev; its slice
// of dG_t is published in the LL buffer. Phase 2 (after the same one wait): every block
// reads all of dG_t [bt, 4Hp] and forms dh_{t-1}[:, own units] = dG_t · W_hh[:, own units]
// with its W_hh columns resident (B operand), so the next phase 1 needs only its own
// results: one exchange per step. dW_hh, dW_ih, dx and dbias remain whole-sequence GEMMs in
// lstm.cu (deterministic: no atomics anywhere; every sum has a fixed order). At B <= 16 on
// tensor cores, where it was measured faster, a split variant exchanges each block's partial
// dh_{t-1} over its own gate rows instead of dG ("Backward kernel, split variant" below).
//
// Packed sequences and reverse: the step table (runs of equal batch size, at most 64) is a
// kernel argument; rows b >= bt keep their state in registers exactly as lstm.cu's hbuf/cbuf
// keep untouched rows, and a row that starts late (reverse direction) takes h0/c0.
//
// Limits (else cuBLAS): no projection; one gate item per thread, U * B <= 256 (B <= 64 with
// 4 units per block, B <= 32 with 8, which H > 4 * #SMs needs); at most 64 distinct batch
// sizes; the resident weights must fit: MMA fragments cover Hp <= 1024, the FMA path keeps W
// in shared memory (float32 H <= 1024, float64 H <= ~512); the X tile is loaded in up to 8
// column chunks per step when B * K does not fit shared memory. Whether it runs at all
// (SEQKERNELS_LSTM_BACKEND, the auto heuristic): lstm_loop.cuh. SEQKERNELS_LSTM_TRACE=1 makes
// block 0 print the mean SM cycles per step and phase (wait + gather, product, gate math,
// publication) of each launch.
//
// Code size matters: every step runs the whole loop body, and at ~60 KB of SASS per step the
// kernels were bound by instruction fetch (measured with SEQKERNELS_LSTM_TRACE on an H200:
// ~2000 cycles for a B = 1 gate phase). Hence one gate item per thread, compact reductions,
// a small gather with an out-of-line slow path, and outputs stored after the publication.
//
// Forward at B <= 16 on tensor cores: lstm_persistent_forward_direct_kernel (below) skips the
// X tile: each warp loads its A fragments straight from the LL buffer, and one barrier per step
// is left (its comment has the details; docs/kernels.md the measurements).
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
#include "seqkernels/lstm_cell.h"

namespace seqkernels {
namespace cuda {

namespace {

using u64 = unsigned long long;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBatch = 64;     // B limit of the persistent path
constexpr int kMaxSegments = 64;  // distinct batch sizes of a packed sequence
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

// Runs of equal batch size: step t in [tb[k], tb[k+1]) has bs[k] rows starting at packed row
// ob[k] + (t - tb[k]) * bs[k]. tb[count] = T.
struct SegTable {
  long long ob[kMaxSegments];
  int tb[kMaxSegments + 1];
  int bs[kMaxSegments];
  int count;
  int pad_;
};

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
};

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

// One step of the packed sequence.
struct StepInfo {
  int t, bt;
  int64_t off;  // first packed row of the step
};

__device__ __forceinline__ StepInfo step_at(const SegTable* seg, int t, int& k) {
  while (t < seg->tb[k]) --k;
  while (t >= seg->tb[k + 1]) ++k;
  const int bt = seg->bs[k];
  return {t, bt, seg->ob[k] + static_cast<int64_t>(t - seg->tb[k]) * bt};
}

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
// Forward kernel
// ---------------------------------------------------------------------------------------
template <class scalar_t, Path P, bool kTraining>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_forward_kernel(const __grid_constant__ FwdArgs<scalar_t> a) {
  using acc_t = at::opmath_type<scalar_t>;
  using Math = CudaMath;
  constexpr int kCH = gather_batch<P>();
  constexpr int kKP = P == Path::kFma ? 0 : kWarps;  // depth of red: the warps (MMA) or run time (FMA)
  constexpr int sz = sizeof(scalar_t);
  const Geometry& g = a.g;
  extern __shared__ __align__(16) unsigned char smem[];
  scalar_t* xs = reinterpret_cast<scalar_t*>(smem);  // [Bp16][ldx] h_{t-1} (chunk)
  acc_t* red = reinterpret_cast<acc_t*>(smem + g.off_red);          // [kp][Bp16][NCp] partial sums
  scalar_t* stage = reinterpret_cast<scalar_t*>(smem + g.off_stage);  // [B][U] h_t of own units
  scalar_t* ws = reinterpret_cast<scalar_t*>(smem + g.off_w);       // FMA: [nch*CK][NCp] resident W
  SegTable* seg = reinterpret_cast<SegTable*>(smem + g.off_seg);

  const int H = g.H, U = g.U, B = g.B, T = g.T;
  const int j0 = blockIdx.x * U;
  const int64_t G4 = 4 * static_cast<int64_t>(H);
  init_shared(smem, g, a.seg, seg, g.off_red);

  // Wres[k][c] = W_hh[gate * H + j0 + u][k], c = gate * U + u.
  const scalar_t* __restrict__ w_hh = a.w_hh;
  auto wf = [&](int k, int c) -> scalar_t {
    const int u = c & (U - 1), gate = c >> g.lg_u;
    if (gate >= 4 || j0 + u >= H || k >= H) return static_cast<scalar_t>(0.0f);
    return w_hh[static_cast<int64_t>(gate * H + j0 + u) * H + k];
  };
  Resident<scalar_t, P, false> res;
  res.load(wf, g, ws);

  Item items[kItems];
  acc_t c_st[kItems], bias_r[kItems][4];
  scalar_t h_st[kItems];
#pragma unroll
  for (int p = 0; p < kItems; ++p) {
    items[p] = make_item(g, p);
    const Item& it = items[p];
    c_st[p] = it.valid ? static_cast<acc_t>(a.c0[it.n * H + it.j]) : acc_t(0);
    h_st[p] = it.valid ? a.h0[it.n * H + it.j] : static_cast<scalar_t>(0.0f);
#pragma unroll
    for (int q = 0; q < 4; ++q) bias_r[p][q] = it.valid ? bias_sum(a.b_ih, a.b_hh, q * H + it.j) : acc_t(0);
  }
  __syncthreads();

  // pre of the next step, loaded one step ahead so that its latency hides behind the wait.
  acc_t pv[kItems][4];
  auto prefetch = [&](const StepInfo& st) {
#pragma unroll
    for (int p = 0; p < kItems; ++p) {
      const Item& it = items[p];
      if (it.valid && it.n < st.bt) {
        const acc_t* pr = a.pre + (st.off + it.n) * G4 + it.j;
#pragma unroll
        for (int q = 0; q < 4; ++q) pv[p][q] = pr[q * H];
      }
    }
  };
  int k_cur = a.reverse ? seg->count - 1 : 0;
  int k_nxt = k_cur;
  StepInfo cur = step_at(seg, a.reverse ? T - 1 : 0, k_cur);
  prefetch(cur);

  PhaseTrace trace;
  trace.start(a.trace);
  int bt_prev = 0;
  for (int s = 0; s < T; ++s) {
    const int bt = cur.bt;
    const int64_t off = cur.off;
    // 1. h_{t-1} into the X tile: rows [0, nll) from the LL buffer of step s-1 (flag s),
    //    rows [nll, bt) start here (step 0, or sequences that start late in reverse) from h0.
    const int nll = s > 0 ? min(bt, bt_prev) : 0;
    for (int ch = 0; ch < g.nch; ++ch) {
      if (ch > 0) {
        __syncthreads();  // the previous chunk's products are done with the tile
        trace.mark(1);
      }
      const int col0 = ch * g.CK;
      const int ncol = max(0, min(g.CK, g.Kx - col0));
      if (nll > 0 && ncol > 0) {
        ll_gather<kCH>(a.xbuf + static_cast<int64_t>((s - 1) & 1) * B * g.row_words + col0 * sz / 4, g.row_words,
                       ncol * sz / 4, nll, static_cast<unsigned>(s), smem, g.ldx * sz);
      }
      if (g.nch > 1 && ncol < g.CK) {  // a short last chunk: zero the stale columns
        const int w = g.CK - ncol;
        for (int e = threadIdx.x; e < nll * w; e += kThreads) {
          const int r = e / w;
          xs[r * g.ldx + ncol + (e - r * w)] = static_cast<scalar_t>(0.0f);
        }
      }
      if (bt > nll) {
        for (int e = threadIdx.x; e < (bt - nll) * g.CK; e += kThreads) {
          const int r = nll + e / g.CK;
          const int k = e % g.CK;
          const int kg = col0 + k;
          xs[r * g.ldx + k] = kg < H ? a.h0[r * H + kg] : static_cast<scalar_t>(0.0f);
        }
      }
      __syncthreads();
      trace.mark(0);
      // 2. Partial gate pre-activations of this chunk.
      res.gemm(g, xs, ws, ch, bt, red);
    }
    __syncthreads();
    trace.mark(1);

    // 3. Gate math of the own units; h_t to the staging row for publication. The outputs
    //    (y, gates, cells) are stored after the publication, off the critical path.
    acc_t act_r[kItems][4], c_new_r[kItems];
#pragma unroll
    for (int p = 0; p < kItems; ++p) {
      const Item& it = items[p];
      if (!it.exists || it.n >= bt) continue;
      if (it.valid) {
        const int base = it.n * g.NCp + it.u;
        acc_t pq[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          pq[q] = pv[p][q] + bias_r[p][q] + sum_partials<kKP>(red, g.kp, g.red_stride, base + q * U);
        }
        const LstmGates<acc_t> pre_g{pq[0], pq[1], pq[2], pq[3]};
        LstmGates<acc_t> act;
        acc_t c_new, m;
        lstm_cell_forward<Math>(pre_g, c_st[p], act, c_new, m);
        c_st[p] = c_new;
        const scalar_t h = static_cast<scalar_t>(m);
        h_st[p] = h;
        act_r[p][0] = act.i;
        act_r[p][1] = act.f;
        act_r[p][2] = act.g;
        act_r[p][3] = act.o;
        c_new_r[p] = c_new;
        stage[it.n * U + it.u] = h;
      } else {
        stage[it.n * U + it.u] = static_cast<scalar_t>(0.0f);
      }
    }
    if (s + 1 < T) {
      cur = step_at(seg, a.reverse ? T - 2 - s : s + 1, k_nxt);
      prefetch(cur);
    }
    __syncthreads();
    trace.mark(2);

    // 4. Publish the own slice of h_t (rows [0, bt)) with flag s + 1, then the outputs.
    if (s + 1 < T) {
      u64* dst = a.xbuf + static_cast<int64_t>(s & 1) * B * g.row_words + blockIdx.x * g.wpb;
      for (int e = threadIdx.x; e < bt * g.wpb; e += kThreads) {
        const int n = e >> g.lg_wpb, q = e & (g.wpb - 1);
        const uint32_t payload = reinterpret_cast<const uint32_t*>(stage + n * U)[q];
        ll_store(dst + static_cast<int64_t>(n) * g.row_words + q, payload, static_cast<uint32_t>(s + 1));
      }
    }
#pragma unroll
    for (int p = 0; p < kItems; ++p) {
      const Item& it = items[p];
      if (!it.valid || it.n >= bt) continue;
      const int64_t row = off + it.n;
      a.y[row * H + it.j] = h_st[p];
      if constexpr (kTraining) {
        scalar_t* gr = a.gates + row * G4 + it.j;
#pragma unroll
        for (int q = 0; q < 4; ++q) gr[q * static_cast<int64_t>(H)] = static_cast<scalar_t>(act_r[p][q]);
        a.cells[row * H + it.j] = static_cast<scalar_t>(c_new_r[p]);
      }
    }
    trace.mark(3);
    bt_prev = bt;
  }
  report_trace(trace, kTraining ? "forward (training)" : "forward (inference)", g);

#pragma unroll
  for (int p = 0; p < kItems; ++p) {
    const Item& it = items[p];
    if (it.valid) {
      a.h_n[it.n * H + it.j] = h_st[p];
      a.c_n[it.n * H + it.j] = c_st[p];
    }
  }
}

// ---------------------------------------------------------------------------------------
// Forward kernel, direct variant: tensor cores, B <= 16, Hp <= 1024
// ---------------------------------------------------------------------------------------
// Why. The general forward kernel above stages h_{t-1} in shared memory (gather, barrier),
// forms the product (barrier), applies the gates and stages h_t for publication (barrier):
// three block barriers and two shared-memory round trips on the critical path of every step.
// Here, with all batch rows in one m16 tile, each warp loads the A fragments of its own K
// slice straight from the LL buffer into registers: a warp starts its MMAs as soon as its own
// words of h_{t-1} carry the step's flag, without waiting for the rest of the block. The gate
// threads publish h_t themselves (the two units of an LL word sit on adjacent lanes, joined
// with one shuffle). One barrier per step is left, between the partial sums and
// the gate math, and the partial sums alternate between two buffers so that a warp may start
// the next step's product while slower threads still read this step's sums.
//
// Two units per LL word. The MMA reads only the TF32 bits of h (cvt.rna, as before any TF32
// product), so float32 h travels as two 19-bit TF32 values per LL word (bits 0-18 and 19-37; the
// flag in bits 38-63), like the 16-bit types' pairs: half the bytes every block reads per step
// that 4-byte payloads take. The flag is 1 + step mod (2^26 - 1): never 0 (the memset's value),
// and a stale word (two steps old, or zeroed) never matches. Results are bitwise those of h
// exchanged whole (the same rounding); y, h_n and c are the owner's full-precision values.
//
// float32 with TF32 off (Path::kTf32x3). h_{t-1} and W_hh are each split into a TF32 value
// (big) and the TF32 value of the remainder (small), and a product is big·big + big·small +
// small·big, three MMAs, each term in an accumulator of its own, added at the end: the dropped
// small·small term and the splits' remainders are ~2^-22 of each product, float32's order
// (cuBLAS's 3xTF32 and CUTLASS's "fast accurate" FP32 GEMMs do the same). h travels in the TF32
// pairs' layout, two units per LL word, 4 bytes a unit: each unit as its float32 bits rounded to
// 22 significant bits (ties away) less the two low bits, 30 bits (x3_bits; NaN and inf keep
// their meaning), and a 4-bit flag in bits 60-63, 1 + step mod 15 (the flag only has to tell step
// s - 1 from a zeroed word and from step s - 3, what the buffer held before). The consumer splits
// each value exactly: big = its top 11 significant bits (a mask), small = the rest (one FADD,
// exact: 11 bits are left). So a k-step of 8 words is 16 units, as for TF32, and W_hh has four
// fragments per k-step: big and small for each of its two MMAs. At B <= 8 (one batch row per
// lane) the A tile's unused rows g + 8 carry the small values of rows g, so two MMAs per half
// k-step give all four products. (Until 2026-11-26 an LL word carried a unit pair's big or its
// small TF32 values: 8 bytes a unit, twice the exchange; beyond Hp = 512 at B > 8 a lane's two
// rows then ran in two passes, for want of registers.)
//
// One L2 sector per block slice. With 4 units per block a block's slice of a row is two words,
// 16 bytes; two blocks writing halves of one 32-byte sector while every block polls it cost up
// to a quarter of the step time (H200: bf16 B = 8, H = 512 0.525 against 0.696 ms per graph
// replay of a 256-step call), so there each slice is padded to a sector of its own
// (Geometry::pad_shift).
//
// Fragment order. K is permuted consistently in A and B (a sum over k does not care): within
// a k-step of 8 LL words, lane t (= lane % 4) takes words 2t and 2t+1 of its row, one 16-byte
// load, as its a0 and a2 (row g) or a1 and a3 (row g + 8):
//   m16n8k16: word 2t = elements 4t, 4t+1 stand for k = 2t, 2t+1; word 2t+1 = elements 4t+2,
//             4t+3 for k = 2t+8, 2t+9; so b0 = W[4t, 4t+1][col], b1 = W[4t+2, 4t+3][col];
//   m16n8k8 (TF32), two MMAs per k-step: word 2t = elements 4t, 4t+1 stand for k = t, t+4 of
//             the first, word 2t+1 = elements 4t+2, 4t+3 for k = t, t+4 of the second;
//             so b0 = W[4t][col], b1 = W[4t+1][col], then W[4t+2][col], W[4t+3][col].
// Limits (else the general kernel): bf16/fp16 or float32, B <= 16, at most 8 k-steps per warp
// (Hp <= 1024).
//
// Resident weights. TF32 fragments take twice the registers of 16-bit ones: at 8 k-steps per
// warp (Hp > 512) all of them (128 registers) would not fit beside the A fragments, so the first
// KREG k-steps keep theirs in registers and the rest are read from shared memory every step,
// laid out [warp][k-step][mma][n-tile][lane] (a lane's 8 bytes: one conflict-free 256-byte row
// per warp and tile). Measured on an H200 (fp32 B = 1 / 16, H = 1024, an earlier version with
// 4-byte payloads): half or all of W_hh read from shared memory every step took the same time.
constexpr int kDirectKS = 8;  // k-steps of 8 LL words per warp
// Resident W_hh fragments per k-step and n8 tile (pairs of 32-bit registers): 16-bit 1 (one
// MMA), TF32 2 (two MMAs), x3 4 (W's big and small parts for each of the two).
constexpr int direct_frags(Path P) {
  return P == Path::kMma16 || P == Path::kHalfScaled ? 1 : P == Path::kTf32 ? 2 : 4;
}
constexpr int kTf32PairFlagShift = 38;
constexpr unsigned kTf32PairFlagPeriod = (1u << 26) - 1;
__device__ __forceinline__ unsigned tf32_pair_flag(int step) {
  return 1u + static_cast<unsigned>(step) % kTf32PairFlagPeriod;
}
constexpr int kX3FlagShift = 60;
constexpr unsigned kX3FlagPeriod = 15;
__device__ __forceinline__ unsigned x3_flag(int step) { return 1u + static_cast<unsigned>(step) % kX3FlagPeriod; }
// x3's 30 bits of float32 h: its bits rounded to 22 significant bits (ties away from zero, as
// cvt.rna), without the two low bits. A NaN becomes the quiet NaN; an overflow in the rounding
// gives inf, as it should.
__device__ __forceinline__ uint32_t x3_bits(float h) {
  const uint32_t b = __float_as_uint(h), mag = b & 0x7fffffffu;
  const uint32_t r = mag > 0x7f800000u ? 0x7fc00000u : (mag + 2u) & ~3u;
  return ((b & 0x80000000u) | r) >> 2;
}
// An x3 word's first (bits 0-29) and second (30-59) value as float32 bits.
__device__ __forceinline__ uint32_t x3_first(u64 w) { return static_cast<uint32_t>(w << 2); }
__device__ __forceinline__ uint32_t x3_second(u64 w) { return static_cast<uint32_t>(w >> 28) & ~3u; }
// The exact split of such a value (22 significant bits) into two TF32 values, as bits.
__device__ __forceinline__ uint32_t x3_big(uint32_t v) { return v & 0xffffe000u; }
__device__ __forceinline__ uint32_t x3_small(uint32_t v) {
  return __float_as_uint(__fsub_rn(__uint_as_float(v), __uint_as_float(x3_big(v))));
}
// A TF32 pair word's first (bits 0-18) and second (19-37) value, as TF32 bits for the MMA.
__device__ __forceinline__ uint32_t tf32_pair_first(u64 w) { return static_cast<uint32_t>(w << 13) & 0xffffe000u; }
__device__ __forceinline__ uint32_t tf32_pair_second(u64 w) { return static_cast<uint32_t>(w >> 6) & 0xffffe000u; }
// Partial sums: row stride 40 floats (4U <= 32 columns; 40 keeps the gate threads' reads of
// four rows x eight units on distinct banks) and compile-time strides, so that the 32 loads of
// a gate item are one base register plus immediates (code size: see the top of the file).
constexpr int kDirectRow = 40;
constexpr int kDirectWarp = 16 * kDirectRow;
// How the direct forward kernel polls h_{t-1} (its last template argument, kBranchFreeRows):
//   1: row gq only (B <= 8), branch-free: loads predicated on the pending bits, flags checked
//      into a bit mask (~5 instructions per word instead of a branch and ~13);
//   2: rows gq and gq + 8 (8 < B <= 16), branch-free;
//   0: rows gq and gq + 8, a branch per word (the per-word loop): 16-bit exchanges (16-bit types;
//      float32 on scaled fp16 operands, by the same rule unmeasured) at H > 768 from B = 6, where
//      the branch-free polling's L2 traffic (112 or 128 blocks polling every word) costs more
//      than it saves (bf16 B = 8, H = 1024: 7-8 % slower; Nsight Compute: 56 % more L2 read
//      sectors).
// A/Bs on an H200 (2026-11-26, T = 256 infer, CUDA-graph replays; docs/kernels.md): branch-free
// 11-32 % faster at H <= 512 for B = 5-16, 3-20 % for 16-bit at H = 640 and 768, 0-9 % for TF32
// at H = 1024.
constexpr int direct_branch_free_rows(Path P, int64_t H, int64_t B) {
  return (P == Path::kMma16 || P == Path::kHalfScaled) && H > 768 && B > 5 ? 0 : B <= 8 ? 1 : 2;
}

// The payloads of the LL pair (words 2t, 2t+1 of a k-step) of an h0 row: step 0, and rows that
// start late in the reverse direction. Two elements per word: 16-bit values, TF32 pairs, x3_bits
// pairs (float) or (kHalfScaled) fp16 values of the row times its scale. Cold path, out of line.
template <class scalar_t, Path P>
__device__ __noinline__ ulonglong2 h0_pair(const scalar_t* h0_row, int H, int word, float scale) {
  constexpr bool kX3 = P == Path::kTf32x3;
  u64 p[2];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    u64 bits = 0;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int k = (word + w) * 2 + e;
      if (k < H) {
        const scalar_t v = h0_row[k];
        if constexpr (kX3) {
          bits |= static_cast<u64>(x3_bits(static_cast<float>(v))) << (30 * e);
        } else if constexpr (P == Path::kHalfScaled) {
          bits |= static_cast<u64>(c10::Half(static_cast<float>(v) * scale).x) << (16 * e);
        } else if constexpr (sizeof(scalar_t) == 4) {
          bits |= static_cast<u64>(to_tf32(static_cast<float>(v)) >> 13) << (19 * e);
        } else {
          bits |= static_cast<u64>(v.x) << (16 * e);
        }
      }
    }
    p[w] = bits;
  }
  return make_ulonglong2(p[0], p[1]);
}

// Rows [nll, bt) of the A fragments from h0 (step 0, and rows that start late in reverse):
// the payloads of this lane's pairs, as the LL buffer would hold them (kHalfScaled: each row times
// row_scale[row]). Cold path (its loads are out of line in h0_pair; the arrays stay in registers,
// hence inline here).
template <class scalar_t, Path P, int KPC>
__device__ __forceinline__ void h0_fragments(const scalar_t* h0, int H, int row_words, int word0, int nll, int bt,
                                          const float* row_scale, u64 (&lo)[2][KPC], u64 (&hi)[2][KPC]) {
  const int gq = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = gq + 8 * r;
    if (row < nll || row >= bt) continue;
#pragma unroll
    for (int f = 0; f < KPC; ++f) {
      const int word = word0 + f * 8;
      if (word < row_words) {
        const float scale = P == Path::kHalfScaled ? row_scale[row] : 1.0f;
        const ulonglong2 v = h0_pair<scalar_t, P>(h0 + static_cast<int64_t>(row) * H, H, word, scale);
        lo[r][f] = v.x;
        hi[r][f] = v.y;
      }
    }
  }
}

// KPC: k-steps per warp (compile time, so that the hot loop carries no per-k-step predicate);
// lanes whose k-steps pass the end of the row (row_words) load fewer. KREG: the first KREG of
// them keep their W_hh fragments in registers, the rest in shared memory (KREG < KPC: TF32 at
// Hp > 512 and x3, see above). U4: 4 units per block (2 n8 tiles of gate columns; else 8 and
// 4); each block's slice is then padded to a sector (Geometry::pad_shift, at compile time so
// that the k-steps' loads keep immediate offsets). kBranchFreeRows: how h_{t-1} is polled
// (above; step 1 below).
template <class scalar_t, Path P, bool kTraining, int KPC, int KREG, int U4, int kBranchFreeRows>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_forward_direct_kernel(const __grid_constant__ FwdArgs<scalar_t> a) {
  using acc_t = at::opmath_type<scalar_t>;
  using Math = CudaMath;
  // n8 tiles of the 4U gate columns, at compile time: U = 4 (U4 = 1) or 8.
  // (A run-time tile count predicated every MMA: a WARPSYNC before each, and copies of the A
  // fragments per predicate, ~45 % of the product's instructions.)
  constexpr int kNT = U4 ? 2 : 4;
  constexpr bool kX3 = P == Path::kTf32x3;                // float32, TF32 off: x3_bits pairs
  constexpr bool kTf32Pairs = P == Path::kTf32 || kX3;  // float h, two units per word
  constexpr bool kHalf = P == Path::kHalfScaled;        // float32, TF32: fp16 words, scaled W_hh and h0
  static_assert(kTf32Pairs || kHalf || sizeof(scalar_t) == 2, "direct kernel: 16-bit types or float32");
  static_assert(!(kTf32Pairs || kHalf) || std::is_same_v<scalar_t, float>, "direct kernel: float32 paths");
  using MmaT = std::conditional_t<kHalf, c10::Half, scalar_t>;  // the MMA's operand type
  // MMAs per k-step of 8 LL words (16 elements): 16-bit 1; TF32 2; x3 6 (4 with kStacked). The
  // resident fragments per k-step: [kFrag][2] registers (x3: W's big and small parts of each
  // of the two TF32 MMAs, m = 2 * mma + part).
  constexpr int kFrag = direct_frags(P);
  constexpr int PAD = U4;  // Geometry::pad_shift
  // x3 with one batch row per lane: the small values ride in the A tile's rows g + 8 (step 2).
  constexpr bool kStacked = kX3 && kBranchFreeRows == 1;
  constexpr int kFlagShift = kX3 ? kX3FlagShift : kTf32Pairs ? kTf32PairFlagShift : 32;
  // A lane re-reads all of its pending words per round while they are at most one row's worth
  // (KPC: always at B <= 8); with more, it first waits for one alone (one load in flight) so
  // that polling does not flood L2.
  constexpr int kPollAll = KPC;
  static_assert(kBranchFreeRows >= 0 && kBranchFreeRows <= 2, "direct kernel instance");
  static_assert(kBranchFreeRows == 0 || 2 * KPC <= 32, "the pending bits of both rows fit one word");
  const Geometry& g = a.g;
  extern __shared__ __align__(16) unsigned char smem[];
  float* red = reinterpret_cast<float*>(smem);  // [2][kWarps][16][kDirectRow] partial sums, by step parity
  SegTable* seg = reinterpret_cast<SegTable*>(smem + g.off_seg);
  // kHalf: h0's row scales [0, 16) and their inverses [16, 32), after the step table.
  float* const h0_scale = reinterpret_cast<float*>(smem + g.off_seg + sizeof(SegTable));

  const int H = g.H, U = g.U, B = g.B, T = g.T;
  const int j0 = blockIdx.x * U;
  const int64_t G4 = 4 * static_cast<int64_t>(H);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  copy_step_table(a.seg, seg);

  // Resident B fragments, columns c = gate * U + u (row gate * H + j0 + u of W_hh), in the
  // permuted k order above. Warp w covers k-steps [w * KPC, (w + 1) * KPC): k-steps f < KREG in
  // registers, the others in shared memory at wsm[(((f - KREG) * kFrag + m) * kNT + nt) * 32]
  // (this lane's 8 bytes).
  static_assert(KREG >= 1 && KREG <= KPC, "direct kernel instance");
  uint32_t bfr[kNT][KREG][kFrag][2];
  uint2* const wsm = reinterpret_cast<uint2*>(smem + g.off_w) + warp * (KPC - KREG) * kFrag * kNT * 32 + lane;
  // kHalf: this warp's fragments scaled by w_scale, its partial sums by w_unscale (powers of two).
  float w_scale = 1.0f, w_unscale = 1.0f;
  {
    const scalar_t* __restrict__ w_hh = a.w_hh;
    auto wf = [&](int k, int c) -> scalar_t {
      const int u = c & (U - 1), gate = c >> g.lg_u;
      if (gate >= 4 || j0 + u >= H || k >= H) return static_cast<scalar_t>(0.0f);
      return w_hh[static_cast<int64_t>(gate * H + j0 + u) * H + k];
    };
    if constexpr (kHalf) {  // the largest finite magnitude of this warp's fragments (loaded below)
      float m = 0.0f;
#pragma unroll 1
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll 1
        for (int f = 0; f < KPC; ++f) {
          const int k0 = (warp * KPC + f) * 16 + 4 * tq;
#pragma unroll
          for (int e = 0; e < 4; ++e) m = finite_abs_max(m, static_cast<float>(wf(k0 + e, nt * 8 + gq)));
        }
      }
      power_of_two_scales(warp_max(m), w_scale, w_unscale);
    }
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int f = 0; f < KPC; ++f) {
#pragma unroll
        for (int m = 0; m < kFrag; ++m) {
          uint32_t b0 = 0, b1 = 0;
          const int k0 = (warp * KPC + f) * 16 + 4 * tq;  // this lane's elements of the k-step
          const int col = nt * 8 + gq;
          if constexpr (kX3) {
            // The TF32 layout's elements of MMA m >> 1, their big (m even) or small (odd) part.
            const int k = k0 + 2 * (m >> 1);
            b0 = tf32_part(static_cast<float>(wf(k, col)), m & 1);
            b1 = tf32_part(static_cast<float>(wf(k + 1, col)), m & 1);
          } else if constexpr (kTf32Pairs) {
            b0 = to_tf32(static_cast<float>(wf(k0 + 2 * m, col)));
            b1 = to_tf32(static_cast<float>(wf(k0 + 2 * m + 1, col)));
          } else if constexpr (kHalf) {  // the 16-bit layout below, of the scaled values
            auto half_of = [&](int k) { return c10::Half(static_cast<float>(wf(k, col)) * w_scale); };
            b0 = pack2(half_of(k0), half_of(k0 + 1));
            b1 = pack2(half_of(k0 + 2), half_of(k0 + 3));
          } else {
            b0 = pack2(wf(k0, col), wf(k0 + 1, col));
            b1 = pack2(wf(k0 + 2, col), wf(k0 + 3, col));
          }
          if (f < KREG) {
            bfr[nt][f < KREG ? f : 0][m][0] = b0;
            bfr[nt][f < KREG ? f : 0][m][1] = b1;
          } else {
            wsm[(((f - KREG) * kFrag + m) * kNT + nt) * 32] = make_uint2(b0, b1);  // read back by this lane only
          }
        }
      }
    }
  }

  // The gate item of this thread: unit u (global j) of batch row n.
  const Item it = make_item(g, 0);
  acc_t c_st = it.valid ? static_cast<acc_t>(a.c0[it.n * H + it.j]) : acc_t(0);
  scalar_t h_st = it.valid ? a.h0[it.n * H + it.j] : static_cast<scalar_t>(0.0f);
  acc_t bias_r[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) bias_r[q] = it.valid ? bias_sum(a.b_ih, a.b_hh, q * H + it.j) : acc_t(0);
  if constexpr (kHalf) {
    // h0 may hold any value: each row as fp16 times the power of two that takes its largest finite
    // magnitude into [2^14, 2^15); the partial sums of the rows that read h0 are multiplied back.
    for (int r = warp; r < B; r += kWarps) {
      float m = 0.0f;
      const scalar_t* h0_row = a.h0 + static_cast<int64_t>(r) * H;
      for (int k = lane; k < H; k += 32) m = finite_abs_max(m, static_cast<float>(h0_row[k]));
      float scale, unscale;
      power_of_two_scales(warp_max(m), scale, unscale);
      if (lane == 0) {
        h0_scale[r] = scale;
        h0_scale[16 + r] = unscale;
      }
    }
  }
  __syncthreads();

  // pre of this step (pv) and of the next (pv_next, requested while this step's loads are in
  // flight, so that neither the step table lookup nor the load sits on the critical path).
  acc_t pv[4] = {0, 0, 0, 0}, pv_next[4] = {0, 0, 0, 0};
  auto prefetch = [&](const StepInfo& st, acc_t (&dst)[4]) {
    if (it.valid && it.n < st.bt) {
      const acc_t* pr = a.pre + (st.off + it.n) * G4 + it.j;
#pragma unroll
      for (int q = 0; q < 4; ++q) dst[q] = pr[q * H];
    }
  };
  int k_cur = a.reverse ? seg->count - 1 : 0;
  int k_nxt = k_cur;
  StepInfo cur = step_at(seg, a.reverse ? T - 1 : 0, k_cur);
  StepInfo nxt = cur;
  prefetch(cur, pv);

  const int word0 = warp * KPC * 8 + 2 * tq;                          // this lane's first LL word of a row
  const int data_words = g.row_words >> PAD;                          // a row's words without padding
  const int nf = min(KPC, max(0, (data_words - word0 + 7) >> 3));  // its k-steps inside the row
  constexpr int kstride = 8 << PAD;                                  // LL words between k-steps
  // This thread's unit pair's LL word of h_t in buffer 0 (even units publish it); buffer 1 is
  // buf_words further. Computed once: the publication is on the critical path.
  const int64_t buf_words = static_cast<int64_t>(B) * g.row_words;
  u64* const pub0 =
      a.xbuf + static_cast<int64_t>(it.exists ? it.n : 0) * g.row_words + (blockIdx.x * g.wpb << PAD) + (it.u >> 1);
  PhaseTrace trace;
  trace.start(a.trace);
  int bt_prev = 0;
  for (int s = 0; s < T; ++s) {
    const int bt = cur.bt;
    const int64_t off = cur.off;
    const int nll = s > 0 ? min(bt, bt_prev) : 0;  // rows of h_{t-1} in the LL buffer; [nll, bt) from h0
    // The flag of step s - 1's words (none are read at s = 0).
    const unsigned want = s == 0                ? 0u
                          : kX3                 ? x3_flag(s - 1)
                          : kTf32Pairs          ? tf32_pair_flag(s - 1)
                                                : static_cast<unsigned>(s);

    // 1. A fragments of this warp's K slice, rows gq and gq + 8 (16-byte LL loads).
    const u64* src0 = a.xbuf + (static_cast<int64_t>((s - 1) & 1) * B + gq) * g.row_words + (word0 << PAD);
    const u64* src1 = src0 + 8 * static_cast<int64_t>(g.row_words);
    const bool ll0 = gq < nll, ll1 = gq + 8 < nll;
    u64 lo[2][KPC], hi[2][KPC];
    unsigned pending = 0;
    if constexpr (kBranchFreeRows > 0) {
      // Rows gq (and gq + 8), polled branch-free: the loads are predicated on the pending bits and
      // the flags are checked into a bit mask (measured against the branches below:
      // direct_branch_free_rows, docs/kernels.md).
      const unsigned row_bits = (1u << nf) - 1u;
      pending = (ll0 ? row_bits : 0u) | (kBranchFreeRows == 2 && ll1 ? row_bits << KPC : 0u);
#pragma unroll
      for (int f = 0; f < KPC; ++f) {
        lo[0][f] = hi[0][f] = lo[1][f] = hi[1][f] = 0;
        ll_load_if(pending & (1u << f), src0 + f * kstride, lo[0][f], hi[0][f]);
        if constexpr (kBranchFreeRows == 2) {
          ll_load_if(pending & (1u << (KPC + f)), src1 + f * kstride, lo[1][f], hi[1][f]);
        }
      }
    } else {
#pragma unroll
      for (int f = 0; f < KPC; ++f) {
        lo[0][f] = hi[0][f] = lo[1][f] = hi[1][f] = 0;
        if (f < nf) {
          if (ll0) ll_load(src0 + f * kstride, lo[0][f], hi[0][f]);
          if (ll1) ll_load(src1 + f * kstride, lo[1][f], hi[1][f]);
          pending |= (ll0 ? 1u << f : 0u) | (ll1 ? 1u << (KPC + f) : 0u);
        }
      }
    }
    if (__builtin_expect(nll < bt, 0)) {
      h0_fragments<scalar_t, P, KPC>(a.h0, H, data_words, word0, nll, bt, h0_scale, lo, hi);
    }
    if (s + 1 < T) {
      nxt = step_at(seg, a.reverse ? T - 2 - s : s + 1, k_nxt);
      prefetch(nxt, pv_next);
    }
    const long long t_wait = clock64();
    if constexpr (kBranchFreeRows > 0) {
      while (true) {
        unsigned arrived = 0;
#pragma unroll
        for (int f = 0; f < KPC; ++f) {
          arrived |= ll_valid(lo[0][f], hi[0][f], want, kFlagShift) ? 1u << f : 0u;
          if constexpr (kBranchFreeRows == 2) {
            arrived |= ll_valid(lo[1][f], hi[1][f], want, kFlagShift) ? 1u << (KPC + f) : 0u;
          }
        }
        pending &= ~arrived;
        if (pending == 0) break;
        check_spin_timeout(t_wait, want);
#pragma unroll
        for (int f = 0; f < KPC; ++f) {
          ll_load_if(pending & (1u << f), src0 + f * kstride, lo[0][f], hi[0][f]);
          if constexpr (kBranchFreeRows == 2) {
            ll_load_if(pending & (1u << (KPC + f)), src1 + f * kstride, lo[1][f], hi[1][f]);
          }
        }
      }
    } else {
      while (true) {
        int first = -1;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int f = 0; f < KPC; ++f) {
            const unsigned bit = 1u << (r * KPC + f);
            if (pending & bit) {
              if (ll_valid(lo[r][f], hi[r][f], want, kFlagShift)) {
                pending &= ~bit;
              } else if (first < 0) {
                first = r * KPC + f;
              }
            }
          }
        }
        if (pending == 0) break;
        if (__popc(pending) > kPollAll) {
          (void)ll_wait((first >= KPC ? src1 : src0) + (first % KPC) * kstride, want, kFlagShift);
        } else {
          check_spin_timeout(t_wait, want);
        }
#pragma unroll
        for (int f = 0; f < KPC; ++f) {
          if (pending & (1u << f)) ll_load(src0 + f * kstride, lo[0][f], hi[0][f]);
          if (pending & (1u << (KPC + f))) ll_load(src1 + f * kstride, lo[1][f], hi[1][f]);
        }
      }
    }
    trace.mark(0);

    // 2. Partial gate pre-activations of this warp's K slice into red[s & 1][warp].
    float acc[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    if constexpr (kX3) {
      // big·big into acc, big·small into acc_lo and small·big into acc_sb (kTf32x3 above): three
      // dependent MMA chains per tile. With one batch row per lane (kStacked) the A tile's rows
      // g + 8 carry the small values of rows g: A·W_big gives big·big (rows g) and small·big
      // (rows g + 8), A·W_small big·small and small·small: two MMAs per half k-step instead of
      // three, the four terms folded into rows g.
      float acc_lo[kNT][4], acc_sb[kStacked ? 1 : kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) acc_lo[nt][0] = acc_lo[nt][1] = acc_lo[nt][2] = acc_lo[nt][3] = 0.f;
#pragma unroll
      for (int nt = 0; nt < (kStacked ? 1 : kNT); ++nt) {
        acc_sb[nt][0] = acc_sb[nt][1] = acc_sb[nt][2] = acc_sb[nt][3] = 0.f;
      }
#pragma unroll
      for (int f = 0; f < KPC; ++f) {
#pragma unroll
        for (int mma = 0; mma < 2; ++mma) {
          // Rows g, g + 8: word 2t (lo) holds this lane's two elements of the first MMA, word
          // 2t + 1 (hi) those of the second, as in the TF32 layout.
          const u64 w0 = mma == 0 ? lo[0][f] : hi[0][f], w1 = mma == 0 ? lo[1][f] : hi[1][f];
          const uint32_t v0 = x3_first(w0), v2 = x3_second(w0);  // row g, k = t and t + 4
          // a_main: the big values of rows g and g + 8, or (kStacked) row g's big and small.
          uint32_t a_main[4], a_small[4];
          if constexpr (kStacked) {
            a_main[0] = x3_big(v0);
            a_main[1] = x3_small(v0);
            a_main[2] = x3_big(v2);
            a_main[3] = x3_small(v2);
          } else {
            const uint32_t v1 = x3_first(w1), v3 = x3_second(w1);  // row g + 8
            a_main[0] = x3_big(v0);
            a_main[1] = x3_big(v1);
            a_main[2] = x3_big(v2);
            a_main[3] = x3_big(v3);
            a_small[0] = x3_small(v0);
            a_small[1] = x3_small(v1);
            a_small[2] = x3_small(v2);
            a_small[3] = x3_small(v3);
          }
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            uint2 wb, ws;
            if (f < KREG) {
              const uint32_t(&b)[kFrag][2] = bfr[nt][f < KREG ? f : 0];
              wb = make_uint2(b[2 * mma][0], b[2 * mma][1]);
              ws = make_uint2(b[2 * mma + 1][0], b[2 * mma + 1][1]);
            } else {
              wb = wsm[(((f - KREG) * kFrag + 2 * mma) * kNT + nt) * 32];
              ws = wsm[(((f - KREG) * kFrag + 2 * mma + 1) * kNT + nt) * 32];
            }
            if constexpr (!kStacked) MmaInst<float>::run(acc_sb[nt], a_small, wb.x, wb.y);
            MmaInst<float>::run(acc_lo[nt], a_main, ws.x, ws.y);
            MmaInst<float>::run(acc[nt], a_main, wb.x, wb.y);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        if constexpr (kStacked) {
          acc[nt][0] += acc[nt][2] + (acc_lo[nt][0] + acc_lo[nt][2]);
          acc[nt][1] += acc[nt][3] + (acc_lo[nt][1] + acc_lo[nt][3]);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][e] += acc_lo[nt][e] + acc_sb[nt][e];
        }
      }
    } else {
#pragma unroll
      for (int f = 0; f < KPC; ++f) {
#pragma unroll
        for (int m = 0; m < kFrag; ++m) {
          uint32_t af[4];
          if constexpr (kTf32Pairs) {
            const u64 w0 = m == 0 ? lo[0][f] : hi[0][f], w1 = m == 0 ? lo[1][f] : hi[1][f];  // rows g, g + 8
            af[0] = tf32_pair_first(w0);
            af[1] = tf32_pair_first(w1);
            af[2] = tf32_pair_second(w0);
            af[3] = tf32_pair_second(w1);
          } else {
            af[0] = static_cast<uint32_t>(lo[0][f]);
            af[1] = static_cast<uint32_t>(lo[1][f]);
            af[2] = static_cast<uint32_t>(hi[0][f]);
            af[3] = static_cast<uint32_t>(hi[1][f]);
          }
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            if (f < KREG) {
              const uint32_t(&b)[2] = bfr[nt][f < KREG ? f : 0][m];
              MmaInst<MmaT>::run(acc[nt], af, b[0], b[1]);
            } else {
              const uint2 w = wsm[(((f - KREG) * kFrag + m) * kNT + nt) * 32];
              MmaInst<MmaT>::run(acc[nt], af, w.x, w.y);
            }
          }
        }
      }
      if constexpr (kHalf) {  // back from the scaled fragments (exact: a power of two)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][e] *= w_unscale;
        }
      }
    }
    float* rw = red + ((s & 1) * kWarps + warp) * kDirectWarp;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      float* r0 = rw + gq * kDirectRow + nt * 8 + 2 * tq;
      *reinterpret_cast<float2*>(r0) = make_float2(acc[nt][0], acc[nt][1]);
      if constexpr (!kStacked) *reinterpret_cast<float2*>(r0 + 8 * kDirectRow) = make_float2(acc[nt][2], acc[nt][3]);
    }
    __syncthreads();
    trace.mark(1);

    // 3. Gate math of the own item; publish h_t (flag s + 1), then the outputs.
    const bool active = it.exists && it.n < bt;
    acc_t pq[4];
    if (active && it.valid) {
      const float* rr = red + (s & 1) * kWarps * kDirectWarp + it.n * kDirectRow + it.u;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        acc_t partial = sum_partials<kWarps>(rr + q * U, kWarps, kDirectWarp, 0);
        // kHalf: the rows that read h0 this step ([nll, bt)) read it times their row's power of two.
        if constexpr (kHalf) partial *= it.n >= nll ? h0_scale[16 + it.n] : 1.0f;
        pq[q] = pv[q] + bias_r[q] + partial;
      }
    }
    acc_t act_r[4] = {0, 0, 0, 0}, c_new = 0;
    scalar_t h = static_cast<scalar_t>(0.0f);
    if (active && it.valid) {
      const LstmGates<acc_t> pre_g{pq[0], pq[1], pq[2], pq[3]};
      LstmGates<acc_t> act;
      acc_t m;
      lstm_cell_forward<Math>(pre_g, c_st, act, c_new, m);
      c_st = c_new;
      h = static_cast<scalar_t>(m);
      h_st = h;
      act_r[0] = act.i;
      act_r[1] = act.f;
      act_r[2] = act.g;
      act_r[3] = act.o;
    }
    trace.mark(2);
    // Padding units publish zeros.
    u64* const pub = pub0 + ((s & 1) ? buf_words : 0);
    if constexpr (kX3) {
      const uint32_t bits = x3_bits(static_cast<float>(h));
      const uint32_t hi_bits = __shfl_down_sync(0xffffffffu, bits, 1);  // unit u + 1 of the same row
      if (s + 1 < T && active && (it.u & 1) == 0) {
        ll_store_word(pub, bits | (static_cast<u64>(hi_bits) << 30) | (static_cast<u64>(x3_flag(s)) << kX3FlagShift));
      }
    } else if constexpr (kTf32Pairs) {
      const uint32_t bits = to_tf32(static_cast<float>(h)) >> 13;
      const uint32_t hi_bits = __shfl_down_sync(0xffffffffu, bits, 1);  // unit u + 1 of the same row
      if (s + 1 < T && active && (it.u & 1) == 0) {
        ll_store_word(pub, bits | (static_cast<u64>(hi_bits) << 19) |
                               (static_cast<u64>(tf32_pair_flag(s)) << kTf32PairFlagShift));
      }
    } else {
      uint32_t bits;
      if constexpr (kHalf) {
        bits = static_cast<uint32_t>(c10::Half(static_cast<float>(h)).x);  // y keeps the float32 h
      } else {
        bits = static_cast<uint32_t>(h.x);
      }
      const uint32_t hi_bits = __shfl_down_sync(0xffffffffu, bits, 1);  // unit u + 1 of the same row
      if (s + 1 < T && active && (it.u & 1) == 0) ll_store(pub, bits | (hi_bits << 16), static_cast<uint32_t>(s + 1));
    }
    if (active && it.valid) {
      const int64_t row = off + it.n;
      a.y[row * H + it.j] = h_st;
      if constexpr (kTraining) {
        scalar_t* gr = a.gates + row * G4 + it.j;
#pragma unroll
        for (int q = 0; q < 4; ++q) gr[q * static_cast<int64_t>(H)] = static_cast<scalar_t>(act_r[q]);
        a.cells[row * H + it.j] = static_cast<scalar_t>(c_new);
      }
    }
    trace.mark(3);
    bt_prev = bt;
    cur = nxt;
#pragma unroll
    for (int q = 0; q < 4; ++q) pv[q] = pv_next[q];
  }
  report_trace(trace, kTraining ? "forward direct (training)" : "forward direct (inference)", g);

  if (it.valid) {
    a.h_n[it.n * H + it.j] = h_st;
    a.c_n[it.n * H + it.j] = c_st;
  }
}

// ---------------------------------------------------------------------------------------
// Backward kernel
// ---------------------------------------------------------------------------------------
// What a gate item's backward at step st reads, loaded one step ahead: its activated gates,
// c_t and grad_y of the step, and c_{t-1} / h_{t-1} from the step its state came from (t-1
// forward, t+1 reverse; its first n_prev rows are rows [0, n_prev) of step t) or, for rows
// that start at step t, from c0 / h0.
template <class scalar_t>
struct BwdInputs {
  using acc_t = at::opmath_type<scalar_t>;
  acc_t act[4], c, cp, gy;
  scalar_t hp;
};

template <class scalar_t>
__device__ __forceinline__ void load_backward_inputs(const BwdArgs<scalar_t>& a, const SegTable* seg,
                                                     const Item& it, const StepInfo& st, int kseg,
                                                     BwdInputs<scalar_t>& in) {
  using acc_t = at::opmath_type<scalar_t>;
  if (!it.valid || it.n >= st.bt) return;
  const int H = a.g.H;
  int n_prev = 0;
  int64_t prev_off = 0;
  if (!a.reverse && st.t > 0) {
    int k2 = kseg;
    n_prev = st.bt;
    prev_off = step_at(seg, st.t - 1, k2).off;
  } else if (a.reverse && st.t + 1 < a.g.T) {
    int k2 = kseg;
    const StepInfo pr = step_at(seg, st.t + 1, k2);
    n_prev = pr.bt;
    prev_off = pr.off;
  }
  const int64_t row = st.off + it.n;
  const scalar_t* gr = a.gates + row * 4 * static_cast<int64_t>(H) + it.j;
#pragma unroll
  for (int q = 0; q < 4; ++q) in.act[q] = static_cast<acc_t>(gr[q * static_cast<int64_t>(H)]);
  in.c = static_cast<acc_t>(a.cells[row * H + it.j]);
  in.gy = static_cast<acc_t>(a.grad_y[row * H + it.j]);
  if (it.n < n_prev) {
    in.cp = static_cast<acc_t>(a.cells[(prev_off + it.n) * H + it.j]);
    in.hp = a.y[(prev_off + it.n) * H + it.j];
  } else {
    in.cp = static_cast<acc_t>(a.c0[it.n * H + it.j]);
    in.hp = a.h0[it.n * H + it.j];
  }
}

template <class scalar_t, Path P>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_backward_kernel(const __grid_constant__ BwdArgs<scalar_t> a) {
  using acc_t = at::opmath_type<scalar_t>;
  using Math = CudaMath;
  constexpr int kCH = gather_batch<P>();
  constexpr int kKP = P == Path::kFma ? 0 : kWarps;  // depth of red: the warps (MMA) or run time (FMA)
  constexpr int sz = sizeof(scalar_t);
  const Geometry& g = a.g;
  extern __shared__ __align__(16) unsigned char smem[];
  scalar_t* xs = reinterpret_cast<scalar_t*>(smem);  // [Bp16][ldx] dG_t (chunk)
  acc_t* red = reinterpret_cast<acc_t*>(smem + g.off_red);
  scalar_t* stage = reinterpret_cast<scalar_t*>(smem + g.off_stage);  // [B][4][U] own slice of dG_t
  scalar_t* ws = reinterpret_cast<scalar_t*>(smem + g.off_w);
  SegTable* seg = reinterpret_cast<SegTable*>(smem + g.off_seg);

  const int H = g.H, U = g.U, B = g.B, T = g.T, Hp = g.Hp;
  const int j0 = blockIdx.x * U;
  const int64_t G4 = 4 * static_cast<int64_t>(H);
  init_shared(smem, g, a.seg, seg, g.off_red);

  // Wres[k][c] = W_hh[gate * H + jj][j0 + c], k = gate * Hp + jj (dG columns in the padded layout).
  const scalar_t* __restrict__ w_hh = a.w_hh;
  auto wf = [&](int k, int c) -> scalar_t {
    const int gate = k / Hp, jj = k - gate * Hp;
    if (c >= U || gate >= 4 || jj >= H || j0 + c >= H) return static_cast<scalar_t>(0.0f);
    return w_hh[static_cast<int64_t>(gate * H + jj) * H + j0 + c];
  };
  Resident<scalar_t, P, true> res;
  res.load(wf, g, ws);

  Item items[kItems];
  acc_t dh_st[kItems], dc_st[kItems];
#pragma unroll
  for (int p = 0; p < kItems; ++p) {
    items[p] = make_item(g, p);
    const Item& it = items[p];
    dh_st[p] = it.valid ? static_cast<acc_t>(a.grad_h_n[it.n * H + it.j]) : acc_t(0);
    dc_st[p] = it.valid ? static_cast<acc_t>(a.grad_c_n[it.n * H + it.j]) : acc_t(0);
  }
  __syncthreads();

  // Inputs of the next step's gate backward, loaded one step ahead.
  BwdInputs<scalar_t> nx[kItems];
  auto prefetch = [&](const StepInfo& st, int kseg) {
#pragma unroll
    for (int p = 0; p < kItems; ++p) load_backward_inputs(a, seg, items[p], st, kseg, nx[p]);
  };
  int k_cur = a.reverse ? 0 : seg->count - 1;
  StepInfo cur = step_at(seg, a.reverse ? 0 : T - 1, k_cur);
  prefetch(cur, k_cur);

  PhaseTrace trace;
  trace.start(a.trace);
  for (int s = 0; s < T; ++s) {
    const int bt = cur.bt;
    const int64_t off = cur.off;
    // 1. Gate backward of the own units: dc and the own slice of dG_t, staged for
    //    publication; dG rows and h_{t-1} are stored after it (off the critical path).
    scalar_t d_r[kItems][4], hp_r[kItems];
#pragma unroll
    for (int p = 0; p < kItems; ++p) {
      const Item& it = items[p];
      if (!it.exists || it.n >= bt) continue;
      scalar_t* st_row = stage + it.n * 4 * U + it.u;
      if (it.valid) {
        const LstmGates<acc_t> act{nx[p].act[0], nx[p].act[1], nx[p].act[2], nx[p].act[3]};
        LstmGates<acc_t> d;
        acc_t dc_prev, m;
        lstm_cell_backward<Math>(act, nx[p].c, nx[p].cp, dh_st[p] + nx[p].gy, dc_st[p], d, dc_prev, m);
        dc_st[p] = dc_prev;
        d_r[p][0] = static_cast<scalar_t>(d.i);
        d_r[p][1] = static_cast<scalar_t>(d.f);
        d_r[p][2] = static_cast<scalar_t>(d.g);
        d_r[p][3] = static_cast<scalar_t>(d.o);
        hp_r[p] = nx[p].hp;
#pragma unroll
        for (int q = 0; q < 4; ++q) st_row[q * U] = d_r[p][q];
      } else {
        st_row[0] = st_row[U] = st_row[2 * U] = st_row[3 * U] = static_cast<scalar_t>(0.0f);
      }
    }
    const int64_t off_cur = off;
    if (s + 1 < T) {
      cur = step_at(seg, a.reverse ? s + 1 : T - 2 - s, k_cur);
      prefetch(cur, k_cur);
    }
    __syncthreads();
    trace.mark(2);

    // 2. Publish the own slice of dG_t (rows [0, bt), columns gate * Hp + [j0, j0 + U)), flag s + 1.
    const unsigned flag = static_cast<unsigned>(s + 1);
    u64* dbuf = a.dbuf + static_cast<int64_t>(s & 1) * B * g.row_words;
    {
      const int gate_words = g.row_words / 4;
      u64* dst = dbuf + blockIdx.x * g.wpb;
      const int per_row = 4 * g.wpb;
      for (int e = threadIdx.x; e < bt * per_row; e += kThreads) {
        const int n = e >> (g.lg_wpb + 2);
        const int gate = (e >> g.lg_wpb) & 3, q = e & (g.wpb - 1);
        const uint32_t payload = reinterpret_cast<const uint32_t*>(stage + (n * 4 + gate) * U)[q];
        ll_store(dst + static_cast<int64_t>(n) * g.row_words + gate * gate_words + q, payload, flag);
      }
    }
#pragma unroll
    for (int p = 0; p < kItems; ++p) {
      const Item& it = items[p];
      if (!it.valid || it.n >= bt) continue;
      const int64_t row = off_cur + it.n;
      a.hprev[row * H + it.j] = hp_r[p];
      scalar_t* gr = a.dG + row * G4 + it.j;
#pragma unroll
      for (int q = 0; q < 4; ++q) gr[q * static_cast<int64_t>(H)] = d_r[p][q];
    }
    trace.mark(3);

    // 3. All of dG_t into the X tile (chunk by chunk) and dh_{t-1}[:, own units] = dG_t · W_hh[:, own].
    for (int ch = 0; ch < g.nch; ++ch) {
      if (ch > 0) {
        __syncthreads();
        trace.mark(1);
      }
      const int col0 = ch * g.CK;
      const int ncol = max(0, min(g.CK, g.Kx - col0));
      if (ncol > 0) {
        ll_gather<kCH>(dbuf + col0 * sz / 4, g.row_words, ncol * sz / 4, bt, flag, smem, g.ldx * sz);
      }
      if (g.nch > 1 && ncol < g.CK) {
        const int w = g.CK - ncol;
        for (int e = threadIdx.x; e < bt * w; e += kThreads) {
          const int r = e / w;
          xs[r * g.ldx + ncol + (e - r * w)] = static_cast<scalar_t>(0.0f);
        }
      }
      __syncthreads();
      trace.mark(0);
      res.gemm(g, xs, ws, ch, bt, red);
    }
    __syncthreads();
    trace.mark(1);

    // 4. dh_{t-1} of rows [0, bt) (rows >= bt keep theirs, as lstm.cu's dhbuf does).
#pragma unroll
    for (int p = 0; p < kItems; ++p) {
      const Item& it = items[p];
      if (it.valid && it.n < bt) dh_st[p] = sum_partials<kKP>(red, g.kp, g.red_stride, it.n * g.NCp + it.u);
    }
  }
  report_trace(trace, "backward", g);

#pragma unroll
  for (int p = 0; p < kItems; ++p) {
    const Item& it = items[p];
    if (it.valid) {
      a.grad_h0[it.n * H + it.j] = dh_st[p];
      a.grad_c0[it.n * H + it.j] = dc_st[p];
    }
  }
}

// ---------------------------------------------------------------------------------------
// Backward kernel, split variant: tensor cores, B <= 16, partial sums of dh exchanged
// ---------------------------------------------------------------------------------------
// Why. The kernel above exchanges dG_t [bt, 4H] and every block reads all of it: four times
// the forward's state, in the input dtype, twice that in the LL format (float32 B = 1,
// H = 1024: 32 KB per block and step). Here each block multiplies its own slice of dG_t
// [bt, 4U] (its items' results, already in shared memory) by its own rows of W_hh [4U, H],
// resident, which gives a partial dh_{t-1} [bt, H] over its 4U gate rows; dh_{t-1}[:, j] is
// the sum of all blocks' partials at column j, which block j / U adds up. A block writes bt·Hp
// partials and reads bt·U·nblocks = bt·Hp of them per step, instead of reading 4·bt·Hp values
// of dG; two partials per LL word (24-bit floats, fp24_pair above; 2026-11-26: fp32 B = 8 / 16,
// H = 1024 training calls 9% shorter on an H200 than with one fp32 value per word).
//
// Exchange layout: pbuf[s & 1][b][n][k / 2] for producing block b, row n and hidden column k,
// so that a producer's C fragments go out as one 8-byte store per row and column pair, 32
// contiguous bytes per four lanes (scattered stores, one per column, were the slowest part of
// a first version: ~5 cycles per word). A consumer reads its U columns of each producer's row,
// U / 4 16-byte loads of two words: lane l takes column quad l % (U / 4) of producer l / (U / 4)
// (+ 32 / (U / 4) per warp, + 8x that per round, at most two rounds), adds its rounds in order,
// and a butterfly of shuffles over the lanes of one column quad adds the warp's producers: a
// fixed order (deterministic results). The eight warps' sums meet in shared memory and the item
// thread adds them in warp order. Two buffers alternate, as in the kernels above: a block writes
// step s only after it has read every block's step s - 1, which they wrote after reading step
// s - 2 from the buffer about to be overwritten.
//
// Product. With A = dG_t's own slice (m16 rows, K = 4U = 16 or 32: one to four k-steps) and
// B = W_hh[own rows][k] for k in the warp's columns (NTW n8 tiles per warp, resident
// fragments: NTW x 4U / kStep x 2 registers), each n-tile is a chain of at most four MMAs whose
// result is published at once. A fragments: m16n8k16 a0 = A[g][2t, 2t+1], a1 = A[g+8][...],
// a2/a3 at k + 8; m16n8k8 a0 = A[g][t], a1 = A[g+8][t], a2/a3 at k + 4 (lstm_device.cuh).
// Limits (else the kernel above): bf16/fp16 or TF32, B <= 16, H <= 8 warps x 16 tiles x 8 = 1024.
//
// Clustered instances (sm_90, lstm_persistent_backward_split_cluster_kernel). At B >= 8 the
// exchange above moves bt·Hp partials per block and step through L2 (fp32 B = 16, H = 512, 128
// blocks: 8 MB written and read per step), and consumers wait on every producer. In clusters of
// CL = 8 or 4 consecutive blocks, each block keeps its partials in shared memory
// ([2][16][ldp] fp32, alternating like the LL buffers), one cluster barrier (arrive.release /
// wait.acquire) makes them visible, and block r of the cluster adds columns
// [r, r + 1) · Hp / CL of its CL blocks' partials through distributed shared memory (rank order:
// deterministic) and publishes them as producer clusterid: CL times fewer words written and read
// through L2 and CL times fewer producers to wait on. The consumer's warp w takes rows w and
// w + 8 from all nprod = nblocks / CL producers at once, so a row's sum stays in one warp.
// Reuse of a partials buffer two steps later is safe: a block passes step s + 1's cluster barrier
// only after every block of its cluster arrived there, i.e. finished reading step s's partials;
// a last cluster barrier keeps every block's shared memory alive until the others are done. The
// launch needs the clusters co-resident as well: cudaOccupancyMaxActiveClusters · CL >= blocks
// (plan), or no clusters (on an H200 128 blocks fit in neither size: H = 1024 runs without).
constexpr int kSplitRows = 4;  // rows whose loads a lane has in flight at once
constexpr int kSplitClusterMinBatch = 4;  // clusters from B = 4 (at B = 1, H = 768 they were 5-12% slower)
constexpr int64_t kSplitMaxBHHalf = 1024;  // bf16 / fp16: faster than the general kernel while B·H <= 1024
constexpr int kSplitMinHiddenTf32 = 512;  // TF32: faster at B = 1 and from H = 512

// Two LL words (16 bytes) if `pred`: two single-copy-atomic 64-bit relaxed stores at GPU scope,
// predicated inside the instruction (no branch).
__device__ __forceinline__ void ll_store2_if(bool pred, u64* p, uint32_t payload0, uint32_t payload1,
                                             uint32_t flag) {
  const u64 v0 = (static_cast<u64>(flag) << 32) | payload0, v1 = (static_cast<u64>(flag) << 32) | payload1;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};\n}" ::"l"(p),
      "l"(v0), "l"(v1), "r"(static_cast<int>(pred))
      : "memory");
}

// Thread-block clusters (sm_90): the split kernel's clustered instances add the partials of a
// cluster's blocks through distributed shared memory before they go out (the kernel's comment).
// Compiled for an older architecture these trap; the host takes the clustered instance only
// where the kernel's PTX is for sm_90 or later (ptx_at_least, kernel_attributes.cuh). Clusters
// of CL blocks tile the 1-D grid in order: a block's rank in its cluster is blockIdx.x % CL and
// its cluster's index blockIdx.x / CL (cluster_sync: cluster.cuh).

__device__ __forceinline__ float4 ld_cluster4(uint32_t addr) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr));
#endif
  return v;
}

// Two floats to shared memory if `pred`, predicated inside the instruction (no branch).
__device__ __forceinline__ void st_shared2_if(bool pred, uint32_t addr, float v0, float v1) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p st.shared.v2.f32 [%0], {%1, %2};\n}" ::"r"(addr),
               "f"(v0), "f"(v1), "r"(static_cast<int>(pred))
               : "memory");
}

// The split kernel without clusters exchanges its partials as pairs of 24-bit floats per LL word
// (fp32 rounded at a 15-bit mantissa, half-way cases away from zero: relative error <= 2^-16,
// 32 times below TF32's rounding of the product's inputs) and a 16-bit flag, 1 + step mod 65535
// (never 0, the memset's value; a stale word, two steps old, never matches): half the words of
// one fp32 value and a 32-bit flag each. Bits 0-23: the pair's first column, 24-47: the second,
// 48-63: the flag. Packing is two byte permutes (it runs for every tile of every step).
constexpr int kPairFlagShift = 48;
__device__ __forceinline__ unsigned fp24_pair_flag(int step) { return 1u + static_cast<unsigned>(step) % 65535u; }
__device__ __forceinline__ u64 fp24_pair(float first, float second, unsigned flag) {
  const uint32_t a = __float_as_uint(first) + 0x80u, b = __float_as_uint(second) + 0x80u;
  const uint32_t lo = __byte_perm(a, b, 0x5321);     // a bytes 1-3, b byte 1
  const uint32_t hi = __byte_perm(b, flag, 0x5432);  // b bytes 2-3, flag bytes 0-1
  return (static_cast<u64>(hi) << 32) | lo;
}
__device__ __forceinline__ float fp24_first(u64 w) { return __uint_as_float(static_cast<uint32_t>(w << 8)); }
__device__ __forceinline__ float fp24_second(u64 w) {
  return __uint_as_float(static_cast<uint32_t>(w >> 16) & 0xffffff00u);
}

// One LL word if `pred`, predicated inside the instruction (no branch).
__device__ __forceinline__ void ll_store_word_if(bool pred, u64* p, u64 v) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p st.relaxed.gpu.global.u64 [%0], %1;\n}" ::"l"(p),
               "l"(v), "r"(static_cast<int>(pred))
               : "memory");
}

// Clustered instances: a consumer lane has the loads of up to kClusterRounds producers per row
// in flight (producers c = bl + lpb * i; one pass while nprod <= kClusterRounds * 32 / (U / 2)).
constexpr int kClusterRounds = 4;
// Clustered instances: float4 sums a thread adds and publishes per pass (bt * Hp / cl / 4 in all).
constexpr int kClusterSums = 4;

// CL: blocks per cluster (1: the partials of every block go out to L2 as they are).
template <class scalar_t, Path P, int NTW, int CL>
__device__ __forceinline__ void split_backward(const BwdArgs<scalar_t>& a) {
  using acc_t = at::opmath_type<scalar_t>;  // float on this path
  using Math = CudaMath;
  constexpr int kStep = P == Path::kTf32 ? 8 : 16;
  constexpr int kKS = 32 / kStep;  // k-steps of 4U <= 32
  const Geometry& g = a.g;
  extern __shared__ __align__(16) unsigned char smem[];
  scalar_t* atile = reinterpret_cast<scalar_t*>(smem);       // [16][ldx] own slice of dG_t, column gate * U + u
  float* red = reinterpret_cast<float*>(smem + g.off_red);  // [kWarps][16][U] the warps' sums ([16][U] if CL > 1)
  SegTable* seg = reinterpret_cast<SegTable*>(smem + g.off_seg);

  const int H = g.H, U = g.U, B = g.B, T = g.T, Hp = g.Hp;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  const int j0 = blockIdx.x * U;
  const int64_t G4 = 4 * static_cast<int64_t>(H);
  // Words per producer and buffer: Hp per row (CL > 1: one fp32 value per word) or Hp / 2
  // (without clusters: 24-bit pairs).
  const int64_t row_pw = CL > 1 ? Hp : Hp / 2, pstride = static_cast<int64_t>(B) * row_pw;
  init_shared(smem, g, a.seg, seg, g.off_seg);  // zeroes the A tile and red

  // Clustered: this block's partials [2][16][ldp] in shared memory (shared::cta address), and
  // where each block of the cluster keeps them (shared::cluster addresses).
  uint32_t part = 0, remote[CL];
  if constexpr (CL > 1) {
    part = shared_address(smem + g.off_part);
#pragma unroll
    for (int q = 0; q < CL; ++q) remote[q] = cluster_address(part, q);
  }

  // Resident B fragments: column col = (warp * NTW + nt) * 8 + g of dh, k = gate * U + u.
  uint32_t wb[NTW][kKS][2];
  {
    auto wt = [&](int k, int col) -> scalar_t {
      const int gate = k / U, u = k - gate * U;
      if (gate >= 4 || j0 + u >= H || col >= H) return static_cast<scalar_t>(0.0f);
      return a.w_hh[static_cast<int64_t>(gate * H + j0 + u) * H + col];
    };
#pragma unroll
    for (int nt = 0; nt < NTW; ++nt) {
      const int col = (warp * NTW + nt) * 8 + gq;
#pragma unroll
      for (int f = 0; f < kKS; ++f) {
        const int k0 = f * kStep;
        if constexpr (P == Path::kTf32) {
          wb[nt][f][0] = to_tf32(static_cast<float>(wt(k0 + tq, col)));
          wb[nt][f][1] = to_tf32(static_cast<float>(wt(k0 + tq + 4, col)));
        } else {
          wb[nt][f][0] = pack2(wt(k0 + 2 * tq, col), wt(k0 + 2 * tq + 1, col));
          wb[nt][f][1] = pack2(wt(k0 + 2 * tq + 8, col), wt(k0 + 2 * tq + 9, col));
        }
      }
    }
  }

  const Item it = make_item(g, 0);
  acc_t dh_st = it.valid ? static_cast<acc_t>(a.grad_h_n[it.n * H + it.j]) : acc_t(0);
  acc_t dc_st = it.valid ? static_cast<acc_t>(a.grad_c_n[it.n * H + it.j]) : acc_t(0);
  __syncthreads();

  // Inputs of the next step's gate backward, loaded one step ahead.
  BwdInputs<scalar_t> nx{};
  int k_cur = a.reverse ? 0 : seg->count - 1;
  StepInfo cur = step_at(seg, a.reverse ? 0 : T - 1, k_cur);
  load_backward_inputs(a, seg, it, cur, k_cur, nx);

  // The consumer's lane roles: columns per 16-byte load cpl = 2 (CL > 1) or 4 (24-bit pairs),
  // U / cpl column groups x 32 / (U / cpl) producers per warp and round.
  const int lg_up = g.lg_u - (CL > 1 ? 1 : 2);
  const int kp = lane & ((1 << lg_up) - 1), bl = lane >> lg_up, lpb = 32 >> lg_up;

  PhaseTrace trace;
  trace.start(a.trace);
  for (int s = 0; s < T; ++s) {
    const int bt = cur.bt;
    const int64_t off = cur.off;
    // 1. Gate backward of the own units: dc and the own slice of dG_t into the A tile.
    scalar_t d_r[4], hp_r = static_cast<scalar_t>(0.0f);
    const bool active = it.valid && it.n < bt;
    if (active) {
      const LstmGates<acc_t> act{nx.act[0], nx.act[1], nx.act[2], nx.act[3]};
      LstmGates<acc_t> d;
      acc_t dc_prev, m;
      lstm_cell_backward<Math>(act, nx.c, nx.cp, dh_st + nx.gy, dc_st, d, dc_prev, m);
      dc_st = dc_prev;
      d_r[0] = static_cast<scalar_t>(d.i);
      d_r[1] = static_cast<scalar_t>(d.f);
      d_r[2] = static_cast<scalar_t>(d.g);
      d_r[3] = static_cast<scalar_t>(d.o);
      hp_r = nx.hp;
      scalar_t* ar = atile + it.n * g.ldx + it.u;
#pragma unroll
      for (int q = 0; q < 4; ++q) ar[q * U] = d_r[q];
    }
    if (s + 1 < T) {
      cur = step_at(seg, a.reverse ? s + 1 : T - 2 - s, k_cur);
      load_backward_inputs(a, seg, it, cur, k_cur, nx);
    }
    __syncthreads();
    trace.mark(2);

    // 2. Partial dh_{t-1} of the warp's columns over the own 4U gate rows (rows < bt, columns
    //    < Hp; columns >= H are zeros): published per n-tile with flag s + 1, or (CL > 1) kept
    //    in shared memory for the cluster's sum (2b).
    const unsigned flag = CL > 1 ? static_cast<unsigned>(s + 1) : fp24_pair_flag(s);
    u64* pbuf = a.dbuf + static_cast<int64_t>(s & 1) * B * g.row_words;
    {
      // A fragments of the k-steps over 4U (zeros past 4U: the MMAs below run unconditionally,
      // with zero W fragments there as well).
      uint32_t af[kKS][4];
      const scalar_t* x0 = atile + gq * g.ldx;
      const scalar_t* x1 = x0 + 8 * g.ldx;
#pragma unroll
      for (int f = 0; f < kKS; ++f) {
        const int k = f * kStep;
        const bool in = f < g.kpc;
        if constexpr (P == Path::kTf32) {
          af[f][0] = in ? to_tf32(x0[k + tq]) : 0u;
          af[f][1] = in ? to_tf32(x1[k + tq]) : 0u;
          af[f][2] = in ? to_tf32(x0[k + tq + 4]) : 0u;
          af[f][3] = in ? to_tf32(x1[k + tq + 4]) : 0u;
        } else {
          af[f][0] = in ? *reinterpret_cast<const uint32_t*>(x0 + k + 2 * tq) : 0u;
          af[f][1] = in ? *reinterpret_cast<const uint32_t*>(x1 + k + 2 * tq) : 0u;
          af[f][2] = in ? *reinterpret_cast<const uint32_t*>(x0 + k + 8 + 2 * tq) : 0u;
          af[f][3] = in ? *reinterpret_cast<const uint32_t*>(x1 + k + 8 + 2 * tq) : 0u;
        }
      }
      // The n-tiles in groups of up to 8: every MMA chain of a group first (independent, so
      // they overlap), then its stores, predicated without branches (a branch per tile kept
      // each tile's MMAs, their latency and its store in sequence: measured ~2x slower).
      const bool row0 = gq < bt, row1 = gq + 8 < bt;
      u64* p0 = pbuf + blockIdx.x * pstride + gq * row_pw;
      u64* p1 = p0 + 8 * row_pw;
      const uint32_t q0 = part + static_cast<uint32_t>(((s & 1) * 16 + gq) * g.ldp) * 4u;  // CL > 1: rows gq
      const uint32_t q1 = q0 + static_cast<uint32_t>(8 * g.ldp) * 4u;                     // and gq + 8
      constexpr int kGroup = NTW < 8 ? NTW : 8;
#pragma unroll
      for (int t0 = 0; t0 < NTW; t0 += kGroup) {
        float acc[kGroup][4];
#pragma unroll
        for (int i = 0; i < kGroup; ++i) {
          acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
          for (int f = 0; f < kKS; ++f) MmaInst<scalar_t>::run(acc[i], af[f], wb[t0 + i][f][0], wb[t0 + i][f][1]);
        }
#pragma unroll
        for (int i = 0; i < kGroup; ++i) {
          const int col = (warp * NTW + t0 + i) * 8 + 2 * tq;
          const bool in = col < Hp;  // Hp is even: the pair is whole
          if constexpr (CL > 1) {
            st_shared2_if(row0 && in, q0 + col * 4u, acc[i][0], acc[i][1]);
            st_shared2_if(row1 && in, q1 + col * 4u, acc[i][2], acc[i][3]);
          } else {
            ll_store_word_if(row0 && in, p0 + col / 2, fp24_pair(acc[i][0], acc[i][1], flag));
            ll_store_word_if(row1 && in, p1 + col / 2, fp24_pair(acc[i][2], acc[i][3], flag));
          }
        }
      }
    }
    trace.mark(1);
    if constexpr (CL > 1) {
      // 2b. Block r of the cluster adds columns [r, r + 1) * Hp / CL of its CL blocks' partials
      //     (in rank order: deterministic) and publishes them as producer clusterid.
      cluster_sync();
      trace.mark(0);
      const int cw4 = Hp / CL / 4;  // float4 columns of the chunk
      const int c0 = static_cast<int>(blockIdx.x % CL) * cw4 * 4;  // cluster rank
      const int total = bt * cw4;
      u64* pub = pbuf + static_cast<int64_t>(blockIdx.x / CL) * pstride;  // the cluster's index
      const uint32_t base = static_cast<uint32_t>((s & 1) * 16 * g.ldp) * 4u;
      for (int v0 = 0; v0 < total; v0 += kClusterSums * kThreads) {  // one pass at B <= 16, Hp / CL <= 256
        float4 sum[kClusterSums];
        int n_of[kClusterSums], c_of[kClusterSums];
#pragma unroll
        for (int v = 0; v < kClusterSums; ++v) {
          const int idx = v0 + threadIdx.x + v * kThreads;
          n_of[v] = idx / cw4;
          c_of[v] = c0 + (idx - n_of[v] * cw4) * 4;
          sum[v] = make_float4(0.f, 0.f, 0.f, 0.f);
          if (idx < total) {
            const uint32_t at = base + static_cast<uint32_t>(n_of[v] * g.ldp + c_of[v]) * 4u;
#pragma unroll
            for (int q = 0; q < CL; ++q) {
              const float4 x = ld_cluster4(remote[q] + at);
              sum[v].x += x.x;
              sum[v].y += x.y;
              sum[v].z += x.z;
              sum[v].w += x.w;
            }
          }
        }
#pragma unroll
        for (int v = 0; v < kClusterSums; ++v) {
          const bool in = v0 + threadIdx.x + v * kThreads < total;
          u64* w = pub + n_of[v] * Hp + c_of[v];
          ll_store2_if(in, w, __float_as_uint(sum[v].x), __float_as_uint(sum[v].y), flag);
          ll_store2_if(in, w + 2, __float_as_uint(sum[v].z), __float_as_uint(sum[v].w), flag);
        }
      }
    }
    // dG rows and h_{t-1} for the whole-sequence GEMMs, off the critical path.
    if (active) {
      const int64_t row = off + it.n;
      a.hprev[row * H + it.j] = hp_r;
      scalar_t* gr = a.dG + row * G4 + it.j;
#pragma unroll
      for (int q = 0; q < 4; ++q) gr[q * static_cast<int64_t>(H)] = d_r[q];
    }
    trace.mark(3);

    if constexpr (CL > 1) {
      const u64* src0 = pbuf + j0 + 2 * kp;
      // 3. Rows n = warp and warp + 8 of dh_{t-1}[n][j0 + 2kp, +1], each from the nprod cluster
      //    sums c = bl + lpb * i, the loads of kClusterRounds values of i for both rows in flight
      //    at once (one pass up to 32 / 64 clusters at U = 8 / 4); a row's sum stays in its warp.
      float s0[2] = {0.f, 0.f}, s1[2] = {0.f, 0.f};
      for (int i0 = 0; lpb * i0 < g.nprod; i0 += kClusterRounds) {
        u64 lo[2][kClusterRounds], hi[2][kClusterRounds];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int i = 0; i < kClusterRounds; ++i) {
            const int n = warp + 8 * r, c = bl + lpb * (i0 + i);
            lo[r][i] = hi[r][i] = static_cast<u64>(flag) << 32;  // no producer: payload 0
            if (n < bt && c < g.nprod) ll_load(src0 + c * pstride + n * Hp, lo[r][i], hi[r][i]);
          }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int i = 0; i < kClusterRounds; ++i) {
            if (!ll_valid(lo[r][i], hi[r][i], flag)) {
              const ulonglong2 w = ll_wait(src0 + (bl + lpb * (i0 + i)) * pstride + (warp + 8 * r) * Hp, flag);
              lo[r][i] = w.x;
              hi[r][i] = w.y;
            }
            s0[r] += __uint_as_float(static_cast<uint32_t>(lo[r][i]));
            s1[r] += __uint_as_float(static_cast<uint32_t>(hi[r][i]));
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int n = warp + 8 * r;
        for (int m = 16; m >= (U >> 1); m >>= 1) {  // the lanes of one column pair
          s0[r] += __shfl_xor_sync(0xffffffffu, s0[r], m);
          s1[r] += __shfl_xor_sync(0xffffffffu, s1[r], m);
        }
        if (bl == 0 && n < bt) {
          red[n * U + 2 * kp] = s0[r];
          red[n * U + 2 * kp + 1] = s1[r];
        }
      }
    } else {
      // 3. The warp's share of dh_{t-1}[n][j0 + 4kp, +4): producers b = bl + lpb * (warp + 8 i),
      //    rows n in batches of kSplitRows, every load of a batch in flight at once.
      const u64* src0 = pbuf + (j0 >> 1) + 2 * kp;
      for (int n0 = 0; n0 < bt; n0 += kSplitRows) {
        u64 lo[kSplitRows][2], hi[kSplitRows][2];
#pragma unroll
        for (int r = 0; r < kSplitRows; ++r) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int b = bl + lpb * (warp + kWarps * i);
            lo[r][i] = hi[r][i] = static_cast<u64>(flag) << kPairFlagShift;  // no producer: payload 0
            if (n0 + r < bt && b < g.nprod) ll_load(src0 + b * pstride + (n0 + r) * row_pw, lo[r][i], hi[r][i]);
          }
        }
#pragma unroll
        for (int r = 0; r < kSplitRows; ++r) {
          float q[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            if (!ll_valid(lo[r][i], hi[r][i], flag, kPairFlagShift)) {
              const int b = bl + lpb * (warp + kWarps * i);
              const ulonglong2 w = ll_wait(src0 + b * pstride + (n0 + r) * row_pw, flag, kPairFlagShift);
              lo[r][i] = w.x;
              hi[r][i] = w.y;
            }
            q[0] += fp24_first(lo[r][i]);
            q[1] += fp24_second(lo[r][i]);
            q[2] += fp24_first(hi[r][i]);
            q[3] += fp24_second(hi[r][i]);
          }
          if (n0 + r >= bt) continue;  // uniform: no butterflies for rows past bt (B = 1: 3 of 4)
          for (int m = 16; m >= (1 << lg_up); m >>= 1) {  // the lanes of one column group
#pragma unroll
            for (int c = 0; c < 4; ++c) q[c] += __shfl_xor_sync(0xffffffffu, q[c], m);
          }
          if (bl == 0) {
            float* rr = red + (warp * 16 + n0 + r) * U + 4 * kp;
#pragma unroll
            for (int c = 0; c < 4; ++c) rr[c] = q[c];
          }
        }
      }
    }
    __syncthreads();
    trace.mark(0);

    // 4. dh_{t-1} of rows [0, bt) (rows >= bt keep theirs, as lstm.cu's dhbuf does).
    if (active) {
      const float* rr = red + it.n * U + it.u;
      float sum = rr[0];
      if constexpr (CL == 1) {
#pragma unroll
        for (int w = 1; w < kWarps; ++w) sum += rr[w * 16 * U];
      }
      dh_st = sum;
    }
  }
  report_trace(trace, CL > 1 ? "backward (split, clustered)" : "backward (split)", g);
  // Clustered: no block leaves while another may still read its partials.
  if constexpr (CL > 1) cluster_sync();

  if (it.valid) {
    a.grad_h0[it.n * H + it.j] = dh_st;
    a.grad_c0[it.n * H + it.j] = dc_st;
  }
}

template <class scalar_t, Path P, int NTW>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_backward_split_kernel(const __grid_constant__ BwdArgs<scalar_t> a) {
  split_backward<scalar_t, P, NTW, 1>(a);
}

// Launched with clusters of CL blocks (consecutive blockIdx.x).
template <class scalar_t, Path P, int NTW, int CL>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_backward_split_cluster_kernel(const __grid_constant__ BwdArgs<scalar_t> a) {
  split_backward<scalar_t, P, NTW, CL>(a);
}

// ---------------------------------------------------------------------------------------
// Forward kernel in clusters of two blocks, B <= 64 (bf16 / fp16, float32 with and without TF32)
// ---------------------------------------------------------------------------------------
// At B = 64 a block of the direct kernel would read all of h_{t-1} every step (256 KB of LL
// words at H = 1024, 32 MB a step over its 128 blocks), and the cuBLAS loop streams all of W_hh
// from L2 every step (its step GEMM, ~4 µs of the ~7 µs step at bf16 B = 64, H = 1024 on an
// H200). Here the 128 blocks form 64 clusters of two. Cluster c owns units [c UC, (c + 1) UC)
// (UC = H / 64), all four gates of them; block r of the cluster multiplies K's half r,
//     P_r[n][col] = sum over k in half r of h_{t-1}[n][k] * W_hh[row(col)][k],
// with its [4 UC, H / 2] slice of W_hh resident in registers, so it reads B x H / 2 of h_{t-1}
// per step (half of what a block of one would), staged in shared memory as the A tile. Block r
// also owns units [r UO, (r + 1) UO) of the cluster (UO = UC / 2): each warp sends its partial
// sums to the owner of its columns, the partner's by st.async into its shared memory (counted
// on its mbarrier), the own block's by st.shared before a block barrier; then the owner adds
// the 8 partials of a column (2 blocks x 4 warps) in a fixed order (deterministic), adds pre and
// the bias, applies the cell, keeps c, and publishes its slice of h_t. (The first version's
// cluster barrier per step compiles to a GPU-scope MEMBAR before its arrival; trace, cycles per
// step, bf16 B = 64, two H200s, cluster barrier / st.async: H = 1024 13513 / 13239, H = 512 8394 /
// 7921, H = 256 6533 / 6271; B = 32, H = 1024 7699 / 7728.)
// The exchange between clusters is flagged, not LL: raw 16-bit pairs, then per block a step flag
// (thread 0's store after a block barrier), which a consumer's warp 0 polls for the 64 producers
// of its K half before the block loads their pairs with plain 16-byte loads. Half the bytes of
// LL words and no polling of every word: SEQKERNELS_LSTM_TRACE cycles per step (H200, bf16
// `infer`, T = 256), LL / flagged: B = 64, H = 1024 17468 / 13576; B = 64, H = 512 11893 / 8427;
// B = 32, H = 1024 11712 / 7723; B = 64, H = 256 9367 / 6525 (the wait and gather 11238 / 5258
// at B = 64, H = 1024). The flag is a hint: the pairs are poisoned until written (the kernel's
// "exchange" comment below), so no fence sits between a block's pairs and its flag. With thread
// 0's fence there (until 2026-11-27), A/B on an H200, CUDA-graph replays of 256-step `infer`
// calls, ms, fenced / poisoned: bf16 B = 16, H = 1024 0.923 / 0.844, B = 32, H = 512 0.873 /
// 0.819, B = 64, H = 512 1.190 / 1.162, H = 1024 unchanged (2.09, bound by the gather's bytes);
// TF32 B = 32, H = 1024 1.703 / 1.599, B = 64, H = 512 1.546 / 1.494.
// Warps: 2 column groups (group o: owner o's 4 UO columns, gate-major, NTW = UO / 2 n8 tiles)
// x 4 K quarters of the block's half (KSW = H / 128 k16 steps each); B rows in MT m16 tiles (MT = 1
// at B <= 16, where it takes only H = 1024, 16-bit from B = 6 and TF32 from B = 8:
// cluster_forward_applies).
// float32: with TF32, m16n8k8 on TF32 operands, h exchanged as TF32 values; without it (kX3), h
// exchanged whole and each product as three TF32 MMAs on split operands (W_hh's two parts
// resident), at float32's accuracy. At H = 1024 float32's W_hh slice takes 128 KB: with TF32 half
// of it stays in shared memory (cluster_forward_reg_ksteps) and B <= 32 (the A tile 66 KB, the
// partials 80 KB); x3 (twice the fragments) has no H = 1024 instance.
// float32 with TF32 allowed may instead multiply on fp16 tensor cores (ClusterOperands::kHalfScaled):
// fp16 has TF32's 10-bit mantissa, and its narrow exponent range is covered by powers of two,
// which scale exactly: each warp's W_hh fragments by one (their largest finite magnitude to
// [2^14, 2^15)), h0 by one per row (at the first step), and h_t for t >= 0 lies in [-1, 1]
// (o·tanh(c)). Each warp's partial sums are scaled back before they meet. A value below 2^-14 of
// its scale becomes an fp16 subnormal: absolute error <= 2^-25 of the scale, as TF32 rounding
// gives a value of that size. h then travels in 2 bytes a unit and the W_hh slice and A tile are
// the 16-bit kernel's, so B up to 64 fits at H = 1024.
// Limits: H in {256, 512, 1024} (HC, a template argument: every index is a constant), equal
// batch sizes at every step (no ragged PackedSequence), sm_90 (clusters). 128 blocks in
// clusters of two fit an H200 at one block per SM (the occupancy API: 66 clusters); in
// clusters of four only 30 would.
constexpr int kClusterForwardSlots = 8;  // partials per column: 2 blocks x 4 K quarters

// Of a warp's KSW k-steps, those whose W_hh fragments stay in registers: all, but for float32 with
// TF32 at H = 1024, whose 128 KB slice per block would leave too few registers (the 16-bit slice
// is 64 KB): half of it there, the other half in shared memory ([warp][n8 tile][k-step][lane]
// pairs, read once per step).
constexpr int cluster_forward_reg_ksteps(int ksw, bool tf32, int hc) { return tf32 && hc == 1024 ? ksw / 2 : ksw; }

// Row stride (floats) of the partials for a block's `cols` owned columns: 8 mod 32 (or 24), so
// that a half-warp's 8-byte stores of rows gq = 0..3 cover 32 distinct banks.
constexpr int cluster_forward_ldp(int cols) { return cols == 32 ? 40 : cols == 16 ? 24 : 8; }

// The cluster forward kernel's compile-time shape and shared-memory layout for (scalar_t, MT, HC):
// the kernel indexes with it and run_cluster_forward sizes the launch from it.
template <class scalar_t, int MT, int HC>
struct ClusterForwardLayout {
  static constexpr bool kFloat = std::is_same_v<scalar_t, float>;
  static constexpr int ES = sizeof(scalar_t), kStep = kFloat ? 8 : 16;  // element bytes, k per MMA
  static constexpr int UC = HC / 64, UO = UC / 2, NTW = UO / 2, KQ = HC / 2, KSW = KQ / 4 / kStep;
  static constexpr int KSR = cluster_forward_reg_ksteps(KSW, kFloat, HC), KSS = KSW - KSR;  // k-steps in registers / shared
  static constexpr int LDX = KQ + 16 / ES;  // A tile row stride (elements): 16 mod 128 bytes, conflict-free ldmatrix
  static constexpr int OC = 4 * UO, LDP = cluster_forward_ldp(OC), ROWS = 16 * MT, PAIRS = UO / 2;
  static constexpr int kRowWords = HC * ES / 4;  // 32-bit words of a row of h (unit pairs, or units for float)
  static constexpr int kSlotFloats = ROWS * LDP, kParityFloats = kClusterForwardSlots * kSlotFloats;
  // Shared memory: the A tile, the partials of both parities, two mbarriers, W_hh's k-steps KSR..
  static constexpr int kTileBytes = ROWS * LDX * ES, kPartialBytes = 2 * kParityFloats * 4;
  static constexpr int kWsmBytes = kThreads / 32 * NTW * KSS * 32 * 8;
  // kHalfScaled: the inverse scales of h0's rows (float), after the two mbarriers.
  static constexpr int kRowScaleBytes = ROWS * 4;
};

// The cluster forward kernel's exchange: step flags and raw 16-bit pairs (relaxed, at GPU scope:
// never a stale L1 line from the buffer's use four steps earlier).
__device__ __forceinline__ uint4 ld_relaxed_v4(const uint32_t* p) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_relaxed_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_u32x2(uint32_t* p, uint32_t v0, uint32_t v1) {
  asm volatile("st.relaxed.gpu.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v0), "r"(v1) : "memory");
}

// The cluster forward kernel's exchange buffers hold this word until a step's h arrives: two
// 16-bit values 0xffff (a negative NaN with every payload bit set, which no conversion of a
// float32 gives: a NaN converts to the positive canonical one) or float bits 0xffffffff (the same
// for float32, whose arithmetic gives the canonical NaN 0x7fffffff; TF32 values have their low
// 13 bits clear).
constexpr uint32_t kClusterPoison = 0xffffffffu;
constexpr int kClusterBuffers = 4;  // exchange buffers of h, by step % 4
// A published word, never the poison (which would only be such a NaN: then its positive twin).
__device__ __forceinline__ uint32_t unpoisoned(uint32_t w) { return w == kClusterPoison ? 0x7fffffffu : w; }
__device__ __forceinline__ bool poisoned(uint4 v) {
  return v.x == kClusterPoison || v.y == kClusterPoison || v.z == kClusterPoison || v.w == kClusterPoison;
}
// Re-reads the 16 bytes at p until none of their words is the poison (the slow path of the
// cluster forward kernel's gather where a thread has more than 8 words: the data of a producer
// whose step flag arrived first).
__device__ __noinline__ uint4 wait_unpoisoned(const uint32_t* p, unsigned step) {
  const long long t0 = clock64();
  while (true) {
    const uint4 v = ld_relaxed_v4(p);
    if (!poisoned(v)) return v;
    check_spin_timeout(t0, step);
  }
}

// Two adjacent elements (p 4-byte aligned for 16-bit types, 8-byte for float) in one store.
template <class T>
__device__ __forceinline__ void store_pair(T* p, T v0, T v1) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
  } else {
    *reinterpret_cast<uint32_t*>(p) = pack2(v0, v1);
  }
}

// The cluster forward kernel's partial sums (sm_90): a block's own warps store theirs with
// st.shared before a block barrier; the partner's arrive as st.async transactions (bytes) on an
// mbarrier, with no fence and no cluster barrier (whose release is a GPU-scope MEMBAR).
__device__ __forceinline__ void st_shared2(uint32_t addr, float v0, float v1) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(v0), "f"(v1) : "memory");
}

// The cluster forward kernel's MMA operand type: the dtype's, but fp16 for kHalfScaled.
template <class scalar_t, ClusterOperands kOps>
using ClusterOperandType = std::conditional_t<kOps == ClusterOperands::kHalfScaled, c10::Half, scalar_t>;

template <class scalar_t, bool kTraining, int MT, int HC, ClusterOperands kOps>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_forward_cluster_kernel(const __grid_constant__ FwdArgs<scalar_t> a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using acc_t = float;
  using Math = CudaMath;
  // float32: TF32 MMAs (m16n8k8), h exchanged and staged as TF32-rounded floats; kX3 (TF32 off):
  // h exchanged and staged whole, each product as three TF32 MMAs on split operands; kHalf: fp16
  // operands (op_t), exchanged and staged as the 16-bit types' are.
  constexpr bool kX3 = kOps == ClusterOperands::kTf32x3, kHalf = kOps == ClusterOperands::kHalfScaled;
  constexpr bool kTf32 = kX3 || kOps == ClusterOperands::kTf32;  // float operands (TF32, or whole for x3)
  using op_t = ClusterOperandType<scalar_t, kOps>;
  static_assert(std::is_same_v<scalar_t, float> == (kOps != ClusterOperands::kSixteenBit) && sizeof(op_t) <= 4,
                "cluster forward kernel: 16-bit types on their own operands, float32 on the others");
  using L = ClusterForwardLayout<op_t, MT, HC>;
  constexpr int ES = L::ES, kStep = L::kStep, H = HC, UC = L::UC, UO = L::UO, NTW = L::NTW, KQ = L::KQ;
  constexpr int KSW = L::KSW, KSR = L::KSR, KSS = L::KSS, LDX = L::LDX, OC = L::OC, LDP = L::LDP;
  constexpr int ROWS = L::ROWS, PAIRS = L::PAIRS, kRowWords = L::kRowWords;
  constexpr int kSlotFloats = L::kSlotFloats, kParityFloats = L::kParityFloats;
  static_assert(!kX3 || KSS == 0, "cluster forward kernel: x3 keeps both parts of W_hh in registers");
  static_assert((KQ * ES) % 128 == 0, "cluster forward kernel: A tile rows of 16 mod 128 bytes");
  static_assert(NTW >= 1 && KSW >= 1 && OC == 8 * NTW, "cluster forward kernel instance");
  static_assert(PAIRS * ROWS <= kThreads, "one unit pair of one row per thread");
  const Geometry& g = a.g;
  extern __shared__ __align__(16) unsigned char smem[];
  op_t* const xt = reinterpret_cast<op_t*>(smem);                      // [ROWS][LDX]: h_{t-1}, K half `rank`
  float* const recv = reinterpret_cast<float*>(smem + g.off_part);    // [2][slots][ROWS][LDP], by step parity
  uint2* const wsm = reinterpret_cast<uint2*>(smem + g.off_w);         // [warp][NTW][KSS][32]: W_hh's k-steps KSR..
  // kHalf: [ROWS] h0's inverse row scales, after the partials' two mbarriers.
  float* const row_unscale = reinterpret_cast<float*>(smem + g.off_part + L::kPartialBytes + 2 * 8);
  const int B = g.B, T = g.T;
  const int rank = static_cast<int>(blockIdx.x) & 1, cluster = static_cast<int>(blockIdx.x) >> 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  const int owner = warp & 1, kquarter = warp >> 1;

  // Rows >= B of the A tile stay zero (finite) for the whole sequence.
  for (int i = threadIdx.x; i < ROWS * LDX * ES / 16; i += kThreads) reinterpret_cast<uint4*>(smem)[i] = uint4{};

  // Resident B fragments: n8 tile nt of owner `owner`'s columns cc = nt * 8 + gq (gate cc / UO,
  // unit cluster * UC + owner * UO + cc % UO), k16 steps [kquarter * KSW, ...) of K half `rank`.
  // kX3: bsm holds the TF32 values of W_hh's remainders (tf32_part 1; an inf gives NaN there, as
  // in the direct kernel's x3 products).
  // k-steps from KSR on (float32 with TF32 at H = 1024) go to this warp's part of wsm instead.
  uint32_t bfr[NTW][KSR][2], bsm[kX3 ? NTW : 1][kX3 ? KSW : 1][2];
  uint2* const wsm_warp = wsm + warp * (NTW * KSS * 32) + lane;
  auto w_row = [&](int cc) {  // the W_hh row of column cc of this warp's n8 tiles
    return a.w_hh + static_cast<int64_t>((cc / UO) * H + cluster * UC + owner * UO + cc % UO) * H;
  };
  // kHalf: this warp's fragments scaled by w_scale, its partial sums by w_unscale (powers of two).
  float w_scale = 1.0f, w_unscale = 1.0f;
  if constexpr (kHalf) {
    float m = 0.0f;
#pragma unroll 1
    for (int nt = 0; nt < NTW; ++nt) {
      const float* wr = w_row(nt * 8 + gq) + rank * KQ + kquarter * KSW * kStep;
#pragma unroll 1
      for (int k = tq; k < KSW * kStep; k += 4) m = finite_abs_max(m, wr[k]);
    }
    power_of_two_scales(warp_max(m), w_scale, w_unscale);
  }
#pragma unroll
  for (int nt = 0; nt < NTW; ++nt) {
    const scalar_t* wr = w_row(nt * 8 + gq);
#pragma unroll
    for (int f = 0; f < KSW; ++f) {
      const int k0 = rank * KQ + (kquarter * KSW + f) * kStep;
      uint32_t b0, b1;
      if constexpr (kTf32) {  // b0 = B[tq][gq], b1 = B[tq + 4][gq]
        b0 = to_tf32(wr[k0 + tq]);
        b1 = to_tf32(wr[k0 + tq + 4]);
        if constexpr (kX3) {
          bsm[nt][f][0] = tf32_part(wr[k0 + tq], 1);
          bsm[nt][f][1] = tf32_part(wr[k0 + tq + 4], 1);
        }
      } else if constexpr (kHalf) {  // as below, of the scaled values
        auto half_of = [&](int k) { return c10::Half(wr[k] * w_scale); };
        b0 = pack2(half_of(k0 + 2 * tq), half_of(k0 + 2 * tq + 1));
        b1 = pack2(half_of(k0 + 2 * tq + 8), half_of(k0 + 2 * tq + 9));
      } else {  // b0 = B[2tq, 2tq + 1][gq], b1 = B[2tq + 8, 2tq + 9][gq]
        b0 = pack2(wr[k0 + 2 * tq], wr[k0 + 2 * tq + 1]);
        b1 = pack2(wr[k0 + 2 * tq + 8], wr[k0 + 2 * tq + 9]);
      }
      if (f < KSR) {
        bfr[nt][f < KSR ? f : 0][0] = b0;
        bfr[nt][f < KSR ? f : 0][1] = b1;
      } else {
        wsm_warp[(nt * KSS + f - KSR) * 32] = make_uint2(b0, b1);
      }
    }
  }

  // This thread's gate items: units j, j + 1 (of the block's own UO) of batch row n.
  const int pair = threadIdx.x % PAIRS, n = threadIdx.x / PAIRS;
  const bool active = n < B;
  const int j = cluster * UC + rank * UO + 2 * pair;
  acc_t c_st[2] = {0, 0}, bias_r[4][2] = {};
  scalar_t h_st[2] = {static_cast<scalar_t>(0.0f), static_cast<scalar_t>(0.0f)};
  if (active) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      c_st[e] = static_cast<acc_t>(a.c0[n * H + j + e]);
      h_st[e] = a.h0[n * H + j + e];
#pragma unroll
      for (int q = 0; q < 4; ++q) bias_r[q][e] = bias_sum(a.b_ih, a.b_hh, q * H + j + e);
    }
  }
  // pre of this step and of the next (requested before the wait for h_{t-1}). kHalf: a scaled
  // projection's (pre_unscale) row scale comes with it, its gate scales stay here (else all 1).
  float2 pv[4] = {}, pv_next[4] = {};
  float row_u = 1.0f, row_u_next = 1.0f, gate_u[4][2];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      gate_u[q][e] = kHalf && active && a.pre_unscale != nullptr
                         ? a.pre_unscale[static_cast<int64_t>(T) * B + q * H + j + e]
                         : 1.0f;
    }
  }
  auto prefetch = [&](int s, float2 (&dst)[4], float& dst_u) {
    if (active) {
      const int t = a.reverse ? T - 1 - s : s;
      const int64_t row = static_cast<int64_t>(t) * B + n;
      const acc_t* pr = a.pre + row * (4 * H) + j;
#pragma unroll
      for (int q = 0; q < 4; ++q) dst[q] = *reinterpret_cast<const float2*>(pr + q * H);
      if (kHalf && a.pre_unscale != nullptr) dst_u = a.pre_unscale[row];
    }
  };
  prefetch(0, pv, row_u);

  // ldmatrix rows: lane l gives row l % 16, bytes 16 (l / 16) of a k-step's 32 bytes (16 16-bit
  // values, or 8 floats: then the b16 pairs are TF32 values and the fragments those of m16n8k8).
  const uint32_t xt_lane = shared_address(xt) + (lane & 15) * LDX * ES + (lane >> 4) * 16;
  // This warp's slot in its owner's partials (parity 0; a shared::cluster address for the partner's,
  // shared::cta for the own block's), and the own partials of this thread's items.
  const uint32_t slot_offset = (rank * 4 + kquarter) * kSlotFloats * 4 + (gq * LDP + 2 * tq) * 4;
  const bool own_owner = owner == rank;  // warp-uniform
  const uint32_t send0 = own_owner ? shared_address(recv) + slot_offset
                                   : cluster_address(shared_address(recv), owner) + slot_offset;
  const float* const own0 = recv + n * LDP + 2 * pair;
  // The own block's 4 warps store their partials with st.shared (a block barrier follows); the
  // partner's 4 warps theirs with st.async on one mbarrier per step parity (after the partials),
  // whose phase completes when thread 0 has arrived, setting the bytes to expect, and the bytes
  // have landed.
  uint64_t* const bars = reinterpret_cast<uint64_t*>(recv + 2 * kParityFloats);
  const uint32_t send_bar0 = cluster_address(shared_address(bars), owner);  // used where !own_owner
  constexpr uint32_t kPartnerBytes = 4 * 32 * MT * NTW * 2 * 8;
  if (threadIdx.x == 0) {
    mbarrier_init(&bars[0], 1);
    mbarrier_init(&bars[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // The exchange: h_t as raw 16-bit pairs (float: TF32 or whole values), [4][B][kRowWords] words
  // by step % 4, poisoned (kClusterPoison) until written, then one step flag per block (the last
  // step it published) after a block barrier, which a consumer polls for its K half's 64
  // producers (blocks [64 rank, 64 rank + 64)) before it loads their pairs. The flag is only a
  // hint, stored without a fence: a word is h_t when it is not the poison. A producer poisons
  // step s + 2's words at step s (their step s - 2 values were read by then: every block has
  // published h_{s-1}, after reading h_{s-2}, before this block's gate math of step s), and one
  // fence after that step's block barrier orders the poison before its h_{s+1}, which every
  // reader of those words reads at step s + 2, before it reads them at step s + 3; the reader's
  // own fence of step s + 2 (every block publishes too) lies between those reads. So a consumer
  // sees the poison or h_{s+2} there, never h_{s-2}, and no fence delays a flag.
  const int64_t buf_words = static_cast<int64_t>(B) * kRowWords;
  uint32_t* const hx = reinterpret_cast<uint32_t*>(a.xbuf);
  uint32_t* const flags = hx + kClusterBuffers * buf_words;
  PhaseTrace trace;
  trace.start(a.trace);
  // Both blocks of the cluster have started before either writes the other's shared memory.
  cluster_sync();
  for (int s = 0; s < T; ++s) {
    const int t = a.reverse ? T - 1 - s : s;
    // This step's phase: the last one of this parity (step s - 2) completed before this thread's
    // gate math of step s - 2. The partner's bytes of step s may land before this arrival: the
    // phase cannot complete until it.
    if (threadIdx.x == 0) mbarrier_arrive_expect(&bars[s & 1], kPartnerBytes);
    // 1. The A tile: K half `rank` of h_{t-1} (h0 at the first step).
    if (s == 0) {
      if constexpr (kHalf) {
        // One warp per row of this K half, scaled by its own power of two (rows >= B: 1, unused).
        for (int r = warp; r < ROWS; r += kWarps) {
          const float unscale =
              r < B ? scale_row_to_half(a.h0 + static_cast<int64_t>(r) * H + rank * KQ, KQ, lane, xt + r * LDX) : 1.0f;
          if (lane == 0) row_unscale[r] = unscale;
        }
      } else {
        const int per_row = KQ / 4;  // chunks of 4 elements
        for (int i = threadIdx.x; i < B * per_row; i += kThreads) {
          const int r = i / per_row, c = (i - r * per_row) * 4;
          const scalar_t* src = a.h0 + static_cast<int64_t>(r) * H + rank * KQ + c;
          if constexpr (kX3) {  // whole: split when multiplied
            *reinterpret_cast<float4*>(xt + r * LDX + c) = *reinterpret_cast<const float4*>(src);
          } else if constexpr (kTf32) {
            const float4 v = *reinterpret_cast<const float4*>(src);
            *reinterpret_cast<uint4*>(xt + r * LDX + c) =
                make_uint4(to_tf32(v.x), to_tf32(v.y), to_tf32(v.z), to_tf32(v.w));
          } else {
            *reinterpret_cast<uint2*>(xt + r * LDX + c) = *reinterpret_cast<const uint2*>(src);
          }
        }
      }
    } else {
      // Warp 0 waits for the step flags of the 64 producers of K half `rank`, the block for warp 0.
      // With a.poll_data, no flags: every thread re-reads its poisoned words until h_{t-1} is there
      // (the flags are only hints; the poison is what tells h_{t-1} from an older step's).
      if (warp == 0 && !a.poll_data) {
        const uint32_t* fl = flags + rank * 64 + lane;
        const long long t0 = clock64();
        while (ld_relaxed_u32(fl) < static_cast<uint32_t>(s) || ld_relaxed_u32(fl + 32) < static_cast<uint32_t>(s)) {
          check_spin_timeout(t0, static_cast<unsigned>(s));
        }
      }
      __syncthreads();
      // 16-byte loads (8 units, or 4 for float), in batches of 8 per thread (registers: W_hh's
      // fragments stay live).
      constexpr int kVecUnits = 16 / ES, kVecPerRow = KQ / kVecUnits, kVecs = ROWS * kVecPerRow / kThreads;
      const uint32_t* src = hx + ((s - 1) % kClusterBuffers) * buf_words + rank * (KQ * ES / 4);
      auto word_of = [&](int e) {  // batch element e's row and 16-byte word of the K half
        const int idx = threadIdx.x + e * kThreads;
        return make_int2(idx / kVecPerRow, idx % kVecPerRow);
      };
#pragma unroll
      for (int b0 = 0; b0 < kVecs; b0 += 8) {
        uint4 v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int2 rw = word_of(b0 + e);
          if (b0 + e < kVecs && rw.x < B) v[e] = ld_relaxed_v4(src + rw.x * kRowWords + rw.y * 4);
        }
        if constexpr (kVecs <= 8) {
          // All of this thread's words are in one batch: the poisoned ones are re-read together,
          // one L2 round trip a round (re-read one at a time, a thread with 4 words at B = 16
          // paid a round trip per word after its data had come).
          unsigned pending = 0;
#pragma unroll
          for (int e = 0; e < kVecs; ++e) {
            if (word_of(e).x < B && poisoned(v[e])) pending |= 1u << e;
          }
          if (pending != 0) {
            const long long t0 = clock64();
            while (true) {
#pragma unroll
              for (int e = 0; e < kVecs; ++e) {
                const int2 rw = word_of(e);
                if (pending & (1u << e)) v[e] = ld_relaxed_v4(src + rw.x * kRowWords + rw.y * 4);
              }
#pragma unroll
              for (int e = 0; e < kVecs; ++e) {
                if ((pending & (1u << e)) && !poisoned(v[e])) pending &= ~(1u << e);
              }
              if (pending == 0) break;
              check_spin_timeout(t0, static_cast<unsigned>(s));
            }
          }
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int2 rw = word_of(b0 + e);
          if (b0 + e < kVecs && rw.x < B) {
            // More than 8 words a thread (two batches): a poisoned word is waited for alone, out
            // of line (registers).
            if (kVecs > 8 && poisoned(v[e])) v[e] = wait_unpoisoned(src + rw.x * kRowWords + rw.y * 4, s);
            *reinterpret_cast<uint4*>(xt + rw.x * LDX + rw.y * kVecUnits) = v[e];
          }
        }
      }
    }
    if (s + 1 < T) prefetch(s + 1, pv_next, row_u_next);
    __syncthreads();
    trace.mark(0);

    // 2. This warp's partial product, sent to its owner's slot of this step's parity.
    float acc[MT][NTW][4] = {};
    // kX3: h = big + small (+ O(2^-22 |h|)); small·W_big + big·W_small + big·W_big, in that order
    // for every accumulator. h_{t-1} is finite or NaN after the first step (o·tanh(c)); h0 may
    // hold an inf, and inf·W_small is NaN wherever W_hh is exact in TF32. So at the first step the
    // non-finite values of h0 count as 0 here and reach the product in a pass of their own, with
    // W_big only (inf·W as in a float32 GEMM). A third operand in this loop (big, zero where h is
    // not finite) spilled.
#pragma unroll
    for (int f = 0; f < KSW; ++f) {
      uint32_t af[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(af[mt], xt_lane + mt * 16 * LDX * ES + (kquarter * KSW + f) * 32);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (kX3) {
          uint32_t big[4], small[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = __uint_as_float(af[mt][e]);
            if (s == 0 && !isfinite(x)) x = 0.0f;
            big[e] = to_tf32(x);
            small[e] = tf32_small(x, big[e]);
          }
#pragma unroll
          for (int nt = 0; nt < NTW; ++nt) {
            MmaInst<scalar_t>::run(acc[mt][nt], small, bfr[nt][f][0], bfr[nt][f][1]);
            MmaInst<scalar_t>::run(acc[mt][nt], big, bsm[nt][f][0], bsm[nt][f][1]);
            MmaInst<scalar_t>::run(acc[mt][nt], big, bfr[nt][f][0], bfr[nt][f][1]);
          }
        } else {
#pragma unroll
          for (int nt = 0; nt < NTW; ++nt) {
            if (f < KSR) {
              MmaInst<op_t>::run(acc[mt][nt], af[mt], bfr[nt][f < KSR ? f : 0][0], bfr[nt][f < KSR ? f : 0][1]);
            } else {
              const uint2 w = wsm_warp[(nt * KSS + f - KSR) * 32];
              MmaInst<op_t>::run(acc[mt][nt], af[mt], w.x, w.y);
            }
          }
        }
      }
    }
    if constexpr (kX3) {
      if (s == 0) {  // h0's non-finite values (the others 0) times W_big
#pragma unroll
        for (int f = 0; f < KSW; ++f) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            uint32_t af[4];
            ldmatrix_x4(af, xt_lane + mt * 16 * LDX * ES + (kquarter * KSW + f) * 32);
#pragma unroll
            for (int e = 0; e < 4; ++e) af[e] = isfinite(__uint_as_float(af[e])) ? 0u : to_tf32(__uint_as_float(af[e]));
#pragma unroll
            for (int nt = 0; nt < NTW; ++nt) MmaInst<scalar_t>::run(acc[mt][nt], af, bfr[nt][f][0], bfr[nt][f][1]);
          }
        }
      }
    }
    if constexpr (kHalf) {  // back from the scaled operands (exact: powers of two)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][nt][e] *= w_unscale;
        }
        if (s == 0) {
          const float u0 = row_unscale[mt * 16 + gq], u1 = row_unscale[mt * 16 + gq + 8];
#pragma unroll
          for (int nt = 0; nt < NTW; ++nt) {
            acc[mt][nt][0] *= u0;
            acc[mt][nt][1] *= u0;
            acc[mt][nt][2] *= u1;
            acc[mt][nt][3] *= u1;
          }
        }
      }
    }
    trace.mark(1);
    // The partner reuses this parity's slots and mbarrier phase at step s + 2 only after every
    // block has published h_s (its step s + 2 waits for pairs of h_{s+1}, which need them), so
    // after this block's gate math of step s has read them.
    const uint32_t send = send0 + (s & 1) * kParityFloats * 4;
    if (own_owner) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt) {
          const uint32_t at = send + (mt * 16 * LDP + nt * 8) * 4;
          st_shared2(at, acc[mt][nt][0], acc[mt][nt][1]);
          st_shared2(at + 8 * LDP * 4, acc[mt][nt][2], acc[mt][nt][3]);
        }
      }
    } else {
      const uint32_t send_bar = send_bar0 + (s & 1) * 8;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt) {
          const uint32_t at = send + (mt * 16 * LDP + nt * 8) * 4;
          store_async(at, acc[mt][nt][0], acc[mt][nt][1], send_bar);
          store_async(at + 8 * LDP * 4, acc[mt][nt][2], acc[mt][nt][3], send_bar);
        }
      }
    }
    __syncthreads();  // the own block's partials
    mbarrier_wait_guarded(shared_address(&bars[s & 1]), (s >> 1) & 1, static_cast<unsigned>(s));  // the partner's
    trace.mark(4);

    // 3. Gate math of the own unit pair: pre + bias + the 8 partials (a fixed pairwise order).
    scalar_t h[2] = {static_cast<scalar_t>(0.0f), static_cast<scalar_t>(0.0f)};
    acc_t act_r[2][4], c_new[2];
    if (active) {
      const float* own = own0 + (s & 1) * kParityFloats;
      acc_t pq[4][2];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float2 v[kClusterForwardSlots];
#pragma unroll
        for (int sl = 0; sl < kClusterForwardSlots; ++sl) {
          v[sl] = *reinterpret_cast<const float2*>(own + sl * kSlotFloats + q * UO);
        }
#pragma unroll
        for (int w = 1; w < kClusterForwardSlots; w *= 2) {
#pragma unroll
          for (int sl = 0; sl + w < kClusterForwardSlots; sl += 2 * w) {
            v[sl].x += v[sl + w].x;
            v[sl].y += v[sl + w].y;
          }
        }
        // (kHalf: two exact products; 1 without a scaled projection)
        pq[q][0] = pv[q].x * row_u * gate_u[q][0] + bias_r[q][0] + v[0].x;
        pq[q][1] = pv[q].y * row_u * gate_u[q][1] + bias_r[q][1] + v[0].y;
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const LstmGates<acc_t> pre_g{pq[0][e], pq[1][e], pq[2][e], pq[3][e]};
        LstmGates<acc_t> act;
        acc_t m;
        lstm_cell_forward<Math>(pre_g, c_st[e], act, c_new[e], m);
        c_st[e] = c_new[e];
        h[e] = static_cast<scalar_t>(m);
        h_st[e] = h[e];
        act_r[e][0] = act.i;
        act_r[e][1] = act.f;
        act_r[e][2] = act.g;
        act_r[e][3] = act.o;
      }
    }
    trace.mark(2);
    // 4. Publish h_t (flag s + 1; float: its TF32 values) and poison step s + 2's words, then
    // the outputs.
    if (s + 1 < T) {
      const int64_t at = n * kRowWords + j * ES / 4;
      uint32_t* pub = hx + (s % kClusterBuffers) * buf_words + at;
      uint32_t* ahead = hx + ((s + 2) % kClusterBuffers) * buf_words + at;
      if constexpr (kX3) {
        if (active) st_relaxed_u32x2(pub, unpoisoned(__float_as_uint(h[0])), unpoisoned(__float_as_uint(h[1])));
      } else if constexpr (kTf32) {
        if (active) st_relaxed_u32x2(pub, to_tf32(h[0]), to_tf32(h[1]));
      } else {  // 16-bit pairs (kHalf: h_t in [-1, 1] needs no scale)
        if (active) st_relaxed_u32(pub, unpoisoned(pack2(static_cast<op_t>(h[0]), static_cast<op_t>(h[1]))));
      }
      if constexpr (kTf32) {
        if (active) st_relaxed_u32x2(ahead, kClusterPoison, kClusterPoison);
      } else {
        if (active) st_relaxed_u32(ahead, kClusterPoison);
      }
      // Every thread's pairs are stored before thread 0's flag, so that they are mostly there when
      // it arrives; the last warp's fence (the release pattern of a grid barrier, off the path of
      // the flag: that warp only waits for the next step's gather after it) orders the poison
      // before the next step's pairs.
      __syncthreads();
      if (threadIdx.x == 0) st_relaxed_u32(flags + blockIdx.x, static_cast<uint32_t>(s + 1));
      if (threadIdx.x == kThreads - 32) __threadfence();
    }
    if (active) {
      const int64_t row = static_cast<int64_t>(t) * B + n;
      store_pair(a.y + row * H + j, h[0], h[1]);
      if constexpr (kTraining) {
        scalar_t* gr = a.gates + row * (4 * H) + j;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          store_pair(gr + q * H, static_cast<scalar_t>(act_r[0][q]), static_cast<scalar_t>(act_r[1][q]));
        }
        store_pair(a.cells + row * H + j, static_cast<scalar_t>(c_new[0]), static_cast<scalar_t>(c_new[1]));
      }
    }
    trace.mark(3);
#pragma unroll
    for (int q = 0; q < 4; ++q) pv[q] = pv_next[q];
    row_u = row_u_next;
  }
  report_trace(trace, kTraining ? "forward cluster (training)" : "forward cluster (inference)", g);
  // The partner writes this block's shared memory only before this block's last wait: none waits
  // here.
  if (active) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      a.h_n[n * H + j + e] = h_st[e];
      a.c_n[n * H + j + e] = c_st[e];
    }
  }
#else
  __trap();
#endif
}

// ---------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------

int ceil_div(int a, int b) { return (a + b - 1) / b; }
int round_up(int a, int b) { return ceil_div(a, b) * b; }
size_t align16(size_t x) { return (x + 15) & ~size_t{15}; }

bool build_segments(const LstmSizes& s, SegTable& tab) {
  if (s.T > INT_MAX - 1) return false;
  tab = SegTable{};
  tab.count = 0;
  for (int64_t t = 0; t < s.T; ++t) {
    if (t == 0 || s.batch_sizes[t] != s.batch_sizes[t - 1]) {
      if (tab.count == kMaxSegments) return false;
      tab.tb[tab.count] = static_cast<int>(t);
      tab.bs[tab.count] = static_cast<int>(s.batch_sizes[t]);
      tab.ob[tab.count] = s.offsets[t];
      ++tab.count;
    }
  }
  tab.tb[tab.count] = static_cast<int>(s.T);
  return true;
}

// Geometry for U units per block; false when the resident weights or the shared memory of
// one block do not fit.
// What every geometry shares: the sizes, U units per block, and the LL exchange's row layout
// (Kx columns: h forward, dG backward; elem_size bytes per element).
void base_geometry(const LstmSizes& s, int U, int elem_size, bool backward, Geometry& g) {
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

// Geometry of the split backward kernel for U units per block; false beyond its limits
// (B > 16, H > 1024). g.nt is the n8 tiles per warp that cover Hp; the kernel instance is
// split_ntw(g.nt).
// With cl > 1, the clustered instance's geometry: clusters of cl blocks, whose partials meet in
// shared memory (false where cl does not divide the blocks).
template <class scalar_t, Path P>
bool make_split_geometry(const LstmSizes& s, const cudaDeviceProp& prop, int U, int cl, Geometry& g) {
  constexpr int sz = sizeof(scalar_t);
  if (s.B > 16 || s.H > kSplitBackwardMaxHidden) return false;
  base_geometry(s, U, sz, /*backward=*/true, g);
  if (g.nblocks % cl != 0) return false;
  g.cl = cl;
  g.nprod = g.nblocks / cl;
  g.kpc = 4 * U / MmaCfg<P, true>::kStep;  // k-steps over the own 4U gate rows
  g.nt = ceil_div(g.Hp, kWarps * 8);       // n8 tiles per warp over the Hp columns
  // LL words per row n: every producer's Hp partials, one per word (clusters) or two (without).
  g.row_words = cl > 1 ? g.nprod * g.Hp : g.nprod * g.Hp / 2;
  g.ldx = 4 * U + (sz == 2 ? 8 : 4);       // A tile row stride: conflict-free fragment loads
  size_t off = align16(static_cast<size_t>(16) * g.ldx * sz);
  g.off_red = static_cast<int>(off);
  off += static_cast<size_t>(kWarps) * 16 * U * sizeof(float);
  off = align16(off);
  if (cl > 1) {
    // Row stride = 8 mod 32 floats: a warp's 8-byte stores of rows gq = 0..3 (one half-warp)
    // cover 32 distinct banks.
    g.ldp = g.Hp + (8 - g.Hp % 32 + 32) % 32;
    g.off_part = static_cast<int>(off);
    off += 2 * 16 * static_cast<size_t>(g.ldp) * sizeof(float);
    off = align16(off);
  }
  g.off_seg = static_cast<int>(off);
  off += sizeof(SegTable);
  g.smem = static_cast<int>(off);
  return off <= prop.sharedMemPerBlockOptin;
}

// Where the split kernel is faster than the general one (both forced on an H200, T = 256,
// scripts/lstm_backend_grid.py --variants persistent-nosplit, 2026-11-24; docs/kernels.md):
// always at B = 1 (bf16 H = 1024: 2.00 against 2.09 ms per training call; TF32: 2.58 against
// 4.03), and with TF32 from H = 512 (B = 8, H = 1024: 4.75 against 5.98); slower for 16-bit
// types at B = 8 (the partials it writes and reads in fp32 are as many bytes as the 16-bit dG
// the general kernel reads, and its reduction waits on more producers) and for TF32 at H = 256.
// TF32 moves dG in 4-byte words, four times the split kernel's reads.
bool split_is_faster(const LstmSizes& s, bool half) {
  return half ? s.B * s.H <= kSplitMaxBHHalf : (s.B == 1 || s.H >= kSplitMinHiddenTf32);
}

// The compiled n8-tiles-per-warp instance of the split backward kernel that covers nt tiles.
int split_ntw(int nt) { return nt <= 2 ? 2 : nt <= 4 ? 4 : nt <= 8 ? 8 : 16; }

// The compiled k-steps-per-warp instance of the direct kernel that covers kpc k-steps.
int direct_kpc(int kpc) { return kpc <= 2 ? 2 : kpc <= 4 ? 4 : kpc <= 8 ? 8 : 16; }

// Geometry of the direct forward kernel instance <KPC, KREG> for U units per block; false where
// the call needs another instance or is beyond the kernel's limits (B > 16, more than kDirectKS
// k-steps per warp).
template <class scalar_t, Path P>
bool make_direct_geometry(const LstmSizes& s, const cudaDeviceProp& prop, int U, int KPC, int KREG, Geometry& g) {
  if (s.B > 16) return false;
  // Two elements per LL word: 16-bit values, or pairs of TF32 or x3 values (float), as if 2
  // bytes each.
  base_geometry(s, U, 2, /*backward=*/false, g);
  g.kpc = ceil_div(ceil_div(g.row_words, 8), kWarps);  // k-steps of 8 LL words per warp
  if (g.kpc > kDirectKS) return false;
  g.kpc = direct_kpc(g.kpc);  // the instance's KPC (lanes past the row load fewer)
  if (g.kpc != KPC) return false;
  if (g.wpb == 2) {  // U = 4: one 32-byte L2 sector per block's 16-byte slice (the kernel's comment)
    g.pad_shift = 1;
    g.row_words <<= 1;
  }
  g.nch = 1;
  g.nt = 4 * U / 8;  // n8 tiles of the 4U gate columns
  size_t off = align16(2 * static_cast<size_t>(kWarps) * kDirectWarp * sizeof(float));
  g.off_w = static_cast<int>(off);  // fragments of k-steps [KREG, KPC), 8 bytes per lane and MMA
  constexpr int kMaxNT = MmaCfg<Path::kMma16, false>::kNT;  // 4 n8 tiles at most, whatever the path
  off += static_cast<size_t>(kWarps) * (KPC - KREG) * direct_frags(P) * kMaxNT * 32 * sizeof(uint2);
  g.off_seg = static_cast<int>(align16(off));
  // kHalfScaled: h0's 16 row scales and their inverses after the step table.
  const size_t h0_scales = P == Path::kHalfScaled ? 32 * sizeof(float) : 0;
  g.smem = g.off_seg + static_cast<int>(sizeof(SegTable) + h0_scales);
  return static_cast<size_t>(g.smem) <= prop.sharedMemPerBlockOptin;
}

// Whether all g.nblocks blocks of the kernel (in clusters of g.cl where g.cl > 1) can be resident
// at once; prepares the kernel for its dynamic shared memory.
bool co_resident(const void* fn, const Geometry& g, const cudaDeviceProp& prop) {
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

int trace_requested() {
  const char* env = std::getenv("SEQKERNELS_LSTM_TRACE");
  return env != nullptr && env[0] != '\0' && std::string(env) != "0";
}

// Whether the persistent kernel can take the call at all (lstm.cu has chosen it already).
bool common_preconditions(const LstmSizes& s, const cudaDeviceProp& prop) {
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

// SEQKERNELS_LSTM_PERSISTENT_DIRECT=0 keeps B <= 16 on the general forward kernel: a diagnostic
// switch, so that one device run can time both forward kernels side by side.
bool direct_forward_enabled() { return switch_on("SEQKERNELS_LSTM_PERSISTENT_DIRECT"); }

// The direct forward kernel (DP: kMma16, kTf32, kTf32x3 or kHalfScaled) where one of its instances
// takes the call; false otherwise, having launched nothing.
template <class scalar_t, Path DP, bool kTraining>
bool run_direct_forward(const LstmSizes& s, const cudaDeviceProp& prop, FwdArgs<scalar_t>& args,
                        const at::Tensor& like) {
  // The kernel instance is chosen by KPC, the k-steps per warp of the geometry, and KPC
  // depends on U: try each instance with the U values that give its KPC.
  auto try_direct = [&](auto kpc_c, auto u4_c, auto rows_c) {
    constexpr int KPC = decltype(kpc_c)::value, U4 = decltype(u4_c)::value, ROWS = decltype(rows_c)::value;
    // The k-steps whose W_hh fragments stay in registers, the rest in shared memory: TF32 at 8
    // k-steps per warp half; x3 (four fragments per k-step) 3 of 8 (160 KB in shared memory at
    // 8 units per block), and 2 of 4 at 8 units per block.
    constexpr int KREG = DP == Path::kTf32x3 ? (KPC == 8 ? 3 : KPC == 4 && !U4 ? 2 : KPC)
                         : DP == Path::kTf32 && KPC == 8 ? 4
                                                          : KPC;
    auto direct = &lstm_persistent_forward_direct_kernel<scalar_t, DP, kTraining, KPC, KREG, U4, ROWS>;
    auto make = [&](int U, Geometry& g) {
      // U4 = 1 exactly at U = 4 (2 n8 tiles), 0 at U = 8 (4): the kernel's kNT, and its PAD (the
      // geometry pads the slices of U = 4 to a sector).
      return make_direct_geometry<scalar_t, DP>(s, prop, U, KPC, KREG, g) && g.nt == (U4 ? 2 : 4);
    };
    return plan(s, prop, direct, args.g, make) && launch_with_exchange(direct, args, args.xbuf, like);
  };
  auto try_each = [&](auto rows_c) {  // (KPC, U4) pairs, 4 units per block first
    return try_direct(IntConst<2>{}, IntConst<1>{}, rows_c) || try_direct(IntConst<4>{}, IntConst<1>{}, rows_c) ||
           try_direct(IntConst<8>{}, IntConst<1>{}, rows_c) || try_direct(IntConst<2>{}, IntConst<0>{}, rows_c) ||
           try_direct(IntConst<4>{}, IntConst<0>{}, rows_c) || try_direct(IntConst<8>{}, IntConst<0>{}, rows_c);
  };
  const int rows = direct_branch_free_rows(DP, s.H, s.B);
  if constexpr (DP == Path::kMma16 || DP == Path::kHalfScaled) {
    if (rows == 0) return try_each(IntConst<0>{});
  }
  return rows == 1 ? try_each(IntConst<1>{}) : try_each(IntConst<2>{});
}

// SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD (diagnostic): unset, the cluster forward kernel where
// cluster_forward_applies; 0, never (the direct kernel at B <= 16, else the general kernel); 1,
// wherever it fits (tests reach its one-tile instances at any B <= 16 with it).
int cluster_forward_mode() { return diagnostic_mode("SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD"); }

// The cluster forward kernel (bf16 / fp16, or float32 with or without TF32: kX3) where one of its
// instances takes the call (cluster_forward_applies), its vector accesses aligned (8-byte rows of
// h0 and pre and 4-byte pairs of the outputs for 16-bit types; 16-byte rows of h0, 8-byte pre and
// output pairs for float), and 64 clusters of two co-resident; false otherwise, having launched
// nothing.
template <class scalar_t, bool kTraining, ClusterOperands kOps>
bool run_cluster_forward(const LstmSizes& s, const cudaDeviceProp& prop, FwdArgs<scalar_t>& args,
                         const at::Tensor& like) {
  constexpr bool kFloat = std::is_same_v<scalar_t, float>;
  constexpr bool kX3 = kOps == ClusterOperands::kTf32x3, kHalf = kOps == ClusterOperands::kHalfScaled;
  const int mode = cluster_forward_mode();
  const int sms = prop.multiProcessorCount;
  if (mode == 0 || !(mode == 1 ? cluster_forward_fits(s, prop.major, sms, kOps)
                               : cluster_forward_applies(s, prop.major, sms, kOps))) {
    return false;
  }
  auto aligned = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  const uintptr_t pair_bytes = 2 * sizeof(scalar_t);
  if (!aligned(args.h0, kFloat ? 16 : 8) || !aligned(args.pre, 8) || !aligned(args.y, pair_bytes) ||
      (kTraining && (!aligned(args.gates, pair_bytes) || !aligned(args.cells, pair_bytes)))) {
    return false;
  }
  auto try_instance = [&](auto mt_c, auto hc_c) {
    constexpr int MT = decltype(mt_c)::value, HC = decltype(hc_c)::value;
    if constexpr (kFloat && !kHalf && HC > 512 && (kX3 || MT > 2)) {
      // float32 at H = 1024: with TF32 up to 2 m16 tiles (W_hh's 128 KB slice half in shared
      // memory beside a 66 KB A tile and 80 KB of partials); x3 keeps twice the fragments.
      return false;
    } else {
      if (s.H != HC || (s.B > 32 ? 4 : s.B > 16 ? 2 : 1) != MT) return false;
      auto kernel = &lstm_persistent_forward_cluster_kernel<scalar_t, kTraining, MT, HC, kOps>;
      const void* fn = reinterpret_cast<const void*>(kernel);
      if (!ptx_at_least(fn, 90)) return false;
      using L = ClusterForwardLayout<ClusterOperandType<scalar_t, kOps>, MT, HC>;
      Geometry& g = args.g;
      g = Geometry{};
      g.T = static_cast<int>(s.T);
      g.B = static_cast<int>(s.B);
      g.H = g.Hp = HC;
      g.U = HC / 64;  // units per cluster
      g.nblocks = kClusterForwardBlocks;
      g.cl = 2;
      g.nch = 1;
      g.row_words = L::kRowWords;
      g.off_part = static_cast<int>(align16(L::kTileBytes));
      // After the two mbarriers (and kHalf's row scales).
      g.off_w = static_cast<int>(align16(g.off_part + L::kPartialBytes + 2 * 8 + (kHalf ? L::kRowScaleBytes : 0)));
      g.smem = g.off_w + L::kWsmBytes;
      if (static_cast<size_t>(g.smem) > prop.sharedMemPerBlockOptin || !co_resident(fn, g, prop)) return false;
      // The exchange: kClusterBuffers buffers of h ([B][kRowWords] 32-bit words each), poisoned,
      // then the kClusterForwardBlocks step flags.
      const int64_t h_words = static_cast<int64_t>(kClusterBuffers) * g.B * L::kRowWords;
      return launch_with_exchange(kernel, args, args.xbuf, like, (h_words + kClusterForwardBlocks + 1) / 2,
                                  static_cast<size_t>(h_words) * 4);
    }
  };
  auto try_tiles = [&](auto hc_c) {  // 1, 2 or 4 m16 tiles of rows
    return try_instance(IntConst<1>{}, hc_c) || try_instance(IntConst<2>{}, hc_c) || try_instance(IntConst<4>{}, hc_c);
  };
  return try_tiles(IntConst<256>{}) || try_tiles(IntConst<512>{}) || try_tiles(IntConst<1024>{});
}

template <class scalar_t, Path P, bool kTraining>
bool run_forward(const LstmSizes& s, const cudaDeviceProp& prop, FwdArgs<scalar_t>& args, const at::Tensor& like) {
  if (args.pre_unscale != nullptr) {  // a scaled projection is the scaled fp16 cluster kernel's alone
    if constexpr (P == Path::kTf32) {
      return run_cluster_forward<scalar_t, kTraining, ClusterOperands::kHalfScaled>(s, prop, args, like);
    }
    return false;
  }
  if constexpr (P == Path::kTf32) {
    // float32 with TF32 allowed: scaled fp16 operands where cluster_half_products says so.
    if (cluster_half_products()) {
      if (run_cluster_forward<scalar_t, kTraining, ClusterOperands::kHalfScaled>(s, prop, args, like)) return true;
    } else if (run_cluster_forward<scalar_t, kTraining, ClusterOperands::kTf32>(s, prop, args, like)) {
      return true;
    }
  } else if constexpr (P == Path::kMma16) {
    // H <= 512: the whole layer in one cluster per 8 batch rows (lstm_one_cluster.cu), where all
    // those clusters are resident at once; not where the cluster kernel is forced.
    if (cluster_forward_mode() != 1 &&
        lstm_one_cluster_forward<scalar_t>(s, args.reverse, kTraining, args.trace != 0, args.pre, args.b_ih, args.b_hh,
                                           args.w_hh, args.h0, args.c0, args.y, args.gates, args.cells, args.h_n,
                                           args.c_n)) {
      return true;
    }
    if (run_cluster_forward<scalar_t, kTraining, ClusterOperands::kSixteenBit>(s, prop, args, like)) return true;
  } else if constexpr (std::is_same_v<scalar_t, float>) {
    // float32 with TF32 off: three TF32 MMAs per product.
    if (run_cluster_forward<scalar_t, kTraining, ClusterOperands::kTf32x3>(s, prop, args, like)) return true;
  }
  if (direct_forward_enabled()) {
    if constexpr (P == Path::kTf32) {
      // float32 with TF32 allowed: scaled fp16 operands unless SEQKERNELS_LSTM_DIRECT_HALF=0.
      if (direct_half_products() && run_direct_forward<scalar_t, Path::kHalfScaled, kTraining>(s, prop, args, like)) {
        return true;
      }
    }
    if constexpr (P != Path::kFma) {
      if (run_direct_forward<scalar_t, P, kTraining>(s, prop, args, like)) return true;
    } else if constexpr (std::is_same_v<scalar_t, float>) {
      // float32 with TF32 off: three TF32 MMAs per product (Hp <= 1024).
      if (run_direct_forward<scalar_t, Path::kTf32x3, kTraining>(s, prop, args, like)) return true;
    }
  }
  auto kernel = &lstm_persistent_forward_kernel<scalar_t, P, kTraining>;
  auto make = [&](int U, Geometry& g) { return make_geometry<scalar_t, P, false>(s, prop, U, g); };
  if (!plan(s, prop, kernel, args.g, make)) return false;
  return launch_with_exchange(kernel, args, args.xbuf, like);
}

// SEQKERNELS_LSTM_PERSISTENT_SPLIT (diagnostic, like SEQKERNELS_LSTM_PERSISTENT_DIRECT for the
// forward): unset, the split backward kernel where split_is_faster; 0, never; 1, wherever it can
// run (tests reach its code paths at any shape with it).
int split_backward_mode() { return diagnostic_mode("SEQKERNELS_LSTM_PERSISTENT_SPLIT"); }

// Whether the split backward kernel runs in clusters of cl blocks where they fit: on sm_90 and
// later, cl = 8 or 4 (8 first), from B = kSplitClusterMinBatch. SEQKERNELS_LSTM_PERSISTENT_CLUSTER
// (diagnostic, like the two above): 0, never; 4 or 8, that size only, at any B (tests reach
// each instance with it).
bool split_cluster_wanted(const LstmSizes& s, const cudaDeviceProp& prop, int cl) {
  if (prop.major < 9) return false;
  const char* env = std::getenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER");
  if (env == nullptr || env[0] == '\0') return s.B >= kSplitClusterMinBatch;
  return std::string(env) == std::to_string(cl);
}

template <class scalar_t, Path P>
bool run_backward(const LstmSizes& s, const cudaDeviceProp& prop, BwdArgs<scalar_t>& args, const at::Tensor& like) {
  if constexpr (P == Path::kMma16) {
    // H <= 512: the whole layer in one cluster per 8 batch rows (lstm_one_cluster.cu).
    if (lstm_one_cluster_backward<scalar_t>(s, args.reverse, args.trace != 0, args.w_hh, args.gates, args.cells, args.y,
                                            args.grad_y, args.h0, args.c0, args.grad_h_n, args.grad_c_n, args.dG,
                                            args.hprev, args.grad_h0, args.grad_c0)) {
      return true;
    }
  }
  if constexpr (P != Path::kFma) {
    auto try_split = [&](auto ntw_c, auto cl_c) {
      constexpr int NTW = decltype(ntw_c)::value, CL = decltype(cl_c)::value;
      auto split = [] {
        if constexpr (CL > 1) return &lstm_persistent_backward_split_cluster_kernel<scalar_t, P, NTW, CL>;
        else return &lstm_persistent_backward_split_kernel<scalar_t, P, NTW>;
      }();
      if (CL > 1 && !(split_cluster_wanted(s, prop, CL) && ptx_at_least(reinterpret_cast<const void*>(split), 90))) {
        return false;
      }
      auto make = [&](int U, Geometry& g) {
        return make_split_geometry<scalar_t, P>(s, prop, U, CL, g) && split_ntw(g.nt) == NTW;
      };
      return plan(s, prop, split, args.g, make) && launch_with_exchange(split, args, args.dbuf, like);
    };
    // The instances for 4, 8 and 16 n8 tiles per warp in clusters of cl_c blocks (1: none).
    auto try_ntw_4_to_16 = [&](auto cl_c) {
      return try_split(IntConst<4>{}, cl_c) || try_split(IntConst<8>{}, cl_c) || try_split(IntConst<16>{}, cl_c);
    };
    const int mode = split_backward_mode();
    // In clusters of 8 blocks, else 4, where they fit (instances for 4-16 n8 tiles per warp:
    // H > 128): faster than both kernels without clusters wherever they ran at B >= 4 (H200,
    // docs/kernels.md); else without clusters where split_is_faster.
    if (mode != 0 && (try_ntw_4_to_16(IntConst<8>{}) || try_ntw_4_to_16(IntConst<4>{}))) {
      return true;
    }
    if (mode == 1 || (mode == -1 && split_is_faster(s, P == Path::kMma16))) {
      if (try_split(IntConst<2>{}, IntConst<1>{}) || try_ntw_4_to_16(IntConst<1>{})) {
        return true;
      }
    }
  }
  auto kernel = &lstm_persistent_backward_kernel<scalar_t, P>;
  auto make = [&](int U, Geometry& g) { return make_geometry<scalar_t, P, true>(s, prop, U, g); };
  if (!plan(s, prop, kernel, args.g, make)) return false;
  return launch_with_exchange(kernel, args, args.dbuf, like);
}

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

template <class scalar_t>
bool lstm_persistent_forward(const LstmSizes& s, bool reverse, bool training, bool tf32,
                             const at::opmath_type<scalar_t>* pre, const float* pre_unscale, const scalar_t* b_ih,
                             const scalar_t* b_hh, const scalar_t* w_hh, const scalar_t* h0, const scalar_t* c0,
                             scalar_t* y, scalar_t* gates, scalar_t* cells, scalar_t* h_n,
                             at::opmath_type<scalar_t>* c_n, const at::Tensor& like) {
  const cudaDeviceProp& prop = *at::cuda::getCurrentDeviceProperties();
  if (!common_preconditions(s, prop)) return false;
  FwdArgs<scalar_t> args{};
  if (!build_segments(s, args.seg)) return false;
  args.trace = trace_requested();
  args.poll_data = cluster_polls_data(s);
  args.reverse = reverse;
  args.pre = pre;
  args.pre_unscale = pre_unscale;
  args.b_ih = b_ih;
  args.b_hh = b_hh;
  args.w_hh = w_hh;
  args.h0 = h0;
  args.c0 = c0;
  args.y = y;
  args.gates = gates;
  args.cells = cells;
  args.h_n = h_n;
  args.c_n = c_n;
  return with_path<scalar_t>(tf32, [&](auto path) {
    constexpr Path kPath = decltype(path)::value;
    return training ? run_forward<scalar_t, kPath, true>(s, prop, args, like)
                    : run_forward<scalar_t, kPath, false>(s, prop, args, like);
  });
}

template <class scalar_t>
bool lstm_persistent_backward(const LstmSizes& s, bool reverse, bool tf32, const scalar_t* w_hh,
                              const scalar_t* gates, const scalar_t* cells, const scalar_t* y,
                              const scalar_t* grad_y, const scalar_t* h0, const scalar_t* c0,
                              const scalar_t* grad_h_n, const scalar_t* grad_c_n, scalar_t* dG, scalar_t* hprev,
                              at::opmath_type<scalar_t>* grad_h0, at::opmath_type<scalar_t>* grad_c0,
                              const at::Tensor& like) {
  const cudaDeviceProp& prop = *at::cuda::getCurrentDeviceProperties();
  if (!common_preconditions(s, prop)) return false;
  BwdArgs<scalar_t> args{};
  if (!build_segments(s, args.seg)) return false;
  args.trace = trace_requested();
  args.reverse = reverse;
  args.w_hh = w_hh;
  args.gates = gates;
  args.cells = cells;
  args.y = y;
  args.grad_y = grad_y;
  args.h0 = h0;
  args.c0 = c0;
  args.grad_h_n = grad_h_n;
  args.grad_c_n = grad_c_n;
  args.dG = dG;
  args.hprev = hprev;
  args.grad_h0 = grad_h0;
  args.grad_c0 = grad_c0;
  return with_path<scalar_t>(tf32, [&](auto path) {
    return run_backward<scalar_t, decltype(path)::value>(s, prop, args, like);
  });
}

#define SK_INSTANTIATE_PERSISTENT(T)                                                                              \
  template bool lstm_persistent_forward<T>(const LstmSizes&, bool, bool, bool, const at::opmath_type<T>*,         \
                                           const float*, const T*, const T*, const T*, const T*, const T*, T*, T*, \
                                           T*, T*,                                                                \
                                           at::opmath_type<T>*, const at::Tensor&);                               \
  template bool lstm_persistent_backward<T>(const LstmSizes&, bool, bool, const T*, const T*, const T*, const T*, \
                                            const T*, const T*, const T*, const T*, const T*, T*, T*,             \
                                            at::opmath_type<T>*, at::opmath_type<T>*, const at::Tensor&);
SK_INSTANTIATE_PERSISTENT(float)
SK_INSTANTIATE_PERSISTENT(double)
SK_INSTANTIATE_PERSISTENT(c10::Half)
SK_INSTANTIATE_PERSISTENT(c10::BFloat16)
#undef SK_INSTANTIATE_PERSISTENT

}  // namespace cuda
}  // namespace seqkernels
