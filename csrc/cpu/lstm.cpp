// LSTM layer on the CPU: lstm_forward / lstm_backward (schemas in csrc/registration.cpp).
//
// Shape legend: T steps, N = sum(batch_sizes) packed rows, B batch, I input, H hidden,
// P projection, Hout = P or H, G = 4H gate rows ordered i, f, g, o. Step t owns packed
// rows [off_t, off_t + bt) with bt = batch_sizes[t]; batch sizes never grow with t.
//
// Forward: pre = x·W_ihᵀ + b over all N rows (one GEMM), then per step one recurrent GEMM
// accumulating h_{t-1}·W_hhᵀ onto that step's rows of pre, and one fused gate pass. The
// running state lives in hbuf [B, Hout] / cbuf [B, H]; rows b >= bt are left untouched, so
// at the end they hold each sequence's last state (h_n, c_n), and in the reverse direction
// sequences that start late pick up h0/c0 from them.
// Backward mirrors it in reverse processing order with dhbuf/dcbuf, then forms dx and the
// weight gradients as large GEMMs over all rows after the loop.
// Nothing inside a time loop allocates or goes through the ATen dispatcher.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "cpu_checks.h"
#include "blas.h"
#include "huge_pages.h"
#include "lstm_persistent.h"
#include "seqkernels/lstm_backend.h"
#include "seqkernels/lstm_cell.h"
#include "seqkernels/lstm_checks.h"
#include "seqkernels/lstm_infer.h"
#include "vec_math.h"

namespace seqkernels::cpu {
namespace {

using at::Tensor;

at::ScalarType acc_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// Rows per parallel chunk: split the batch across threads only when a chunk has enough work.
int64_t row_grain(int64_t width) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(width, 1)); }

// One fused gate pass of a step over batch rows [b0, b1) and hidden units [j0, j1).
//   pre:   [bt, G]  pre-activations of the step (acc_t), row stride ldp
//   cbuf:  [B, H]   c_{t-1} in, c_t out (acc_t)
//   m_out: [bt, H]  o ⊙ tanh(c_t): y rows without projection, W_hr's input with it
//   gates: [bt, G]  activated gates, cells: [bt, H] c_t (saved only when training); may be pre
//                   itself (ldp = G, same type): a unit's four pre values are read before any
//                   of its gates is written (so neither pointer is __restrict__)
//   h_copy: [bt, H] a second copy of m_out (the persistent loop's next h_{t-1}), or null
template <class scalar_t, bool kTraining>
void forward_gate_rows(int64_t b0, int64_t b1, int64_t j0, int64_t j1, int64_t H, const at::opmath_type<scalar_t>* pre,
                       int64_t ldp, at::opmath_type<scalar_t>* cbuf, scalar_t* m_out, scalar_t* gates, scalar_t* cells,
                       scalar_t* h_copy = nullptr) {
  using acc_t = at::opmath_type<scalar_t>;
  using Math = typename CpuMath<acc_t>::type;
  const int64_t G = 4 * H;
  for (int64_t b = b0; b < b1; ++b) {
    const acc_t* p = pre + b * ldp;
    acc_t* __restrict__ c = cbuf + b * H;
    scalar_t* __restrict__ m = m_out + b * H;
    scalar_t* gs = kTraining ? gates + b * G : nullptr;
    scalar_t* __restrict__ cs = kTraining ? cells + b * H : nullptr;
    for (int64_t j = j0; j < j1; ++j) {
      const LstmGates<acc_t> pre_j{p[j], p[H + j], p[2 * H + j], p[3 * H + j]};
      LstmGates<acc_t> act;
      acc_t c_new, m_new;
      lstm_cell_forward<Math>(pre_j, c[j], act, c_new, m_new);
      c[j] = c_new;
      m[j] = static_cast<scalar_t>(m_new);
      if (h_copy) h_copy[b * H + j] = m[j];
      if constexpr (kTraining) {
        gs[j] = static_cast<scalar_t>(act.i);
        gs[H + j] = static_cast<scalar_t>(act.f);
        gs[2 * H + j] = static_cast<scalar_t>(act.g);
        gs[3 * H + j] = static_cast<scalar_t>(act.o);
        cs[j] = static_cast<scalar_t>(c_new);
      }
    }
  }
}

// One fused backward gate pass of a step over batch rows [b0, b1) and hidden units [j0, j1).
//   gates: [bt, G] saved activations, cells: [bt, H] c_t of the step
//   prev_cells: rows b < n_prev take c_{t-1} from prev_cells[b], the others from c0[b]
//   dm: [bt, H] dL/dm_t; dcbuf: [B, H] dL/dc_t in, dL/dc_{t-1} out
//   dpre: [bt, G] dL/d(pre-activations); m_out: [bt, H] recomputed m (projection only)
template <class scalar_t, bool kProj>
void backward_gate_rows(int64_t b0, int64_t b1, int64_t j0, int64_t j1, int64_t H, const scalar_t* gates, const scalar_t* cells,
                        const scalar_t* prev_cells, int64_t n_prev, const scalar_t* c0,
                        const at::opmath_type<scalar_t>* dm, at::opmath_type<scalar_t>* dcbuf, scalar_t* dpre,
                        scalar_t* m_out) {
  using acc_t = at::opmath_type<scalar_t>;
  using Math = typename CpuMath<acc_t>::type;
  const int64_t G = 4 * H;
  for (int64_t b = b0; b < b1; ++b) {
    const scalar_t* __restrict__ a = gates + b * G;
    const scalar_t* __restrict__ c = cells + b * H;
    const scalar_t* __restrict__ cp = b < n_prev ? prev_cells + b * H : c0 + b * H;
    const acc_t* __restrict__ dmb = dm + b * H;
    acc_t* __restrict__ dc = dcbuf + b * H;
    scalar_t* __restrict__ dp = dpre + b * G;
    scalar_t* __restrict__ mb = kProj ? m_out + b * H : nullptr;
    for (int64_t j = j0; j < j1; ++j) {
      const LstmGates<acc_t> act{static_cast<acc_t>(a[j]), static_cast<acc_t>(a[H + j]),
                                 static_cast<acc_t>(a[2 * H + j]), static_cast<acc_t>(a[3 * H + j])};
      LstmGates<acc_t> d;
      acc_t dc_prev, m;
      lstm_cell_backward<Math>(act, static_cast<acc_t>(c[j]), static_cast<acc_t>(cp[j]), dmb[j], dc[j], d, dc_prev, m);
      dc[j] = dc_prev;
      dp[j] = static_cast<scalar_t>(d.i);
      dp[H + j] = static_cast<scalar_t>(d.f);
      dp[2 * H + j] = static_cast<scalar_t>(d.g);
      dp[3 * H + j] = static_cast<scalar_t>(d.o);
      if constexpr (kProj) mb[j] = static_cast<scalar_t>(m);
    }
  }
}

template <class Fn>
void for_rows(int64_t rows, int64_t width, const Fn& fn) {
  at::parallel_for(0, rows, row_grain(width), fn);
}

template <class scalar_t>
void forward_loop(const LstmSizes& s, bool reverse, bool training, const scalar_t* w_hh, const scalar_t* w_hr,
                  at::opmath_type<scalar_t>* pre, scalar_t* hbuf, at::opmath_type<scalar_t>* cbuf, scalar_t* y,
                  scalar_t* gates, scalar_t* cells, scalar_t* mbuf, at::opmath_type<scalar_t>* proj_acc) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t H = s.H, G = s.G, P = s.P, Hout = s.Hout;
  for (int64_t step = 0; step < s.T; ++step) {
    const int64_t t = reverse ? s.T - 1 - step : step;
    const int64_t bt = s.batch_sizes[t], off = s.offsets[t];
    acc_t* pre_t = pre + off * G;
    gemm(Trans::No, Trans::Yes, bt, G, Hout, hbuf, Hout, w_hh, Hout, acc_t(1), pre_t, G);
    scalar_t* m_out = P > 0 ? mbuf : y + off * Hout;
    scalar_t* gates_t = training ? gates + off * G : nullptr;
    scalar_t* cells_t = training ? cells + off * H : nullptr;
    for_rows(bt, G, [&](int64_t b0, int64_t b1) {
      if (training) {
        forward_gate_rows<scalar_t, true>(b0, b1, 0, H, H, pre_t, G, cbuf, m_out, gates_t, cells_t);
      } else {
        forward_gate_rows<scalar_t, false>(b0, b1, 0, H, H, pre_t, G, cbuf, m_out, gates_t, cells_t);
      }
    });
    scalar_t* y_t = y + off * Hout;
    if (P > 0) {
      gemm(Trans::No, Trans::Yes, bt, P, H, mbuf, H, w_hr, H, acc_t(0), proj_acc, P);
      for (int64_t k = 0; k < bt * P; ++k) y_t[k] = static_cast<scalar_t>(proj_acc[k]);
    }
    std::memcpy(hbuf, y_t, sizeof(scalar_t) * bt * Hout);
  }
}

// Which time loop runs: SEQKERNELS_LSTM_BACKEND=auto (default) | persistent | gemm.
// The persistent loop covers float32 (with a projection too: forward_persistent_projected,
// backward_persistent_projected); other cases always take the BLAS ("gemm") loop, which handles
// everything. Under auto the persistent loop also needs
// enough steps to pay for packing the weights, which it does on every call (a pass over W_hh,
// and over W_ih where the projection runs in the loop; the backward packs W_hh again).
// Measured on the 2-core AVX-512 EPYC (Zen 4), both loops interleaved in one process,
// H 256 / 512 / 1024, B 1 / 8 / 64: at T = 1 (an LSTMCell step) the BLAS loop was faster in
// 14 of 15 cells, by 2-40% (the persistent loop by 2% at B = 64, H = 512 `infer`); from B = 8
// the persistent loop won from T = 3-4 in both modes; below B = 8, where its products are
// matrix-vector products, from T = 4-8 (B = 1, H = 512 `infer`: 0.77x the BLAS loop at T = 2,
// 0.67x at T = 4, 1.21x at T = 8, 1.54x at T = 16).
constexpr int64_t kPersistentMinSteps = 4;
constexpr int64_t kPersistentMinStepsSmallBatch = 8;  // B < kPersistentSmallBatch
constexpr int64_t kPersistentSmallBatch = 8;
// Where step t's c_{t-1} lives (the backward's gate passes): rows b < n of the neighbouring step's
// saved cells (`rows`, row stride H), the other rows (sequences that start at t) in c0.
template <class T>
struct PrevCells {
  const T* rows;
  int64_t n;
};
template <class T>
PrevCells<T> prev_cells(const LstmSizes& s, bool reverse, int64_t t, const T* cells, const T* c0) {
  const int64_t src_t = reverse ? t + 1 : t - 1;
  if (src_t < 0 || src_t >= s.T) return {c0, 0};
  return {cells + s.offsets[src_t] * s.H, std::min(s.batch_sizes[t], s.batch_sizes[src_t])};
}

// Whether a persistent loop that can run this call (`supported`) does: forced, or under auto
// where it pays (above).
bool persistent_loop_wanted(const LstmSizes& s, bool supported) {
  const LstmBackend backend = lstm_backend_from_env();
  if (backend == LstmBackend::kPersistent) return supported;
  if (backend == LstmBackend::kAuto) {
    const int64_t min_steps = s.B < kPersistentSmallBatch ? kPersistentMinStepsSmallBatch : kPersistentMinSteps;
    return supported && s.B <= kPersistentMaxBatch && s.T >= min_steps;
  }
  return false;
}
// The float32 loops take the persistent loop with a projection too (forward_persistent_projected,
// backward_persistent_projected).
bool use_persistent_forward(const LstmSizes& s, at::ScalarType dtype) {
  return persistent_loop_wanted(s, dtype == at::kFloat);
}
// The float32 backward's: the forward's rule, but with a projection under auto only below
// kProjectedBackwardBatch rows, where backward_persistent_projected's dot products beat the BLAS
// loop's three GEMM calls a step. 2-core AVX2 EPYC, proj_size = 128, T = 256, the backward op alone
// (the same forward's saved tensors), both loops alternating in one process, persistent / BLAS, two
// runs: B = 1 0.67-0.91 at H = 256, 0.69-0.81 at H = 512; B = 4 0.72 / 0.78 (one run); B = 8
// 0.89-0.91 / 0.90-0.93; B = 16 0.90-0.97 / 1.00-1.01; B = 32 1.09 / 1.07 (one run). Before its dot
// products took rows in blocks of 4 (row_dots), B = 8, H = 512 was 1.14 (bench_lstm.py `train`,
// alternating builds: B = 64 25-30 % slower).
constexpr int64_t kProjectedBackwardBatch = 16;
bool use_persistent_backward(const LstmSizes& s, at::ScalarType dtype) {
  if (s.P > 0 && s.B >= kProjectedBackwardBatch && lstm_backend_from_env() == LstmBackend::kAuto) return false;
  return use_persistent_forward(s, dtype);
}
// Whether the bfloat16 loop on AMX (below) can run this layer: no projection, whole groups of 16
// units, a CPU with AMX (and AVX-512, whose gate math it uses), SEQKERNELS_CPU_AMX not 0.
bool amx_bf16_supported(const LstmSizes& s, at::ScalarType dtype) {
  return dtype == at::kBFloat16 && s.P == 0 && s.H % amx::kTileCols == 0 && cpu_kernels() == CpuKernels::kAvx512 &&
         amx_mode() != 0;
}
// bfloat16 and float16 layers that no loop of their own runs (float16 always; bfloat16 that
// the AMX loop does not support) take the float32 persistent loop on float32 copies of their
// operands wherever that loop would run a float32 layer: the conversions are exact, each
// product of two half values is exact in float32, and the loop keeps h in float32 between steps
// where the BLAS loop rounds it to the half type, so the results are as close to float64 or
// closer. The BLAS loop runs a MKL half-precision GEMM per step (W repacked on every call) and
// scalar gate math: 2-core Xeon, B = 8, H = 256 `infer`, float16 23.9 ms against 8.1 this way
// (nn.LSTM 17.6).
bool half_via_float_loop(const LstmSizes& s, at::ScalarType dtype) {
  const bool half = dtype == at::kHalf || (dtype == at::kBFloat16 && !amx_bf16_supported(s, dtype));
  return half && persistent_loop_wanted(s, s.P == 0);
}

#if defined(SEQKERNELS_HAVE_AMX)
// The bfloat16 forward's persistent loop on AMX (lstm_persistent.h, "bfloat16 on AMX") where it
// is supported (amx_bf16_supported) and the persistent loops' rule applies. Both forwards save
// the same tensors (y, the activations and c in bfloat16), so either backward can follow either
// forward.
// Under auto a single row needs kAmxBf16MinStepsOneRow steps: MKL's bfloat16 matrix-vector
// product is fast, and the loop's fixed cost (packing both weights) takes that long to repay
// (2-core Xeon, `infer` ms, BLAS loop / AMX loop: H = 512, T = 8 0.45 / 0.62, T = 16 0.61 / 0.71,
// T = 32 0.99 / 1.00, T = 256 5.5 / 4.0; H = 256, T = 16 0.22 / 0.24, T = 32 0.34 / 0.33; at B = 2
// the AMX loop already won at T = 8, 0.32 / 0.24).
// (Such a single short sequence takes the BLAS loop, not the float32 loop: half_via_float_loop
// leaves every layer the AMX loop supports to it or to the BLAS loop; on the float32 loop it ran
// 2-3x slower than on the BLAS loop, H = 512, T = 8 1.46 against 0.54 ms.)
constexpr int64_t kAmxBf16MinStepsOneRow = 32;
bool amx_bf16_loop_applies(const LstmSizes& s, at::ScalarType dtype) {
  if (lstm_backend_from_env() == LstmBackend::kAuto && s.B == 1 && s.T < kAmxBf16MinStepsOneRow) return false;
  return persistent_loop_wanted(s, amx_bf16_supported(s, dtype));
}
// Its backward on AMX as well (backward_persistent_bf16), where the hidden units come in whole
// blocks of 64 (the column groups of amx_bf16_columns_product); else the BLAS loop's.
constexpr int64_t kAmxBf16BackwardUnits = amx::kGroupTiles * amx::kTileCols;
bool amx_bf16_backward_applies(const LstmSizes& s, at::ScalarType dtype) {
  return s.H % kAmxBf16BackwardUnits == 0 && amx_bf16_loop_applies(s, dtype);
}
#endif

// run_steps over parts that own hidden units: fn(j0, j1, step) for each part's units [j0, j1)
// (part_units in tiles of `tile`), parts without units skipped.
template <class Fn>
void run_unit_steps(int64_t parts, int64_t steps, int64_t H, int64_t tile, const Fn& fn) {
  run_steps(parts, steps, [&](int64_t part, int64_t step) {
    const UnitRange units = part_units(part, parts, H, tile);
    if (units.j0 < units.j1) fn(units.j0, units.j1, step);
  });
}

// Parts of the persistent loop: one per thread, or kPartsPerThread per thread from
// kSplitPartsBatch rows, so that a thread done with its own parts of a step can take another
// thread's last ones (run_steps) instead of waiting at the barrier. On the 2-core AVX2 EPYC
// the two cores' speeds drift apart by up to 2x for seconds at a time (another tenant); at
// B = 64, H = 256 `infer` one part per thread ran at 198 ms on two threads against 256 ms on
// one, and nn.LSTM at 153 ms. Below kSplitPartsBatch a part's step is too short (~10 µs at
// B = 8, H = 256) to pay for moving its weight slice to another core's cache.
constexpr int64_t kPartsPerThread = 4;
constexpr int64_t kSplitPartsBatch = 16;
int64_t persistent_parts(int64_t H, int64_t tile, int64_t B) {
  const int64_t tiles = (H + tile - 1) / tile;
  const int64_t per_thread = B >= kSplitPartsBatch ? kPartsPerThread : 1;
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads() * per_thread, tiles));
}

// The input projection computed inside the persistent loop: each part adds x_t·W_ihᵀ + b
// for its own units at the start of the step. Where it applies this beats one large GEMM
// before the loop: the products run at the tile kernel's speed, the W_ih slice stays in the
// part's cache, and no [N, 4H] buffer is written, read back, or page-faulted in (64 MB at
// T = 256, B = 64, H = 256). It needs rows to amortise reading W_ih every step: at least
// kFuseProjectionMinBatch (below, the per-step products are matrix-vector products), and
// kFuseProjectionStreamBatch when a part's W_ih and W_hh slices together do not fit its L2,
// so that W_ih streams from L3 every step. Measured on a 2-core Xeon (2 MB L2), `infer`, ms
// unfused / fused: H = 512 (4 MB per part) B = 8 34.7 / 49.8, B = 16 66.9 / 73.6, B = 32
// 124.5 / 119.4, B = 64 251 / 228; H = 256 (1 MB per part) B = 8 7.7 / 7.6.
constexpr int64_t kFuseProjectionMinBatch = 4;
constexpr int64_t kFuseProjectionStreamBatch = 32;
// (elem_bytes: the packed weights' element size, 2 for the bfloat16 loop; same rule, measured
// there on the same Xeon: B = 8, H = 512, 2 MB per part, `infer` 12.7 ms before the loop /
// 14.5 ms inside it; H = 256 (512 KB) 3.5 / 2.8; B = 64, H = 256 24.0 / 16.7.)
bool fuse_projection(const LstmSizes& s, int64_t parts, int64_t elem_bytes = sizeof(float)) {
  if (s.B < kFuseProjectionMinBatch) return false;
  if (s.B >= kFuseProjectionStreamBatch) return true;
  const int64_t units = (s.H + parts - 1) / parts;
  return (s.I + s.H) * 4 * units * elem_bytes < l2_cache_bytes();  // with room for the rest of the step
}
// The scratch rows are padded by one cache line: with G a multiple of 1024 floats, the
// rows and gates of a block of accumulators otherwise fall in the same few L1 sets.
inline int64_t fused_pre_stride(int64_t G) { return G + 16; }
struct LoopProjection {
  const float* x;         // [N, I]
  const float* w_packed;  // W_ih in pack_gate_weights layout
  const float* bias;      // [G] b_ih + b_hh, or null
  int64_t I;
};
// The recurrent products on AMX (amx_products): W_hh packed by amx_pack_gate_weights, and
// h_{t-1} as A parts ([3][B][amx::a_row_stride(H)] bfloat16) in two buffers by step parity: each
// part splits its own units of h_t after its gate pass, for the next step.
struct AmxRecurrence {
  const uint16_t* w_packed;
  uint16_t* h_split[2];
};

// The persistent forward's gate pass of a part (forward_gate_rows on its units [j0, j1), rows
// [0, bt)) with the kernels of `kernels`; m_t to m_out and again to h_copy [bt, H] (row stride H),
// which may be m_out itself (the projected forward: one store of the same value twice).
template <bool kTraining>
void gate_pass(CpuKernels kernels, int64_t bt, int64_t j0, int64_t j1, int64_t H, float* pre_t, int64_t ldp,
               float* cbuf, float* m_out, float* gates_t, float* cells_t, float* h_copy) {
#if defined(__x86_64__) || defined(_M_X64)
  if (kernels == CpuKernels::kAvx512) {
    return avx512::gate_rows<kTraining>(bt, j0, j1, H, pre_t, ldp, cbuf, m_out, gates_t, cells_t, h_copy);
  }
#endif
#if defined(SEQKERNELS_AVX2_GATES)
  gate_rows_avx2<kTraining>(bt, j0, j1, H, pre_t, ldp, cbuf, m_out, gates_t, cells_t, h_copy);
#else
  // (Its m_out is __restrict__: no second pointer to it.)
  forward_gate_rows<float, kTraining>(0, bt, j0, j1, H, pre_t, ldp, cbuf, m_out, gates_t, cells_t,
                                      h_copy == m_out ? nullptr : h_copy);
#endif
}

// Forward time loop of the persistent path. h ping-pongs between hb[0] and hb[1] so that
// a part can write h_t while others still read h_{t-1}; rows b >= bt are carried over.
// Returns the buffer that holds h_n.
//   w_packed: W_hh in pack_gate_weights layout of `kernels`
//   pre: [N, G] with the input projection, or with `proj`, [B, G] scratch of row stride
//   fused_pre_stride(G)
//   hb0/hb1 [B, H] (hb0 = h0); cbuf [B, H] (= c0); y [N, H]; gates [N, G] / cells [N, H] when training
//   amx: the recurrent products on AMX instead (w_packed unused), or null
template <bool kTraining>
float* forward_persistent(const LstmSizes& s, bool reverse, CpuKernels kernels, const float* w_packed,
                          const LoopProjection* proj, const AmxRecurrence* amx, float* pre, float* hb0, float* hb1,
                          float* cbuf, float* y, float* gates, float* cells) {
  const int64_t H = s.H, G = s.G, B = s.B;
  const int64_t tile = unit_tile(kernels);
  const int64_t parts = persistent_parts(H, tile, s.B);
  [[maybe_unused]] const int64_t a_ld = amx::a_row_stride(H), a_part = B * a_ld;  // amx's A parts
  float* hb[2] = {hb0, hb1};
  run_unit_steps(parts, s.T, H, tile, [&](int64_t j0, int64_t j1, int64_t step) {
    const int64_t t = reverse ? s.T - 1 - step : step;
    const int64_t bt = s.batch_sizes[t], off = s.offsets[t];
    const float* hin = hb[step & 1];
    float* hout = hb[(step + 1) & 1];
    const int64_t ldp = proj ? fused_pre_stride(G) : G;
    float* pre_t = proj ? pre : pre + off * G;
    if (proj) {
      // The bias is where the accumulators start (AccStart::kBias): no per-step copy of it.
      part_product(kernels, H, proj->I, bt, j0, j1, proj->x + off * proj->I, proj->I, proj->w_packed, pre_t, ldp,
                   AccStart::kBias, proj->bias);
    }
#if defined(SEQKERNELS_HAVE_AMX)
    if (amx) {
      amx_units_product(H, H, amx->h_split[step & 1], a_part, bt, j0, j1, amx->w_packed, pre_t, ldp, nullptr);
    } else
#endif
    {
      part_product(kernels, H, H, bt, j0, j1, hin, H, w_packed, pre_t, ldp);
    }
    // h_t goes to y and, from the same registers, to the next step's h_{t-1}.
    gate_pass<kTraining>(kernels, bt, j0, j1, H, pre_t, ldp, cbuf, y + off * H, kTraining ? gates + off * G : nullptr,
                         kTraining ? cells + off * H : nullptr, hout);
    const size_t bytes = sizeof(float) * (j1 - j0);
    for (int64_t b = bt; b < B; ++b) std::memcpy(hout + b * H + j0, hin + b * H + j0, bytes);
#if defined(SEQKERNELS_HAVE_AMX)
    // The next step's A parts of these units, every row: in the reverse direction a step may
    // have more rows than the one before (the carried rows: h0 of sequences that start late).
    if (amx) {
      for (int64_t j = j0; j < j1; j += amx::kTileCols) {
        amx::split_columns(hout, H, B, j, std::min(amx::kTileCols, j1 - j), a_ld, a_part,
                           amx->h_split[(step + 1) & 1]);
      }
    }
#endif
  });
  return hb[s.T & 1];
}

// a·b over n floats (eight-lane partial sums in two streams, then the tail).
inline float dot_floats(const float* a, const float* b, int64_t n) {
  v8f acc0 = splat8(0.0f), acc1 = splat8(0.0f);
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    acc0 += load8(a + k) * load8(b + k);
    acc1 += load8(a + k + 8) * load8(b + k + 8);
  }
  for (; k + 8 <= n; k += 8) acc0 += load8(a + k) * load8(b + k);
  acc0 += acc1;
  float sum = 0.0f;
  for (int i = 0; i < 8; ++i) sum += acc0[i];
  for (; k < n; ++k) sum += a[k] * b[k];
  return sum;
}

// out[r] = (row r of a, row stride lda) · w over n floats for r < kRows: w is loaded once for all
// rows (the projected backward's dot products, a block of rows against one weight row).
template <int kRows>
inline void dot_rows(const float* a, int64_t lda, const float* w, int64_t n, float (&out)[kRows]) {
  v8f acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = splat8(0.0f);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const v8f wv = load8(w + k);
    for (int r = 0; r < kRows; ++r) acc[r] += load8(a + r * lda + k) * wv;
  }
  for (int r = 0; r < kRows; ++r) {
    float sum = 0.0f;
    for (int i = 0; i < 8; ++i) sum += acc[r][i];
    for (int64_t kk = k; kk < n; ++kk) sum += a[r * lda + kk] * w[kk];
    out[r] = sum;
  }
}

// For rows [0, rows) and weight rows [c0, c1): out[b * ldo + c] = a[b]·w[c] over n floats (the projected
// loops' products: h_t = m_t·W_hrᵀ forward, dL/dh and dL/dm backward). Blocks of 4 rows, each against
// every weight row in turn: the block's rows stay in L1 while the weight rows stream (a weight row per
// column and block, not per row).
inline void row_dots(const float* a, int64_t lda, int64_t rows, const float* w, int64_t c0, int64_t c1, int64_t n,
                     float* out, int64_t ldo) {
  constexpr int kBlock = 4;
  int64_t b = 0;
  for (; b + kBlock <= rows; b += kBlock) {
    for (int64_t c = c0; c < c1; ++c) {
      float o[kBlock];
      dot_rows<kBlock>(a + b * lda, lda, w + c * n, n, o);
      for (int r = 0; r < kBlock; ++r) out[(b + r) * ldo + c] = o[r];
    }
  }
  for (; b < rows; ++b) {
    for (int64_t c = c0; c < c1; ++c) out[b * ldo + c] = dot_floats(a + b * lda, w + c * n, n);
  }
}

// The persistent forward with a projection (P > 0): each step in two phases, each ended by
// run_steps' barrier. Phase 0, a part's units as forward_persistent (W_hh packed with K = P,
// h_{t-1} [B, P]), m_t into mbuf [B, H]. Phase 1, a part's columns [p0, p1) of h_t = m_t·W_hrᵀ
// (W_hr row-major [P, H], which stays in the part's cache) into y and the next step's h buffer;
// rows b >= bt carry over as in forward_persistent (row_dots into y, then copied to h). Before it a
// projected call ran the BLAS
// loop: two GEMM calls and a gate pass a step, 19.5 µs a step at B = 1, H = 256, P = 128 (2-core
// EPYC, docs/benchmarks.md). Returns the buffer that holds h_n.
//   hb0 / hb1 [B, P] (hb0 = h0); y [N, P]; the rest as forward_persistent
template <bool kTraining>
float* forward_persistent_projected(const LstmSizes& s, bool reverse, CpuKernels kernels, const float* w_packed,
                                    const LoopProjection* proj, const float* w_hr, float* pre, float* hb0, float* hb1,
                                    float* mbuf, float* cbuf, float* y, float* gates, float* cells) {
  const int64_t H = s.H, G = s.G, B = s.B, P = s.P;
  const int64_t tile = unit_tile(kernels);
  const int64_t parts = persistent_parts(H, tile, B);
  float* hb[2] = {hb0, hb1};
  run_steps(parts, 2 * s.T, [&](int64_t part, int64_t phase_step) {
    const int64_t step = phase_step / 2;
    const int64_t t = reverse ? s.T - 1 - step : step;
    const int64_t bt = s.batch_sizes[t], off = s.offsets[t];
    const float* hin = hb[step & 1];
    float* hout = hb[(step + 1) & 1];
    if (phase_step % 2 == 0) {
      const UnitRange units = part_units(part, parts, H, tile);
      if (units.j0 == units.j1) return;
      const int64_t ldp = proj ? fused_pre_stride(G) : G;
      float* pre_t = proj ? pre : pre + off * G;
      if (proj) {
        part_product(kernels, H, proj->I, bt, units.j0, units.j1, proj->x + off * proj->I, proj->I, proj->w_packed,
                     pre_t, ldp, AccStart::kBias, proj->bias);
      }
      part_product(kernels, H, P, bt, units.j0, units.j1, hin, P, w_packed, pre_t, ldp);
      gate_pass<kTraining>(kernels, bt, units.j0, units.j1, H, pre_t, ldp, cbuf, mbuf,
                           kTraining ? gates + off * G : nullptr, kTraining ? cells + off * H : nullptr, mbuf);
      return;
    }
    const UnitRange cols = part_units(part, parts, P, 1);
    if (cols.j0 == cols.j1) return;
    float* y_t = y + off * P;
    row_dots(mbuf, H, bt, w_hr, cols.j0, cols.j1, H, y_t, P);
    const size_t bytes = sizeof(float) * (cols.j1 - cols.j0);
    for (int64_t b = 0; b < bt; ++b) std::memcpy(hout + b * P + cols.j0, y_t + b * P + cols.j0, bytes);
    for (int64_t b = bt; b < B; ++b) std::memcpy(hout + b * P + cols.j0, hin + b * P + cols.j0, bytes);
  });
  return hb[s.T & 1];
}

#if defined(SEQKERNELS_HAVE_AMX)
// A bfloat16 tensor's data as the raw 16-bit words the AMX helpers take.
const uint16_t* bf16_bits(const Tensor& t) { return reinterpret_cast<const uint16_t*>(t.const_data_ptr()); }
uint16_t* bf16_bits(Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

// The A operands of the bfloat16 loop's step products, two buffers by step parity, rows of
// a_row_stride(K) bfloat16 (zero where nothing is written): h_{t-1} at column h_col, and with
// the input projection inside the loop (x non-null) x_t in columns [0, I) and h from column
// h_col = padded_k(I), the product then running over K = h_col + H against [W_ih | 0 | W_hh].
struct Bf16Operands {
  uint16_t* buf[2];
  int64_t K, h_col;
  const uint16_t* x;  // [N, I], or null: the input projection already in pre
  int64_t I;
  int64_t ld() const { return amx::a_row_stride(K); }
};

// Forward time loop of the bfloat16 persistent path on AMX (lstm_persistent.h, "bfloat16 on
// AMX"), as forward_persistent: each part owns whole groups of 16 units, computes its columns
// of the step's pre-activations (from the input projection in pre, or from the bias with x_t
// in the product), then runs their gate pass, which writes h_t into the next step's A operand.
// Rows b >= bt are carried over. Returns the buffer that holds h_n (at column ops.h_col).
//   w_packed: amx_pack_gate_weights_bf16 of W_hh (K = H) or of [W_ih | 0 | W_hh] (x in the loop)
//   pre: [N, G] float32 with the input projection, or with x, [B, ldp] scratch; bias: [G] (x
//   in the loop: zero if the layer has none); cbuf [B, H] float32 (= c0); y [N, H]; gates
//   [N, G] / cells [N, H] when training
template <bool kTraining>
uint16_t* forward_persistent_bf16(const LstmSizes& s, bool reverse, const uint16_t* w_packed, const Bf16Operands& ops,
                                  float* pre, int64_t ldp, const float* bias, float* cbuf, uint16_t* y,
                                  uint16_t* gates, uint16_t* cells) {
  const int64_t H = s.H, G = s.G, B = s.B, ld = ops.ld();
  const int64_t parts = persistent_parts(H, amx::kTileCols, B);
  auto step_time = [&](int64_t step) { return reverse ? s.T - 1 - step : step; };
  run_unit_steps(parts, s.T, H, amx::kTileCols, [&](int64_t j0, int64_t j1, int64_t step) {
    const int64_t t = step_time(step);
    const int64_t bt = s.batch_sizes[t], off = s.offsets[t];
    const uint16_t* hin = ops.buf[step & 1];
    uint16_t* hout = ops.buf[(step + 1) & 1];
    float* pre_t = ops.x ? pre : pre + off * G;
    if (ops.x) {
      amx_bf16_units_product(H, ops.K, hin, bt, j0, j1, w_packed, bias, 0, pre_t, ldp);
      // The next step's x rows, by the part of the first units (no other part reads hout now).
      if (j0 == 0 && step + 1 < s.T) {
        const int64_t tn = step_time(step + 1);
        amx::copy_rows_bf16(ops.x + s.offsets[tn] * ops.I, ops.I, s.batch_sizes[tn], ops.I, hout, ld);
      }
    } else {
      amx_bf16_units_product(H, ops.K, hin, bt, j0, j1, w_packed, pre_t, ldp, pre_t, ldp);
    }
    gate_rows_bf16<kTraining>(bt, j0, j1, H, pre_t, ldp, cbuf, y + off * H, kTraining ? gates + off * G : nullptr,
                              kTraining ? cells + off * H : nullptr, hout + ops.h_col, ld);
    const size_t bytes = sizeof(uint16_t) * (j1 - j0);
    for (int64_t b = bt; b < B; ++b) std::memcpy(hout + b * ld + ops.h_col + j0, hin + b * ld + ops.h_col + j0, bytes);
  });
  return ops.buf[s.T & 1];
}

// lstm_forward_cpu on the bfloat16 persistent path (amx_bf16_loop_applies). Where
// fuse_projection says so (as for the float32 loop) the input projection runs inside the loop:
// no [N, G] float32 buffer (64 MB at T = 256, B = 64, H = 256) to write, page-fault in and read
// back; else one product over all N rows before the loop.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> lstm_forward_amx_bf16(
    const LstmSizes& s, const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
    const std::optional<Tensor>& b_ih, const std::optional<Tensor>& b_hh, bool reverse, bool training) {
  // Named for the profiler (tests check which loop ran).
  RECORD_FUNCTION("seqkernels::lstm_forward_amx_bf16", std::vector<c10::IValue>());
  const auto opts = x.options();
  const int64_t saved = training ? s.N : 0;
  const bool fused = fuse_projection(s, persistent_parts(s.H, amx::kTileCols, s.B), sizeof(c10::BFloat16));
  Tensor y = on_huge_pages(at::empty({s.N, s.H}, opts));
  Tensor cbuf = c0.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  Tensor gates = on_huge_pages(at::empty({saved, s.G}, opts));
  Tensor cells = on_huge_pages(at::empty({saved, s.H}, opts));
  Tensor bias = s.has_bias ? b_ih->to(at::kFloat) + b_hh->to(at::kFloat) : at::zeros({s.G}, opts.dtype(at::kFloat));
  Tensor pre, w_packed;
  Bf16Operands ops{};
  int64_t ldp = s.G;
  if (fused) {
    const int64_t h_col = amx::padded_k(s.I);
    ops.K = h_col + s.H;
    ops.h_col = h_col;
    ops.x = bf16_bits(x);
    ops.I = s.I;
    const Tensor w_cat = at::cat({w_ih, at::zeros({s.G, h_col - s.I}, opts), w_hh}, 1);
    w_packed = amx_pack_gate_weights_bf16(w_cat.const_data_ptr<c10::BFloat16>(), s.H, ops.K);
    ldp = fused_pre_stride(s.G);
    pre = at::empty({s.B, ldp}, opts.dtype(at::kFloat));
  } else {
    ops.K = s.H;
    pre = on_huge_pages(at::empty({s.N, s.G}, opts.dtype(at::kFloat)));
    const Tensor w_ih_packed = amx_pack_gate_weights_bf16(w_ih.const_data_ptr<c10::BFloat16>(), s.H, s.I);
    amx_bf16_input_projection(x.const_data_ptr<c10::BFloat16>(), s.N, s.I, s.H, bf16_bits(w_ih_packed),
                              bias.const_data_ptr<float>(), pre.data_ptr<float>());
    w_packed = amx_pack_gate_weights_bf16(w_hh.const_data_ptr<c10::BFloat16>(), s.H, s.H);
  }
  const int64_t ld = ops.ld();
  Tensor hb = at::zeros({2, s.B, ld}, opts);  // what nothing writes stays zero
  ops.buf[0] = bf16_bits(hb);
  ops.buf[1] = ops.buf[0] + s.B * ld;
  amx::copy_rows_bf16(bf16_bits(h0), s.H, s.B, s.H, ops.buf[0] + ops.h_col, ld);
  if (fused) {
    const int64_t t0 = reverse ? s.T - 1 : 0;
    amx::copy_rows_bf16(ops.x + s.offsets[t0] * s.I, s.I, s.batch_sizes[t0], s.I, ops.buf[0], ld);
  }
  auto run = training ? &forward_persistent_bf16<true> : &forward_persistent_bf16<false>;
  const uint16_t* h_last =
      run(s, reverse, bf16_bits(w_packed), ops, pre.data_ptr<float>(), ldp, bias.const_data_ptr<float>(),
          cbuf.data_ptr<float>(), bf16_bits(y), training ? bf16_bits(gates) : nullptr,
          training ? bf16_bits(cells) : nullptr);
  Tensor h_n = hb.select(0, h_last == ops.buf[0] ? 0 : 1).narrow(1, ops.h_col, s.H).contiguous();
  return {y, h_n, cbuf.to(at::kBFloat16), gates, cells};
}

// Backward time loop of the bfloat16 persistent path on AMX, as backward_persistent: step s
// first finishes step s - 1 (dL/dh_{t-1} = dG_t·W_hh for the part's own units, which needs
// every part's dG_t), then runs the gate backward of step s. dG goes to dpre and, for the next
// step's product, to A layout in two buffers by step parity. Parts own whole blocks of 64 units.
//   w_hh [G, H]; gates [N, G]; cells [N, H]; c0 [B, H]; grad_y [N, H] (bfloat16)
//   dh [B, H] (= grad_h_n in, grad_h0 out); dc [B, H] (= grad_c_n in, grad_c0 out) (float32)
//   dpre [N, G] bfloat16 out
void backward_persistent_bf16(const LstmSizes& s, bool reverse, const uint16_t* w_hh, const uint16_t* gates,
                              const uint16_t* cells, const uint16_t* c0, const uint16_t* grad_y, float* dh, float* dc,
                              uint16_t* dpre) {
  RECORD_FUNCTION("seqkernels::lstm_backward_amx_bf16", std::vector<c10::IValue>());
  const int64_t H = s.H, G = s.G, d_ld = amx::a_row_stride(G);
  const int64_t parts = persistent_parts(H, kAmxBf16BackwardUnits, s.B);
  at::Tensor w_packed = at::empty({amx::packed_numel_bf16(H / kAmxBf16BackwardUnits, G)}, at::kBFloat16);
  amx::pack_cols_major_bf16(w_hh, H, G, H, bf16_bits(w_packed));
  const uint16_t* w = bf16_bits(std::as_const(w_packed));
  at::Tensor d_split = at::zeros({2, s.B, d_ld}, at::kBFloat16);  // the padding past G stays zero
  uint16_t* d_parts[2] = {bf16_bits(d_split), nullptr};
  d_parts[1] = d_parts[0] + s.B * d_ld;
  auto step_time = [&](int64_t step) { return reverse ? step : s.T - 1 - step; };
  run_unit_steps(parts, s.T + 1, H, kAmxBf16BackwardUnits, [&](int64_t j0, int64_t j1, int64_t step) {
    if (step > 0) {
      amx_bf16_columns_product(G, d_parts[(step - 1) & 1], s.batch_sizes[step_time(step - 1)], j0, j1, w, dh, H);
    }
    if (step == s.T) return;
    const int64_t t = step_time(step);
    const int64_t bt = s.batch_sizes[t], off = s.offsets[t];
    const auto [prev_rows, n_prev] = prev_cells(s, reverse, t, cells, c0);
    backward_gate_rows_bf16(bt, j0, j1, H, gates + off * G, cells + off * H, prev_rows, n_prev, c0, dh,
                            grad_y + off * H, dc, dpre + off * G, d_parts[step & 1], d_ld);
  });
}

#endif  // SEQKERNELS_HAVE_AMX

// Backward time loop of the persistent path. Step s of run_steps first finishes
// processing step s - 1 (dL/dh_{t-1} = dpre_t·W_hh for the part's own units, which needs
// every part's dpre_t: hence after the barrier), then runs the gate backward of step s.
//   w_hh [G, H]; gates [N, G]; cells [N, H]; c0 [B, H]; grad_y [N, H]
//   dh [B, H] (= grad_h_n in, grad_h0 out); dc [B, H] (= grad_c_n in, grad_c0 out); dpre [N, G]
//   amx: dL/dh_{t-1} on AMX (amx_products; implies the AVX-512 kernels): W_hh packed by
//   amx_pack_columns, and each step's dpre as A parts ([3][B][a_row_stride(G)] bfloat16, two
//   buffers by step parity), each part splitting its own gate columns after its gate pass.
void backward_persistent(const LstmSizes& s, bool reverse, const float* w_hh, const float* gates, const float* cells,
                         const float* c0, const float* grad_y, float* dh, float* dc, float* dpre, bool amx) {
  const int64_t H = s.H, G = s.G;
  const CpuKernels kernels = cpu_kernels();
  const int64_t tile = backward_unit_tile(kernels);
  const int64_t parts = persistent_parts(H, tile, s.B);
  Tensor w_grad_packed, d_split;
  uint16_t* d_parts[2] = {nullptr, nullptr};
  const int64_t d_ld = amx ? amx::a_row_stride(G) : 0, d_part = s.B * d_ld;
#if defined(SEQKERNELS_HAVE_AMX)
  if (amx) {
    w_grad_packed = amx_pack_columns(w_hh, H, G, H);
    d_split = at::zeros({2 * amx::kSplitParts * d_part}, at::kBFloat16);  // the padding stays zero
    d_parts[0] = reinterpret_cast<uint16_t*>(d_split.data_ptr());
    d_parts[1] = d_parts[0] + amx::kSplitParts * d_part;
  } else
#endif
  {
    w_grad_packed = recurrent_grad_weights(kernels, w_hh, H);
  }
  const float* w_grad = amx ? nullptr : w_grad_packed.const_data_ptr<float>();
  auto step_time = [&](int64_t step) { return reverse ? step : s.T - 1 - step; };
  run_unit_steps(parts, s.T + 1, H, tile, [&](int64_t j0, int64_t j1, int64_t step) {
    if (step > 0) {
      const int64_t tp = step_time(step - 1);
#if defined(SEQKERNELS_HAVE_AMX)
      if (amx) {
        amx_columns_product(G, H, d_parts[(step - 1) & 1], d_part, s.batch_sizes[tp], j0, j1,
                            reinterpret_cast<const uint16_t*>(w_grad_packed.const_data_ptr()), dh, H);
      } else
#endif
      {
        part_recurrent_grad(kernels, s.batch_sizes[tp], H, j0, j1, dpre + s.offsets[tp] * G, w_grad, dh);
      }
    }
    if (step == s.T) return;
    const int64_t t = step_time(step);
    const int64_t bt = s.batch_sizes[t], off = s.offsets[t];
    const auto [prev_rows, n_prev] = prev_cells(s, reverse, t, cells, c0);
#if defined(__x86_64__) || defined(_M_X64)
    if (kernels == CpuKernels::kAvx512) {
      avx512::backward_gate_rows(bt, j0, j1, H, gates + off * G, cells + off * H, prev_rows, n_prev, c0, dh,
                                 grad_y + off * H, dc, dpre + off * G);
#if defined(SEQKERNELS_HAVE_AMX)
      // The next step's A parts of this part's gate columns.
      if (amx) {
        for (int64_t g = 0; g < 4; ++g) {
          for (int64_t j = j0; j < j1; j += amx::kTileCols) {
            amx::split_columns(dpre + off * G, G, bt, g * H + j, std::min(amx::kTileCols, j1 - j), d_ld, d_part,
                               d_parts[step & 1]);
          }
        }
      }
#endif
      return;
    }
#endif
#if defined(SEQKERNELS_AVX2_GATES)
    backward_gate_rows_avx2(bt, j0, j1, H, gates + off * G, cells + off * H, prev_rows, n_prev, c0, dh,
                            grad_y + off * H, dc, dpre + off * G);
#else
    for (int64_t b = 0; b < bt; ++b)
      for (int64_t j = j0; j < j1; ++j) dh[b * H + j] += grad_y[(off + b) * H + j];
    backward_gate_rows<float, false>(0, bt, j0, j1, H, gates + off * G, cells + off * H, prev_rows, n_prev, c0, dh,
                                     dc, dpre + off * G, nullptr);
#endif
  });
}

// The persistent backward with a projection (P > 0): the projected forward's two phases a step,
// reversed, each ended by run_steps' barrier. Phase 0, a part's columns [p0, p1) of dL/dh: after the
// first step the previous step's rows' dL/dh = dpre·W_hh (which needs every part's dpre: hence after
// the barrier), then + grad_y of this step's rows, into dh and dh_all. Phase 1, a part's units:
// dL/dm = dh·W_hr for them (dot products over P), then the gate backward (m_t recomputed into m_all).
// One more phase 0 after the last step leaves grad_h0 in dh. The BLAS loop ran three GEMM calls and a
// gate pass a step (backward_loop); the GEMMs' set-up dominates at small B.
//   w_hh_t [P, G] (W_hh transposed); w_hr_t [H, P] (W_hr transposed); gates [N, G]; cells [N, H];
//   c0 [B, H]; grad_y [N, P]; dh [B, P] (= grad_h_n in, grad_h0 out); dc [B, H] (= grad_c_n in, grad_c0
//   out); dpre [N, G], dh_all [N, P], m_all [N, H] out; dm [B, H] scratch
void backward_persistent_projected(const LstmSizes& s, bool reverse, const float* w_hh_t, const float* w_hr_t,
                                   const float* gates, const float* cells, const float* c0, const float* grad_y,
                                   float* dh, float* dc, float* dpre, float* dh_all, float* m_all, float* dm) {
  const int64_t H = s.H, G = s.G, P = s.P;
  const int64_t tile = backward_unit_tile(cpu_kernels());
  const int64_t parts = persistent_parts(H, tile, s.B);
  auto step_time = [&](int64_t step) { return reverse ? step : s.T - 1 - step; };
  run_steps(parts, 2 * s.T + 1, [&](int64_t part, int64_t phase_step) {
    const int64_t step = phase_step / 2;
    if (phase_step % 2 == 0) {
      const UnitRange cols = part_units(part, parts, P, 1);
      if (cols.j0 == cols.j1) return;
      if (step > 0) {  // dL/dh_{t-1} through W_hh, for the rows of the step before
        const int64_t tp = step_time(step - 1);
        row_dots(dpre + s.offsets[tp] * G, G, s.batch_sizes[tp], w_hh_t, cols.j0, cols.j1, G, dh, P);
      }
      if (step == s.T) return;
      const int64_t t = step_time(step), off = s.offsets[t];
      for (int64_t b = 0; b < s.batch_sizes[t]; ++b) {
        for (int64_t p = cols.j0; p < cols.j1; ++p) {
          const float v = dh[b * P + p] + grad_y[(off + b) * P + p];
          dh[b * P + p] = v;
          dh_all[(off + b) * P + p] = v;
        }
      }
      return;
    }
    const UnitRange units = part_units(part, parts, H, tile);
    if (units.j0 == units.j1) return;
    const int64_t t = step_time(step), bt = s.batch_sizes[t], off = s.offsets[t];
    row_dots(dh, P, bt, w_hr_t, units.j0, units.j1, P, dm, H);
    const auto [prev_rows, n_prev] = prev_cells(s, reverse, t, cells, c0);
    backward_gate_rows<float, true>(0, bt, units.j0, units.j1, H, gates + off * G, cells + off * H, prev_rows, n_prev,
                                    c0, dm, dc, dpre + off * G, m_all + off * H);
  });
}

// pre [N, G] = x·W_ihᵀ + (b_ih + b_hh) of all N rows, one GEMM (acc_t: float for half inputs).
template <class scalar_t>
Tensor input_projection(const LstmSizes& s, const Tensor& x, const Tensor& w_ih, const Tensor& bias) {
  using acc_t = at::opmath_type<scalar_t>;
  Tensor pre = on_huge_pages(at::empty({s.N, s.G}, x.options().dtype(c10::CppTypeToScalarType<acc_t>::value)));
  if (bias.defined()) pre.copy_(bias.expand({s.N, s.G}));
  gemm(Trans::No, Trans::Yes, s.N, s.G, s.I, x.const_data_ptr<scalar_t>(), s.I, w_ih.const_data_ptr<scalar_t>(), s.I,
       acc_t(bias.defined() ? 1 : 0), pre.data_ptr<acc_t>(), s.G);
  return pre;
}

// A float32 copy (half_via_float_loop).
Tensor as_float(const Tensor& t) { return t.to(at::kFloat); }
std::optional<Tensor> as_float(const std::optional<Tensor>& t) {
  return t.has_value() ? std::optional<Tensor>(as_float(*t)) : std::nullopt;
}

// input_projection's pre [N, G] on AMX (float32; amx_sequence_products).
Tensor amx_input_projection_tensor(const LstmSizes& s, const Tensor& x, const Tensor& w_ih, const Tensor& bias) {
  Tensor pre = on_huge_pages(at::empty({s.N, s.G}, x.options()));
#if defined(SEQKERNELS_HAVE_AMX)
  const Tensor packed = amx_pack_gate_weights(w_ih.const_data_ptr<float>(), s.H, s.I);
  amx_input_projection(x.const_data_ptr<float>(), s.N, s.I, s.H, reinterpret_cast<const uint16_t*>(packed.const_data_ptr()),
                       bias.defined() ? bias.const_data_ptr<float>() : nullptr, pre.data_ptr<float>());
#else
  TORCH_CHECK(false, "seqkernels: built without AMX support");
#endif
  return pre;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> lstm_forward_cpu(
    const Tensor& x, const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
    const Tensor& w_hh, const std::optional<Tensor>& b_ih, const std::optional<Tensor>& b_hh,
    const std::optional<Tensor>& w_hr, bool reverse, bool training) {
  const LstmSizes s = check_lstm_forward(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr);
  check_cpu(x, "seqkernels.lstm");
  const auto acc = acc_dtype(x.scalar_type());
  const auto opts = x.options();
  const int64_t saved = training ? s.N : 0;
  const bool persistent = use_persistent_forward(s, x.scalar_type());
#if defined(SEQKERNELS_HAVE_AMX)
  if (amx_bf16_loop_applies(s, x.scalar_type())) {
    return lstm_forward_amx_bf16(s, x, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, training);
  }
#endif
  if (half_via_float_loop(s, x.scalar_type())) {
    RECORD_FUNCTION("seqkernels::lstm_forward_half_via_float", std::vector<c10::IValue>());  // tests check it ran
    const auto [y32, h_n, c_n, gates32, cells32] =
        lstm_forward_cpu(as_float(x), batch_sizes, as_float(h0), as_float(c0), as_float(w_ih), as_float(w_hh),
                         as_float(b_ih), as_float(b_hh), w_hr, reverse, training);
    const auto dtype = x.scalar_type();
    return {y32.to(dtype), h_n.to(dtype), c_n.to(dtype), gates32.to(dtype), cells32.to(dtype)};
  }

  // Buffers, all allocated before the time loop.
  // The [N, ...] buffers on huge pages where the OS offers them (huge_pages.h).
  Tensor y = on_huge_pages(at::empty({s.N, s.Hout}, opts));
  Tensor hbuf = h0.clone();
  Tensor cbuf = c0.to(acc, /*non_blocking=*/false, /*copy=*/true);
  Tensor cells = on_huge_pages(at::empty({saved, s.H}, opts));
  Tensor bias = s.has_bias ? b_ih->to(acc) + b_hh->to(acc) : Tensor();

  if (persistent) {  // implies float32
    const CpuKernels kernels = cpu_kernels();
    const int64_t tile = unit_tile(kernels);
    // AMX (amx_x3.h; its gate passes are the AVX-512 ones): the whole-sequence input projection
    // (amx_sequence_products) and the step products (amx_products); not with a projection.
    const AmxUse amx_choice = s.P == 0 ? amx_use(kernels, s.N, s.B, s.H) : AmxUse{false, false};
    const bool amx_sequence = amx_choice.sequence, amx = amx_choice.steps;
    const bool fused_projection = !amx && fuse_projection(s, persistent_parts(s.H, tile, s.B));
    Tensor pre, gates;
    Tensor w_ih_packed, w_hh_packed, h_split;
    LoopProjection proj{};
    AmxRecurrence amx_recurrence{};
    if (fused_projection) {
      pre = at::empty({s.B, fused_pre_stride(s.G)}, opts);
      w_ih_packed = at::empty({packed_gate_weights_numel(s.H, s.I, tile)}, opts);
      pack_gate_weights(w_ih.const_data_ptr<float>(), s.H, s.I, tile, packs_gate_pairs(kernels),
                        w_ih_packed.data_ptr<float>());
      proj = {x.const_data_ptr<float>(), w_ih_packed.const_data_ptr<float>(),
              s.has_bias ? bias.const_data_ptr<float>() : nullptr, s.I};
      gates = on_huge_pages(at::empty({saved, s.G}, opts));
    } else {
      pre = amx_sequence ? amx_input_projection_tensor(s, x, w_ih, bias) : input_projection<float>(s, x, w_ih, bias);
      // The saved gates take pre's place: a step's gate pass reads its pre rows and writes
      // the activations over them, all four gates of a unit before any store (gate_rows).
      // Saves an [N, G] buffer's memory and first-touch page faults per training call.
      gates = training ? pre : at::empty({0, s.G}, opts);
    }
#if defined(SEQKERNELS_HAVE_AMX)
    if (amx) {
      w_hh_packed = amx_pack_gate_weights(w_hh.const_data_ptr<float>(), s.H, s.H);
      const int64_t ld = amx::a_row_stride(s.H), part = s.B * ld;
      h_split = at::zeros({2 * amx::kSplitParts * part}, opts.dtype(at::kBFloat16));  // the padding stays zero
      uint16_t* split = reinterpret_cast<uint16_t*>(h_split.data_ptr());
      amx::split_rows(hbuf.const_data_ptr<float>(), s.H, s.B, s.H, split);
      amx_recurrence = {reinterpret_cast<const uint16_t*>(w_hh_packed.const_data_ptr()),
                        {split, split + amx::kSplitParts * part}};
    }
#endif
    if (!amx) {  // (K = Hout: W_hh [G, P] with a projection)
      w_hh_packed = at::empty({packed_gate_weights_numel(s.H, s.Hout, tile)}, opts);
      pack_gate_weights(w_hh.const_data_ptr<float>(), s.H, s.Hout, tile, packs_gate_pairs(kernels),
                        w_hh_packed.data_ptr<float>());
    }
    Tensor hb1 = at::empty_like(hbuf);
    float* gates_p = training ? gates.data_ptr<float>() : nullptr;
    float* cells_p = training ? cells.data_ptr<float>() : nullptr;
    float* h_n = nullptr;
    if (s.P > 0) {
      RECORD_FUNCTION("seqkernels::lstm_forward_persistent_projected", std::vector<c10::IValue>());  // tests check it ran
      Tensor mbuf = at::empty({s.B, s.H}, opts);
      auto run = training ? &forward_persistent_projected<true> : &forward_persistent_projected<false>;
      h_n = run(s, reverse, kernels, w_hh_packed.const_data_ptr<float>(), fused_projection ? &proj : nullptr,
                w_hr->const_data_ptr<float>(), pre.data_ptr<float>(), hbuf.data_ptr<float>(), hb1.data_ptr<float>(),
                mbuf.data_ptr<float>(), cbuf.data_ptr<float>(), y.data_ptr<float>(), gates_p, cells_p);
    } else {
      auto run = training ? &forward_persistent<true> : &forward_persistent<false>;
      h_n = run(s, reverse, kernels, amx ? nullptr : w_hh_packed.const_data_ptr<float>(),
                fused_projection ? &proj : nullptr, amx ? &amx_recurrence : nullptr, pre.data_ptr<float>(),
                hbuf.data_ptr<float>(), hb1.data_ptr<float>(), cbuf.data_ptr<float>(), y.data_ptr<float>(), gates_p,
                cells_p);
    }
    if (h_n != hbuf.data_ptr<float>()) hbuf = hb1;
    return {y, hbuf, cbuf.to(x.scalar_type()), gates, cells};
  }

  Tensor gates = on_huge_pages(at::empty({saved, s.G}, opts));
  Tensor mbuf = at::empty({s.P > 0 ? s.B : 0, s.H}, opts);
  Tensor proj_acc = at::empty({s.B, s.P}, opts.dtype(acc));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "seqkernels_lstm_forward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    Tensor pre = input_projection<scalar_t>(s, x, w_ih, bias);
    forward_loop<scalar_t>(s, reverse, training, w_hh.const_data_ptr<scalar_t>(),
                           s.P > 0 ? w_hr->const_data_ptr<scalar_t>() : nullptr, pre.data_ptr<acc_t>(),
                           hbuf.data_ptr<scalar_t>(), cbuf.data_ptr<acc_t>(), y.data_ptr<scalar_t>(),
                           training ? gates.data_ptr<scalar_t>() : nullptr,
                           training ? cells.data_ptr<scalar_t>() : nullptr,
                           s.P > 0 ? mbuf.data_ptr<scalar_t>() : nullptr, proj_acc.data_ptr<acc_t>());
  });
  return {y, hbuf, cbuf.to(x.scalar_type()), gates, cells};
}

// h_{t-1} of every packed row (the right operand of dW_hh), gathered after the fact:
// forward direction: step t-1's y rows (h0 at t = 0); reverse: step t+1's y rows for the
// sequences still running there, h0 for those that start at t.
template <class scalar_t>
void gather_prev_hidden(const LstmSizes& s, bool reverse, const scalar_t* y, const scalar_t* h0, scalar_t* hprev) {
  const int64_t Hout = s.Hout;
  at::parallel_for(0, s.T, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t bt = s.batch_sizes[t], off = s.offsets[t];
      const int64_t src_t = reverse ? t + 1 : t - 1;
      const bool has_src = src_t >= 0 && src_t < s.T;
      const int64_t n_from_y = has_src ? std::min(bt, s.batch_sizes[has_src ? src_t : 0]) : 0;
      if (n_from_y > 0) {
        std::memcpy(hprev + off * Hout, y + s.offsets[src_t] * Hout, sizeof(scalar_t) * n_from_y * Hout);
      }
      if (bt > n_from_y) {
        std::memcpy(hprev + (off + n_from_y) * Hout, h0 + n_from_y * Hout, sizeof(scalar_t) * (bt - n_from_y) * Hout);
      }
    }
  });
}

// dW_hh [G, Hout] = Σ_rows dpre_rowᵀ · h_{t-1, row}. Where every step has all B rows, h_{t-1} of
// steps 1..T-1 (forward; 0..T-2 reverse) is y shifted by one step, read in place, and the
// first step's is h0: two GEMMs. Otherwise h_{t-1} is gathered into an [N, Hout] buffer first.
template <class scalar_t>
void weight_grad_hh(const LstmSizes& s, bool reverse, const scalar_t* dpre, const scalar_t* y, const scalar_t* h0,
                    at::opmath_type<scalar_t>* dw_hh) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t G = s.G, Hout = s.Hout, N = s.N, B = s.B;
  if (all_steps_full(s)) {
    const int64_t shifted = N - B;  // rows whose h_{t-1} is a y row
    const scalar_t* dpre_from_y = dpre + (reverse ? 0 : B) * G;
    const scalar_t* dpre_from_h0 = dpre + (reverse ? shifted : 0) * G;
    if (shifted > 0) {
      gemm(Trans::Yes, Trans::No, G, Hout, shifted, dpre_from_y, G, y + (reverse ? B : 0) * Hout, Hout, acc_t(0),
           dw_hh, Hout);
    }
    gemm(Trans::Yes, Trans::No, G, Hout, B, dpre_from_h0, G, h0, Hout, acc_t(shifted > 0 ? 1 : 0), dw_hh, Hout);
    return;
  }
  Tensor hprev = on_huge_pages(at::empty({N, Hout}, at::TensorOptions().dtype(c10::CppTypeToScalarType<scalar_t>::value)));
  scalar_t* hprev_p = hprev.data_ptr<scalar_t>();
  gather_prev_hidden<scalar_t>(s, reverse, y, h0, hprev_p);
  gemm(Trans::Yes, Trans::No, G, Hout, N, dpre, G, hprev_p, Hout, acc_t(0), dw_hh, Hout);
}

// Backward time loop of the BLAS path, in reverse processing order.
//   w_hh [G, Hout]; w_hr [P, H] or null; gates [N, G]; cells [N, H]; c0 [B, H]; grad_y [N, Hout]
//   dh [B, Hout] (= grad_h_n in, grad_h0 out); dc [B, H] (= grad_c_n in, grad_c0 out)
//   dpre [N, G] out; with projection: dh_all [N, P] and m_all [N, H] out, dm [B, H] scratch
template <class scalar_t>
void backward_loop(const LstmSizes& s, bool reverse, const scalar_t* w_hh, const scalar_t* w_hr,
                   const scalar_t* gates, const scalar_t* cells, const scalar_t* c0, const scalar_t* grad_y,
                   at::opmath_type<scalar_t>* dh, at::opmath_type<scalar_t>* dc, scalar_t* dpre, scalar_t* dh_all,
                   scalar_t* m_all, at::opmath_type<scalar_t>* dm_buf) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t H = s.H, G = s.G, P = s.P, Hout = s.Hout;
  for (int64_t step = 0; step < s.T; ++step) {
    const int64_t t = reverse ? step : s.T - 1 - step;
    const int64_t bt = s.batch_sizes[t], off = s.offsets[t];
    // dL/dh_t = recurrent part (dh; h_n's gradient for sequences ending here) + y's.
    const scalar_t* gy_t = grad_y + off * Hout;
    for (int64_t k = 0; k < bt * Hout; ++k) dh[k] += static_cast<acc_t>(gy_t[k]);
    const acc_t* dm = dh;
    if (P > 0) {
      scalar_t* dh_t = dh_all + off * P;
      for (int64_t k = 0; k < bt * P; ++k) dh_t[k] = static_cast<scalar_t>(dh[k]);
      gemm(Trans::No, Trans::No, bt, H, P, dh_t, P, w_hr, H, acc_t(0), dm_buf, H);
      dm = dm_buf;
    }
    const auto [prev_rows, n_prev] = prev_cells(s, reverse, t, cells, c0);
    scalar_t* dpre_t = dpre + off * G;
    for_rows(bt, G, [&](int64_t b0, int64_t b1) {
      if (P > 0) {
        backward_gate_rows<scalar_t, true>(b0, b1, 0, H, H, gates + off * G, cells + off * H, prev_rows, n_prev, c0,
                                           dm, dc, dpre_t, m_all + off * H);
      } else {
        backward_gate_rows<scalar_t, false>(b0, b1, 0, H, H, gates + off * G, cells + off * H, prev_rows, n_prev, c0,
                                            dm, dc, dpre_t, nullptr);
      }
    });
    // dL/dh_{t-1} through W_hh.
    gemm(Trans::No, Trans::No, bt, Hout, G, dpre_t, G, w_hh, Hout, acc_t(0), dh, Hout);
  }
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> lstm_backward_cpu(
    const Tensor& grad_y, const Tensor& grad_h_n, const Tensor& grad_c_n, const Tensor& x, const Tensor& batch_sizes,
    const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh, const std::optional<Tensor>& w_hr,
    const Tensor& y, const Tensor& gates, const Tensor& cells, bool reverse, bool has_bias) {
  const LstmSizes s =
      check_lstm_backward(grad_y, grad_h_n, grad_c_n, x, batch_sizes, h0, c0, w_ih, w_hh, w_hr, y, gates, cells, has_bias);
  check_cpu(x, "seqkernels.lstm");
  const auto dtype = x.scalar_type();
  const auto acc = acc_dtype(dtype);
  const auto opts = x.options();
  const int64_t H = s.H, G = s.G, P = s.P, Hout = s.Hout, N = s.N, I = s.I;
  const bool persistent = use_persistent_backward(s, dtype);
#if defined(SEQKERNELS_HAVE_AMX)
  const bool amx_bf16 = amx_bf16_backward_applies(s, dtype);
#else
  const bool amx_bf16 = false;
#endif
  if (!amx_bf16 && half_via_float_loop(s, dtype)) {
    RECORD_FUNCTION("seqkernels::lstm_backward_half_via_float", std::vector<c10::IValue>());
    const auto [dx32, dh0, dc0, dw_ih32, dw_hh32, dbias32, dw_hr32] =
        lstm_backward_cpu(as_float(grad_y), as_float(grad_h_n), as_float(grad_c_n), as_float(x), batch_sizes,
                          as_float(h0), as_float(c0), as_float(w_ih), as_float(w_hh), w_hr, as_float(y),
                          as_float(gates), as_float(cells), reverse, has_bias);
    return {dx32.to(dtype), dh0.to(dtype), dc0.to(dtype), dw_ih32.to(dtype), dw_hh32.to(dtype), dbias32.to(dtype),
            dw_hr32.to(dtype)};
  }

  // Buffers, all allocated before the time loop.
  Tensor dhbuf = grad_h_n.to(acc, false, /*copy=*/true);
  Tensor dcbuf = grad_c_n.to(acc, false, /*copy=*/true);
  // The [N, ...] buffers on huge pages where the OS offers them (huge_pages.h).
  Tensor dpre = on_huge_pages(at::empty({N, G}, opts));
  Tensor dh_all = at::empty({P > 0 ? N : 0, P}, opts);  // dL/dh_t of every row (projection only)
  Tensor m_all = at::empty({P > 0 ? N : 0, H}, opts);   // m_t of every row (projection only)
  Tensor dm_acc = at::empty({P > 0 ? s.B : 0, H}, opts.dtype(acc));
  Tensor dx = on_huge_pages(at::empty({N, I}, opts.dtype(acc)));
  Tensor dw_ih = at::empty({G, I}, opts.dtype(acc));
  Tensor dw_hh = at::empty({G, Hout}, opts.dtype(acc));
  Tensor dw_hr = at::empty({P, P > 0 ? H : 0}, opts.dtype(acc));

  // On AMX (with the AVX-512 kernels): dx (amx_sequence_products) and dL/dh_{t-1} in the loop
  // (amx_products).
  const AmxUse amx_choice = persistent && P == 0 ? amx_use(cpu_kernels(), N, s.B, H) : AmxUse{false, false};
  const bool amx_sequence = amx_choice.sequence, amx = amx_choice.steps;
#if defined(SEQKERNELS_HAVE_AMX)
  if (amx_bf16) {
    backward_persistent_bf16(s, reverse, bf16_bits(w_hh), bf16_bits(gates), bf16_bits(cells), bf16_bits(c0),
                             bf16_bits(grad_y), dhbuf.data_ptr<float>(), dcbuf.data_ptr<float>(), bf16_bits(dpre));
  }
#endif
  if (persistent && P > 0) {  // implies float32
    RECORD_FUNCTION("seqkernels::lstm_backward_persistent_projected", std::vector<c10::IValue>());  // tests check it ran
    const Tensor w_hh_t = w_hh.t().contiguous(), w_hr_t = w_hr->t().contiguous();
    backward_persistent_projected(s, reverse, w_hh_t.const_data_ptr<float>(), w_hr_t.const_data_ptr<float>(),
                                  gates.const_data_ptr<float>(), cells.const_data_ptr<float>(),
                                  c0.const_data_ptr<float>(), grad_y.const_data_ptr<float>(), dhbuf.data_ptr<float>(),
                                  dcbuf.data_ptr<float>(), dpre.data_ptr<float>(), dh_all.data_ptr<float>(),
                                  m_all.data_ptr<float>(), dm_acc.data_ptr<float>());
  } else if (persistent) {  // implies float32
    backward_persistent(s, reverse, w_hh.const_data_ptr<float>(), gates.const_data_ptr<float>(),
                        cells.const_data_ptr<float>(), c0.const_data_ptr<float>(), grad_y.const_data_ptr<float>(),
                        dhbuf.data_ptr<float>(), dcbuf.data_ptr<float>(), dpre.data_ptr<float>(), amx);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "seqkernels_lstm_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    scalar_t* dpre_p = dpre.data_ptr<scalar_t>();
    scalar_t* dh_all_p = P > 0 ? dh_all.data_ptr<scalar_t>() : nullptr;
    scalar_t* m_all_p = P > 0 ? m_all.data_ptr<scalar_t>() : nullptr;
    if (!persistent && !amx_bf16) {
      backward_loop<scalar_t>(s, reverse, w_hh.const_data_ptr<scalar_t>(),
                              P > 0 ? w_hr->const_data_ptr<scalar_t>() : nullptr, gates.const_data_ptr<scalar_t>(),
                              cells.const_data_ptr<scalar_t>(), c0.const_data_ptr<scalar_t>(),
                              grad_y.const_data_ptr<scalar_t>(), dhbuf.data_ptr<acc_t>(), dcbuf.data_ptr<acc_t>(),
                              dpre_p, dh_all_p, m_all_p, P > 0 ? dm_acc.data_ptr<acc_t>() : nullptr);
    }

    // Whole-sequence products after the loop.
#if defined(SEQKERNELS_HAVE_AMX)
    if (amx_sequence) {  // float32
      const Tensor w_ih_packed = amx_pack_columns(w_ih.const_data_ptr<float>(), I, G, I);
      amx_input_grad(dpre.const_data_ptr<float>(), N, G, I,
                     reinterpret_cast<const uint16_t*>(w_ih_packed.const_data_ptr()), dx.data_ptr<float>());
    } else
#endif
    {
      gemm(Trans::No, Trans::No, N, I, G, dpre_p, G, w_ih.const_data_ptr<scalar_t>(), I, acc_t(0),
           dx.data_ptr<acc_t>(), I);
    }
    gemm(Trans::Yes, Trans::No, G, I, N, dpre_p, G, x.const_data_ptr<scalar_t>(), I, acc_t(0),
         dw_ih.data_ptr<acc_t>(), I);
    weight_grad_hh<scalar_t>(s, reverse, dpre_p, y.const_data_ptr<scalar_t>(), h0.const_data_ptr<scalar_t>(),
                             dw_hh.data_ptr<acc_t>());
    if (P > 0) {
      gemm(Trans::Yes, Trans::No, P, H, N, dh_all_p, P, m_all_p, H, acc_t(0), dw_hr.data_ptr<acc_t>(), H);
    }
  });
  Tensor dbias = has_bias ? dpre.sum(0, /*keepdim=*/false, acc).to(dtype) : at::empty({0}, opts);
  return {dx.to(dtype), dhbuf.to(dtype), dcbuf.to(dtype), dw_ih.to(dtype), dw_hh.to(dtype), dbias, dw_hr.to(dtype)};
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> lstm_infer_cpu(const Tensor& input, const std::optional<Tensor>& h0,
                                                  const std::optional<Tensor>& c0, const Tensor& w_ih,
                                                  const Tensor& w_hh, const std::optional<Tensor>& b_ih,
                                                  const std::optional<Tensor>& b_hh, bool batch_first, bool reverse) {
  return lstm_infer(input, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first, reverse, &lstm_forward_cpu);
}

TORCH_LIBRARY_IMPL(seqkernels, CPU, m) {
  m.impl("lstm_forward", &lstm_forward_cpu);
  m.impl("lstm_infer", &lstm_infer_cpu);
  m.impl("lstm_backward", &lstm_backward_cpu);
}

}  // namespace seqkernels::cpu
