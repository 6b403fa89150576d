// The persistent LSTM loop's forward kernel in clusters of two blocks (B <= 64; bf16 / fp16, float32
// with and without TF32): lstm_persistent.cu has the loop's design, lstm_persistent_common.cuh its
// shared parts; the comment below this kernel's.

#include "flagged_exchange.cuh"
#include "lstm_persistent_common.cuh"

namespace seqkernels {
namespace cuda {
namespace persistent {
namespace {

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
// at B <= 16, where it takes only H = 1024, 16-bit from B = 2 and TF32 from B = 8, and 16-bit
// operands from B = 1 as the row split: cluster_forward_applies).
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
// Whole K (kWholeK; 16-bit operands, H = 1024, one m16 tile; cluster_whole_k: B <= 8). Each block
// multiplies all of K for its own UO units: its 8 warps take K eighths of the same 4 UO columns
// (the same 8 k-steps and 4 n8 tiles per warp as the K halves), the 8 partials of a column meet
// in the block's own shared memory, and nothing crosses to the partner (no st.async, no mbarrier
// wait). The price: every block reads all of h_{t-1}, twice the bytes. Trace, bf16 `infer`, cycles a
// step, K halves / whole K: B = 8 4005 / 3750 (exchange 1096 / 73, wait and gather 1660 / 2425),
// B = 16 4214 / 4322 (the gather 1867 / 2981): it wins up to B = 8 and loses from B = 12.
// (Halving the st.async transactions instead, one 16-byte store a lane after a shuffle pair, made
// the exchange 70 cycles slower: 1149 -> 1220 at B = 16. The exchange is latency, not bytes.)
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

// The cluster forward kernel's compile-time shape and shared-memory layout for (scalar_t, MT, HC,
// kWholeK): the kernel indexes with it and run_cluster_forward sizes the launch from it. KQ is a
// block's K range (a half, or all of K with kWholeK), split over kKParts warps per column group.
template <class scalar_t, int MT, int HC, bool kWholeK = false>
struct ClusterForwardLayout {
  static constexpr bool kFloat = std::is_same_v<scalar_t, float>;
  static constexpr int ES = sizeof(scalar_t), kStep = kFloat ? 8 : 16;  // element bytes, k per MMA
  static constexpr int kKParts = kWholeK ? 8 : 4;
  static constexpr int UC = HC / 64, UO = UC / 2, NTW = UO / 2, KQ = kWholeK ? HC : HC / 2, KSW = KQ / kKParts / kStep;
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

// Helpers of the row-split kernel below; the cluster kernel calls load_unit_pair_state,
// load_gate_unscales and load_unit_pair_pre too (its SASS unchanged by them). It keeps its own
// copies of the cell and the output stores inline (unit_pair_cell, store_unit_pair_outputs): through
// those helpers (with the gather's re-reads, now flagged_exchange.cuh's) its address arithmetic and
// register allocation changed (78 and 2 of its 88 instances' SASS, sass_compare), which would need a
// GPU to measure; fold them in when it is next measured.
// A thread's unit pair (units j, j + 1 of batch row `row`) at the start: c0, h0 and the summed biases.
template <class scalar_t>
__device__ __forceinline__ void load_unit_pair_state(const FwdArgs<scalar_t>& a, int H, int row, int j,
                                                     float (&c_st)[2], scalar_t (&h_st)[2], float (&bias_r)[4][2]) {
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    c_st[e] = static_cast<float>(a.c0[row * H + j + e]);
    h_st[e] = a.h0[row * H + j + e];
#pragma unroll
    for (int q = 0; q < 4; ++q) bias_r[q][e] = bias_sum(a.b_ih, a.b_hh, q * H + j + e);
  }
}

// kHalf (float32 on scaled fp16 operands): the gate scales of a scaled projection's pre for a
// thread's unit pair (pre_unscale[N + g], g = q H + j + e); all 1 without one, or for 16-bit types.
template <bool kHalf>
__device__ __forceinline__ void load_gate_unscales(const float* pre_unscale, int T, int B, int H, int j, bool active,
                                                   float (&gate_u)[4][2]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      gate_u[q][e] = kHalf && active && pre_unscale != nullptr
                         ? pre_unscale[static_cast<int64_t>(T) * B + q * H + j + e]
                         : 1.0f;
    }
  }
}

// A thread's unit pair's pre (x·W_ihᵀ, four gate pairs) at step s of batch row n, and (kHalf, a
// scaled projection's) that row's scale into dst_u (left as it is otherwise).
template <bool kHalf, class scalar_t>
__device__ __forceinline__ void load_unit_pair_pre(const FwdArgs<scalar_t>& a, int T, int B, int H, int s, int n,
                                                   int j, float2 (&dst)[4], float& dst_u) {
  const int t = a.reverse ? T - 1 - s : s;
  const int64_t row = static_cast<int64_t>(t) * B + n;
  const float* pr = a.pre + row * (4 * H) + j;
#pragma unroll
  for (int q = 0; q < 4; ++q) dst[q] = *reinterpret_cast<const float2*>(pr + q * H);
  if (kHalf && a.pre_unscale != nullptr) dst_u = a.pre_unscale[row];
}

// The cell of a thread's unit pair from its pre-activations pq[gate][unit]: c and h (h_st, the last
// step's) updated, the activated gates and c_t kept for the training outputs.
template <class Math, class scalar_t>
__device__ __forceinline__ void unit_pair_cell(const float (&pq)[4][2], float (&c_st)[2], scalar_t (&h)[2],
                                               scalar_t (&h_st)[2], float (&act_r)[2][4], float (&c_new)[2]) {
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const LstmGates<float> pre_g{pq[0][e], pq[1][e], pq[2][e], pq[3][e]};
    LstmGates<float> act;
    float m;
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

// A thread's unit pair's outputs at row `row` of the T·B rows: y, and in training the activated
// gates and c_t.
template <bool kTraining, class scalar_t>
__device__ __forceinline__ void store_unit_pair_outputs(const FwdArgs<scalar_t>& a, int64_t row, int H, int j,
                                                        const scalar_t (&h)[2], const float (&act_r)[2][4],
                                                        const float (&c_new)[2]) {
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

// The cluster forward kernel's MMA operand type: the dtype's, but fp16 for kHalfScaled.
template <class scalar_t, ClusterOperands kOps>
using ClusterOperandType = std::conditional_t<kOps == ClusterOperands::kHalfScaled, c10::Half, scalar_t>;

template <class scalar_t, bool kTraining, int MT, int HC, ClusterOperands kOps, bool kWholeK>
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
  using L = ClusterForwardLayout<op_t, MT, HC, kWholeK>;
  constexpr int ES = L::ES, kStep = L::kStep, H = HC, UC = L::UC, UO = L::UO, NTW = L::NTW, KQ = L::KQ;
  constexpr int KSW = L::KSW, KSR = L::KSR, KSS = L::KSS, LDX = L::LDX, OC = L::OC, LDP = L::LDP;
  constexpr int ROWS = L::ROWS, PAIRS = L::PAIRS, kRowWords = L::kRowWords;
  constexpr int kSlotFloats = L::kSlotFloats, kParityFloats = L::kParityFloats;
  static_assert(!kX3 || KSS == 0, "cluster forward kernel: x3 keeps both parts of W_hh in registers");
  static_assert((KQ * ES) % 128 == 0, "cluster forward kernel: A tile rows of 16 mod 128 bytes");
  static_assert(NTW >= 1 && KSW >= 1 && OC == 8 * NTW, "cluster forward kernel instance");
  static_assert(PAIRS * ROWS <= kThreads, "one unit pair of one row per thread");
  static_assert(!kWholeK || L::kKParts == kWarps, "cluster forward kernel, whole K: a K part per warp");
  const Geometry& g = a.g;
  extern __shared__ __align__(16) unsigned char smem[];
  op_t* const xt = reinterpret_cast<op_t*>(smem);                      // [ROWS][LDX]: h_{t-1}, the block's K range
  float* const recv = reinterpret_cast<float*>(smem + g.off_part);    // [2][slots][ROWS][LDP], by step parity
  uint2* const wsm = reinterpret_cast<uint2*>(smem + g.off_w);         // [warp][NTW][KSS][32]: W_hh's k-steps KSR..
  // kHalf: [ROWS] h0's inverse row scales, after the partials' two mbarriers.
  float* const row_unscale = reinterpret_cast<float*>(smem + g.off_part + L::kPartialBytes + 2 * 8);
  const int B = g.B, T = g.T;
  const int rank = static_cast<int>(blockIdx.x) & 1, cluster = static_cast<int>(blockIdx.x) >> 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  // kWholeK: every warp's columns are the own block's, over K part `warp` of all of K (no partial
  // sums cross to the partner); else the owner's and K quarter `kpart` of K half `rank`.
  const int owner = kWholeK ? rank : warp & 1, kpart = kWholeK ? warp : warp >> 1;
  // The block's K range [k_begin(), k_begin() + KQ) (a function, not a value held in a register:
  // the K-half instances' code stays as it was).
  auto k_begin = [&] { return kWholeK ? 0 : rank * KQ; };

  // Rows >= B of the A tile stay zero (finite) for the whole sequence.
  for (int i = threadIdx.x; i < ROWS * LDX * ES / 16; i += kThreads) reinterpret_cast<uint4*>(smem)[i] = uint4{};

  // Resident B fragments: n8 tile nt of owner `owner`'s columns cc = nt * 8 + gq (gate cc / UO,
  // unit cluster * UC + owner * UO + cc % UO), k16 steps [kpart * KSW, ...) of the block's K range.
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
  if constexpr (kHalf) {  // over the warp's OC rows of W_hh, its KSW k-steps of K
    const float m = warp_rows_abs_max<OC, KSW * kStep>(
        [&](int cc) { return w_row(cc) + k_begin() + kpart * KSW * kStep; }, lane);
    power_of_two_scales(m, w_scale, w_unscale);
  }
#pragma unroll
  for (int nt = 0; nt < NTW; ++nt) {
    const scalar_t* wr = w_row(nt * 8 + gq);
#pragma unroll
    for (int f = 0; f < KSW; ++f) {
      const int k0 = k_begin() + (kpart * KSW + f) * kStep;
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
  if (active) load_unit_pair_state(a, H, n, j, c_st, h_st, bias_r);
  // pre of this step and of the next (requested before the wait for h_{t-1}). kHalf: a scaled
  // projection's (pre_unscale) row scale comes with it, its gate scales stay here (else all 1).
  float2 pv[4] = {}, pv_next[4] = {};
  float row_u = 1.0f, row_u_next = 1.0f, gate_u[4][2];
  load_gate_unscales<kHalf>(a.pre_unscale, T, B, H, j, active, gate_u);
  auto prefetch = [&](int s, float2 (&dst)[4], float& dst_u) {
    if (active) load_unit_pair_pre<kHalf>(a, T, B, H, s, n, j, dst, dst_u);
  };
  prefetch(0, pv, row_u);

  // ldmatrix rows: lane l gives row l % 16, bytes 16 (l / 16) of a k-step's 32 bytes (16 16-bit
  // values, or 8 floats: then the b16 pairs are TF32 values and the fragments those of m16n8k8).
  const uint32_t xt_lane = shared_address(xt) + (lane & 15) * LDX * ES + (lane >> 4) * 16;
  // This warp's slot in its owner's partials (parity 0; a shared::cluster address for the partner's,
  // shared::cta for the own block's), and the own partials of this thread's items.
  const int slot = kWholeK ? warp : rank * 4 + kpart;
  const uint32_t slot_offset = slot * kSlotFloats * 4 + (gq * LDP + 2 * tq) * 4;
  const bool own_owner = kWholeK || owner == rank;  // warp-uniform
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
    if (!kWholeK && threadIdx.x == 0) mbarrier_arrive_expect(&bars[s & 1], kPartnerBytes);
    // 1. The A tile: the block's K range of h_{t-1} (h0 at the first step).
    if (s == 0) {
      if constexpr (kHalf) {
        // One warp per row of this K range, scaled by its own power of two (rows >= B: 1, unused).
        for (int r = warp; r < ROWS; r += kWarps) {
          const float unscale =
              r < B ? scale_row_to_half(a.h0 + static_cast<int64_t>(r) * H + k_begin(), KQ, lane, xt + r * LDX) : 1.0f;
          if (lane == 0) row_unscale[r] = unscale;
        }
      } else {
        const int per_row = KQ / 4;  // chunks of 4 elements
        for (int i = threadIdx.x; i < B * per_row; i += kThreads) {
          const int r = i / per_row, c = (i - r * per_row) * 4;
          const scalar_t* src = a.h0 + static_cast<int64_t>(r) * H + k_begin() + c;
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
      // Warp 0 waits for the step flags of the producers of the block's K range (the 64 of K half
      // `rank`, or all 128), the block for warp 0.
      // With a.poll_data, no flags: every thread re-reads its poisoned words until h_{t-1} is there
      // (the flags are only hints; the poison is what tells h_{t-1} from an older step's).
      if (warp == 0 && !a.poll_data) {
        const uint32_t* fl = flags + (kWholeK ? 0 : rank * 64) + lane;
        const long long t0 = clock64();
        while (ld_relaxed_u32(fl) < static_cast<uint32_t>(s) || ld_relaxed_u32(fl + 32) < static_cast<uint32_t>(s) ||
               (kWholeK && (ld_relaxed_u32(fl + 64) < static_cast<uint32_t>(s) ||
                            ld_relaxed_u32(fl + 96) < static_cast<uint32_t>(s)))) {
          check_spin_timeout(t0, static_cast<unsigned>(s));
        }
      }
      __syncthreads();
      // 16-byte loads (8 units, or 4 for float), in batches of 8 per thread (registers: W_hh's
      // fragments stay live).
      constexpr int kVecUnits = 16 / ES, kVecPerRow = KQ / kVecUnits, kVecs = ROWS * kVecPerRow / kThreads;
      const uint32_t* src = hx + ((s - 1) % kClusterBuffers) * buf_words + (kWholeK ? 0 : rank * (KQ * ES / 4));
      auto word_of = [&](int e) {  // batch element e's row and 16-byte word of the K range
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
            // More than 8 words a thread (two batches, e.g. 16-bit B > 32 or float32 B > 16 at
            // H = 1024): a poisoned word is still waited for alone, out of line; the batched
            // re-read was only measured with one batch.
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
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(af[mt], xt_lane + mt * 16 * LDX * ES + (kpart * KSW + f) * 32);
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
            ldmatrix_x4(af, xt_lane + mt * 16 * LDX * ES + (kpart * KSW + f) * 32);
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
    if constexpr (!kWholeK) {
      mbarrier_wait_guarded(shared_address(&bars[s & 1]), (s >> 1) & 1, static_cast<unsigned>(s));  // the partner's
    }
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
      publish_step_flag(flags, static_cast<uint32_t>(s + 1));
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
// Forward kernel in clusters of two blocks, the batch rows split between the pair (row split;
// 16-bit operands: 16-bit types, float32 with TF32; H = 1024, B <= 64: cluster_row_split and
// row_split_wide, lstm_persistent.cuh)
// ---------------------------------------------------------------------------------------
// The K halves exchange partial sums between the pair after the product (~1100 cycles a step at
// bf16 B = 8 / 16, H = 1024); whole K removes that but doubles the bytes each block gathers
// (~1100 cycles more at B = 16). Here block r of cluster c takes batch rows [r RB, r RB + RB)
// (RB = ceil(B / 2)) for all 16 units of the cluster and all of K: it gathers only its own rows
// of h_{t-1} (K halves' bytes, from the rank-r blocks that produce them) and nothing crosses
// between the pair. The MMA's roles swap: W_hh's 64 gate rows of the cluster (gate q = m16 tile
// q) are the A operand, h_{t-1}'s rows the n8 B operand (ldmatrix of the row tile, no transpose),
// so a block of 8 rows wastes no tile rows. The price is W_hh: the block holds the cluster's whole
// [64, H] slice, 128 KB, twice the K halves' slice: each warp's K eighth (8 k-steps x 4 m16 tiles)
// keeps k-steps 0..3 in registers and 4..7 in shared memory, read every step.
// Warps: 8 K eighths. Each warp gathers only its own K eighth of the rows (the words of the
// clusters that produce those units) and multiplies it without a block barrier, so a warp whose
// producers are done starts its product (shared-memory bound: W_hh's k-steps 4..7 are 64 KB a
// step) while the others still wait. Their partials of a (gate row, batch row) meet in shared
// memory in a fixed order (deterministic), then 64 threads apply the cell to a unit pair of one
// row each. (Measured on an H200, 2026-11-28, `infer` CUDA-graph replays, bf16 H = 1024: the whole
// tile gathered before a block barrier took 0.537 / 0.629 ms at B = 4 / 16 against 0.464 / 0.581;
// the gate math spread over 4 threads a unit pair, 0.555 / 0.681 against 0.537 / 0.627; 16 warps,
// half of W_hh's shared-memory reads, 0.568 / 0.711 against 0.557 / 0.683: docs/benchmarks.md.)
// The exchange and its poison are the cluster kernel's (the same buffers, flags and argument:
// a block's readers are the rank-r blocks, which it reads from in turn).
// float32 with TF32 allowed runs it on the cluster kernel's scaled fp16 operands (kHalfScaled):
// each warp's W_hh fragments times one power of two (its partials scaled back before they meet),
// h0's rows each times their own at the first step, h_t in [-1, 1] exchanged as fp16, and a
// scaled projection's pre (pre_unscale) scaled back in the gate math.
constexpr int kRowSplitRegKSteps = 4;  // k16 steps a warp with W_hh's A fragments in registers (the rest in shared memory)
// A (warp, gate) block of the partials holds its rows in pairs 40 floats apart, a pair's odd row 16
// floats after its even row (20 floats a row, as a plain row stride of 20 took). The fragment stores
// (rows 2tq (+ 1) of an n8 tile, columns gq (+ 8)) and the gate threads' float2 reads (a half-warp:
// 8 unit pairs of rows n, n + 1) both meet 32 distinct banks. With the plain stride of 20 the reads
// met 2-way conflicts in every half-warp: 4 wavefronts a load instead of 2, 32 loads a thread a step.
constexpr int kRowSplitRowFloats = 20;
__host__ __device__ constexpr int row_split_partial_row(int r) { return (r >> 1) * 40 + (r & 1) * 16; }

// 8 warps a block, each a K eighth of KSTEPS k16 steps: k-steps 0..3 of W_hh's fragments in
// registers and 4..7 in shared memory (64 KB read every step). NT n8 tiles of batch rows a block
// (up to 8 NT rows): 1 to B = 16, 2 to B = 32 and 4 to B = 64 (row_split_wide). At NT = 4 the
// shared memory is 66 KB of rows, 80 KB of partials and 64 KB of W_hh. op_t: the operand type
// (16-bit; c10::Half for float32's scaled operands).
template <class op_t, int HC, int NT = 1>
struct RowSplitLayout {
  static constexpr int ES = sizeof(op_t), UC = HC / 64, ROWS = 8 * NT, LDX = HC + 16 / ES;
  static constexpr int kWarps = kThreads / 32, KSTEPS = HC / 16 / kWarps;
  static constexpr int KSR = kRowSplitRegKSteps, KSS = KSTEPS - KSR;
  static constexpr int kRowWords = HC * ES / 4;
  // Shared memory: the row tile [ROWS][LDX], the partials [warp][gate][ROWS rows: row_split_partial_row], W_hh's
  // k-steps KSR.. as A fragments [warp][gate][k-step][lane] (uint4).
  static constexpr int kTileBytes = ROWS * LDX * ES;
  static constexpr int kPartialBytes = kWarps * 4 * ROWS * kRowSplitRowFloats * 4;
  static constexpr int kWsmBytes = kWarps * 4 * KSS * 32 * 16;
  // float32 (scaled fp16 operands): h0's inverse row scales (float), after the partials.
  static constexpr int kRowScaleBytes = ROWS * 4;
};

template <class scalar_t, bool kTraining, int HC, int NT>
__global__ void __launch_bounds__(kThreads, 1)
    lstm_persistent_forward_row_split_kernel(const __grid_constant__ FwdArgs<scalar_t> a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using acc_t = float;
  using Math = CudaMath;
  // float32 with TF32 allowed: fp16 operands scaled by powers of two (kHalf); else the 16-bit type's.
  constexpr bool kHalf = std::is_same_v<scalar_t, float>;
  using op_t = ClusterOperandType<scalar_t, kHalf ? ClusterOperands::kHalfScaled : ClusterOperands::kSixteenBit>;
  using L = RowSplitLayout<op_t, HC, NT>;
  constexpr int H = HC, UC = L::UC, LDX = L::LDX, ES = L::ES, KSR = L::KSR, KSS = L::KSS, KSTEPS = L::KSTEPS;
  constexpr int kRowWords = L::kRowWords, kWarps = L::kWarps, ROWS = L::ROWS;
  constexpr int kBlockFloats = ROWS * kRowSplitRowFloats;  // a (warp, gate) block of the partials
  static_assert(UC == 16 && KSTEPS % 2 == 0, "row-split kernel: H = 1024");
  static_assert(ROWS * (UC / 2) <= kThreads, "row-split kernel: one unit pair of one row a thread");
  const Geometry& g = a.g;
  extern __shared__ __align__(16) unsigned char smem[];
  op_t* const xt = reinterpret_cast<op_t*>(smem);                             // [ROWS][LDX]: this block's rows of h_{t-1}
  float* const part = reinterpret_cast<float*>(smem + g.off_part);           // [warp][gate][kBlockFloats]
  uint4* const wsm = reinterpret_cast<uint4*>(smem + g.off_w);               // [warp][gate][k-step - KSR][lane]
  float* const row_unscale = part + L::kPartialBytes / 4;                    // kHalf: [ROWS] h0's inverse row scales
  const int B = g.B, T = g.T;
  const RowHalf half = row_half(B);
  const int rank = half.rank, cluster = half.pair, row0 = half.row0, nrows = half.nrows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  if (nrows <= 0) return;

  // Rows >= nrows of the tile stay zero (finite) for the whole sequence.
  for (int i = threadIdx.x; i < L::kTileBytes / 16; i += kThreads) reinterpret_cast<uint4*>(smem)[i] = uint4{};

  // A fragments of gate q's m16 tile (rows: units cluster * UC + 0..15), k-step f of the K part of
  // `warp`: a0 = A[gq][2tq, 2tq + 1], a1 = A[gq + 8][..], a2 / a3 the same at k + 8.
  uint32_t afr[4][KSR][4];
  uint4* const wsm_warp = wsm + warp * (4 * KSS * 32) + lane;
  // kHalf: this warp's fragments scaled by w_scale (their largest finite magnitude to [2^14, 2^15)),
  // its partial sums by w_unscale (powers of two: exact).
  float w_scale = 1.0f, w_unscale = 1.0f;
  if constexpr (kHalf) {  // over the 4 UC rows (gate r / UC, unit r % UC), the warp's K part
    const float m = warp_rows_abs_max<4 * UC, KSTEPS * 16>(
        [&](int r) {
          return a.w_hh + static_cast<int64_t>((r / UC) * H + cluster * UC + r % UC) * H + warp * KSTEPS * 16;
        },
        lane);
    power_of_two_scales(m, w_scale, w_unscale);
  }
  auto op_pair = [&](const scalar_t* w, int k) {
    if constexpr (kHalf) {
      return pack2(c10::Half(w[k] * w_scale), c10::Half(w[k + 1] * w_scale));
    } else {
      return pack2(w[k], w[k + 1]);
    }
  };
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const scalar_t* w0 = a.w_hh + static_cast<int64_t>(q * H + cluster * UC + gq) * H;
    const scalar_t* w8 = w0 + static_cast<int64_t>(8) * H;
#pragma unroll
    for (int f = 0; f < KSTEPS; ++f) {
      const int k0 = (warp * KSTEPS + f) * 16 + 2 * tq;
      const uint4 fr = make_uint4(op_pair(w0, k0), op_pair(w8, k0), op_pair(w0, k0 + 8), op_pair(w8, k0 + 8));
      if (f < KSR) {
        afr[q][f < KSR ? f : 0][0] = fr.x;
        afr[q][f < KSR ? f : 0][1] = fr.y;
        afr[q][f < KSR ? f : 0][2] = fr.z;
        afr[q][f < KSR ? f : 0][3] = fr.w;
      } else {
        wsm_warp[(q * KSS + f - KSR) * 32] = fr;
      }
    }
  }

  // This thread's gate items: units j, j + 1 (pair `pair` of the cluster's 16) of batch row
  // row0 + n, all four gates (threads 0..8 ROWS - 1 at most), which it publishes and stores.
  const int pair = threadIdx.x % (UC / 2), n = threadIdx.x / (UC / 2);
  const bool active = n < nrows;
  const int j = cluster * UC + 2 * pair, grow = row0 + n;
  acc_t c_st[2] = {0, 0}, bias_r[4][2] = {};
  scalar_t h_st[2] = {static_cast<scalar_t>(0.0f), static_cast<scalar_t>(0.0f)};
  if (active) load_unit_pair_state(a, H, grow, j, c_st, h_st, bias_r);
  // pre of this step and of the next. kHalf: a scaled projection's (pre_unscale) row scale comes
  // with it, its gate scales stay here (else all 1).
  float2 pv[4] = {}, pv_next[4] = {};
  float row_u = 1.0f, row_u_next = 1.0f, gate_u[4][2];
  load_gate_unscales<kHalf>(a.pre_unscale, T, B, H, j, active, gate_u);
  auto prefetch = [&](int s, float2 (&dst)[4], float& dst_u) {
    if (active) load_unit_pair_pre<kHalf>(a, T, B, H, s, grow, j, dst, dst_u);
  };
  prefetch(0, pv, row_u);

  // ldmatrix.x4 of two k-steps' B fragments: lane l gives row l % 8 of an n8 tile at k + 8 (l / 8).
  const uint32_t xt_lane = shared_address(xt) + ((lane & 7) * LDX + (lane >> 3) * 8) * ES;
  // This warp's partials: c0 / c1 (gate row gq, batch rows 2tq, 2tq + 1 of a tile), c2 / c3 (gate row gq + 8).
  float* const part_warp = part + warp * (4 * kBlockFloats);
  const float* const own0 = part + row_split_partial_row(n) + 2 * pair;

  const int64_t buf_words = static_cast<int64_t>(B) * kRowWords;
  uint32_t* const hx = reinterpret_cast<uint32_t*>(a.xbuf);
  uint32_t* const flags = hx + kClusterBuffers * buf_words;
  PhaseTrace trace;
  trace.start(a.trace);
  __syncthreads();  // the tile's zeros (and W_hh's fragments in shared memory) before h0's rows
  for (int s = 0; s < T; ++s) {
    const int t = a.reverse ? T - 1 - s : s;
    // 1. The row tile: this block's rows of h_{t-1} (h0 at the first step).
    if (s == 0) {
      if constexpr (kHalf) {
        // One warp per row, scaled by its own power of two (rows >= nrows: 1, unused).
        for (int r = warp; r < ROWS; r += kWarps) {
          const float unscale =
              r < nrows ? scale_row_to_half(a.h0 + static_cast<int64_t>(row0 + r) * H, H, lane, xt + r * LDX) : 1.0f;
          if (lane == 0) row_unscale[r] = unscale;
        }
      } else {
        constexpr int per_row = H / 4;  // chunks of 4 elements
        for (int i = threadIdx.x; i < nrows * per_row; i += kThreads) {
          const int r = i / per_row, c = (i - r * per_row) * 4;
          *reinterpret_cast<uint2*>(xt + r * LDX + c) =
              *reinterpret_cast<const uint2*>(a.h0 + static_cast<int64_t>(row0 + r) * H + c);
        }
      }
    } else {
      // This warp's K eighth (units H / 8 * warp ..): the words of the kPartClusters clusters
      // that produce them, whose rank-r blocks' step flags lanes 0.. wait for unless a.poll_data.
      // Only this warp reads these columns of the tile (its ldmatrix below), so a __syncwarp
      // orders them.
      constexpr int kPartClusters = H / kWarps / UC;
      if (!a.poll_data) wait_step_flags<kPartClusters>(flags, warp * kPartClusters, rank, lane, static_cast<unsigned>(s));
      // 16-byte words (8 units): 16 a row in a K eighth, 4 NT a lane; at NT = 4 in two passes of
      // 16 rows (half the words in registers at once: the whole tile's 64 spilled).
      constexpr int kPasses = NT > 2 ? 2 : 1, kPassRows = ROWS / kPasses;
      constexpr int kVecPerRow = H * ES / 16 / kWarps, kVecs = kPassRows * kVecPerRow / 32;
      const uint32_t* src = hx + ((s - 1) % kClusterBuffers) * buf_words + static_cast<int64_t>(row0) * kRowWords;
      if constexpr (kPasses == 1) {
        auto word_of = [&](int e) {  // element e's row (of this block's) and 16-byte word
          const int idx = lane + e * 32;
          return make_int2(idx / kVecPerRow, warp * kVecPerRow + idx % kVecPerRow);
        };
        gather_row_words<kVecs, kRowWords, LDX>(xt, src, nrows, word_of, static_cast<unsigned>(s));
      } else {
#pragma unroll 1
        for (int r0 = 0; r0 < nrows; r0 += kPassRows) {
          auto word_of = [&](int e) {
            const int idx = lane + e * 32;
            return make_int2(r0 + idx / kVecPerRow, warp * kVecPerRow + idx % kVecPerRow);
          };
          gather_row_words<kVecs, kRowWords, LDX>(xt, src, nrows, word_of, static_cast<unsigned>(s));
        }
      }
      __syncwarp();
    }
    if (s + 1 < T) prefetch(s + 1, pv_next, row_u_next);
    if (s == 0) __syncthreads();  // h0's rows (and kHalf's row scales) were stored by any thread
    trace.mark(0);

    // 2. This warp's K part: acc[q][nt] = W_hh's gate-q rows x this block's rows of n8 tile nt
    // (tiles without rows skipped: block-uniform).
    float acc[4][NT][4] = {};
#pragma unroll
    for (int f = 0; f < KSTEPS; f += 2) {
      uint32_t b[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (nt == 0 || nt * 8 < nrows) ldmatrix_x4(b[nt], xt_lane + (nt * 8 * LDX + (warp * KSTEPS + f) * 16) * ES);
      }
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int ff = f + h2;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (ff < KSR) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              if (nt == 0 || nt * 8 < nrows) {
                MmaInst<op_t>::run(acc[q][nt], afr[q][ff < KSR ? ff : 0], b[nt][2 * h2], b[nt][2 * h2 + 1]);
              }
            }
          } else {
            const uint4 w = wsm_warp[(q * KSS + ff - KSR) * 32];
            const uint32_t af[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              if (nt == 0 || nt * 8 < nrows) MmaInst<op_t>::run(acc[q][nt], af, b[nt][2 * h2], b[nt][2 * h2 + 1]);
            }
          }
        }
      }
    }
    trace.mark(1);
    if constexpr (kHalf) {  // back from the scaled operands (exact: powers of two)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float u0 = w_unscale, u1 = w_unscale;  // batch rows 8 nt + 2tq, + 1 (h0's row scales at s = 0)
        if (s == 0) {
          u0 *= row_unscale[nt * 8 + 2 * tq];
          u1 *= row_unscale[nt * 8 + 2 * tq + 1];
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          acc[q][nt][0] *= u0;
          acc[q][nt][1] *= u1;
          acc[q][nt][2] *= u0;
          acc[q][nt][3] *= u1;
        }
      }
    }
    // The partials: gate row (unit) gq / gq + 8, batch rows 8 nt + 2tq / + 1. The last step's gate
    // math read them before the last step's publish barrier.
#pragma unroll
    for (int q = 0; q < 4; ++q) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float* pq = part_warp + q * kBlockFloats + row_split_partial_row(nt * 8 + 2 * tq) + gq;
        constexpr int kOdd = row_split_partial_row(1);  // row 2tq + 1
        pq[0] = acc[q][nt][0];
        pq[kOdd] = acc[q][nt][1];
        pq[8] = acc[q][nt][2];
        pq[kOdd + 8] = acc[q][nt][3];
      }
    }
    __syncthreads();
    trace.mark(4);

    // 3. Gate math of the own unit pair: pre + bias + the warps' partials (a fixed pairwise order).
    scalar_t h[2] = {static_cast<scalar_t>(0.0f), static_cast<scalar_t>(0.0f)};
    acc_t act_r[2][4], c_new[2];
    if (active) {
      acc_t pq[4][2];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float2 v[kWarps];
#pragma unroll
        for (int w = 0; w < kWarps; ++w) v[w] = *reinterpret_cast<const float2*>(own0 + (w * 4 + q) * kBlockFloats);
#pragma unroll
        for (int w = 1; w < kWarps; w *= 2) {
#pragma unroll
          for (int sl = 0; sl + w < kWarps; sl += 2 * w) {
            v[sl].x += v[sl + w].x;
            v[sl].y += v[sl + w].y;
          }
        }
        if constexpr (kHalf) {
          pq[q][0] = pv[q].x * row_u * gate_u[q][0] + bias_r[q][0] + v[0].x;
          pq[q][1] = pv[q].y * row_u * gate_u[q][1] + bias_r[q][1] + v[0].y;
        } else {
          pq[q][0] = pv[q].x + bias_r[q][0] + v[0].x;
          pq[q][1] = pv[q].y + bias_r[q][1] + v[0].y;
        }
      }
      unit_pair_cell<Math>(pq, c_st, h, h_st, act_r, c_new);
    }
    trace.mark(2);
    // 4. Publish h_t (flag s + 1) and poison step s + 2's words (the cluster kernel's protocol,
    // among the rank-r blocks), then the outputs.
    if (s + 1 < T) {
      const int64_t at = static_cast<int64_t>(grow) * kRowWords + j * ES / 4;
      if (active) {
        // (kHalf: h_t in [-1, 1] needs no scale.)
        st_relaxed_u32(hx + (s % kClusterBuffers) * buf_words + at,
                       unpoisoned(pack2(static_cast<op_t>(h[0]), static_cast<op_t>(h[1]))));
        st_relaxed_u32(hx + ((s + 2) % kClusterBuffers) * buf_words + at, kClusterPoison);
      }
      publish_step_flag(flags, static_cast<uint32_t>(s + 1));
    }
    if (active) store_unit_pair_outputs<kTraining>(a, static_cast<int64_t>(t) * B + grow, H, j, h, act_r, c_new);
    trace.mark(3);
#pragma unroll
    for (int q = 0; q < 4; ++q) pv[q] = pv_next[q];
    row_u = row_u_next;
  }
  report_trace(trace, kTraining ? "forward row split (training)" : "forward row split (inference)", g);
  if (active) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      a.h_n[grow * H + j + e] = h_st[e];
      a.c_n[grow * H + j + e] = c_st[e];
    }
  }
#else
  __trap();
#endif
}

}  // namespace

// SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD (diagnostic): unset, the cluster forward kernel where
// cluster_forward_applies; 0, never (the direct kernel at B <= 16, else the general kernel); 1,
// wherever it fits (tests reach its one-tile instances at any B <= 16 with it).
int cluster_forward_mode() { return diagnostic_mode("SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD"); }

// The cluster forward kernel (bf16 / fp16, or float32 with or without TF32: kX3) where one of its
// instances takes the call (cluster_forward_applies), its vector accesses aligned (8-byte rows of
// h0 and pre and 4-byte pairs of the outputs for 16-bit types; 16-byte rows of h0, 8-byte pre and
// output pairs for float, and a 16-byte W_hh for scaled fp16 operands), and 64 clusters of two
// co-resident; false otherwise, having launched nothing.
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
      (kHalf && !half_scaled_inputs_aligned(args.w_hh, args.h0)) ||
      (kTraining && (!aligned(args.gates, pair_bytes) || !aligned(args.cells, pair_bytes)))) {
    return false;
  }
  // A kernel's launch over 64 clusters of two blocks from its shared-memory layout (at 0 the A or
  // row tile, then from off_part the partials and what follows them, from off_w W_hh's fragments
  // kept in shared memory), with the exchange: kClusterBuffers buffers of h ([B][row_words] 32-bit
  // words each), poisoned, then the kClusterForwardBlocks step flags. False where it does not fit.
  // gathered_bytes: what a block gathers of h_{t-1} a step (cluster_polls_data).
  auto launch_layout = [&](auto kernel, int hc, int row_words, int tile_bytes, int part_bytes, int wsm_bytes,
                           int64_t gathered_bytes) {
    const void* fn = reinterpret_cast<const void*>(kernel);
    if (!ptx_at_least(fn, 90)) return false;
    Geometry& g = args.g;
    g = Geometry{};
    g.T = static_cast<int>(s.T);
    g.B = static_cast<int>(s.B);
    g.H = g.Hp = hc;
    g.U = hc / 64;  // units per cluster
    g.nblocks = kClusterForwardBlocks;
    g.cl = 2;
    g.nch = 1;
    g.row_words = row_words;
    g.off_part = static_cast<int>(align16(tile_bytes));
    g.off_w = static_cast<int>(align16(g.off_part + part_bytes));
    g.smem = g.off_w + wsm_bytes;
    if (static_cast<size_t>(g.smem) > prop.sharedMemPerBlockOptin || !co_resident(fn, g, prop)) return false;
    args.poll_data = cluster_polls_data(gathered_bytes);
    return launch_with_flagged_exchange(kernel, args, args.xbuf, like);
  };
  // One cluster-kernel instance.
  auto launch_instance = [&](auto mt_c, auto hc_c, auto whole_k_c) {
    constexpr int MT = decltype(mt_c)::value, HC = decltype(hc_c)::value;
    constexpr bool kWholeK = decltype(whole_k_c)::value;
    using L = ClusterForwardLayout<ClusterOperandType<scalar_t, kOps>, MT, HC, kWholeK>;
    // The partials, then the two mbarriers (and kHalf's row scales).
    return launch_layout(&lstm_persistent_forward_cluster_kernel<scalar_t, kTraining, MT, HC, kOps, kWholeK>, HC,
                         L::kRowWords, L::kTileBytes, L::kPartialBytes + 2 * 8 + (kHalf ? L::kRowScaleBytes : 0),
                         L::kWsmBytes, s.B * L::KQ * L::ES);
  };
  // The row-split kernel (16-bit operands: 16-bit types, float32 with TF32 on scaled fp16 operands;
  // H = 1024: B <= 16 where cluster_row_split asks for it, to B = 64 where row_split_wide does
  // too): NT n8 tiles of rows a block.
  auto launch_row_split = [&](auto nt_c) {
    if constexpr (kOps == ClusterOperands::kSixteenBit || kHalf) {
      constexpr int NT = decltype(nt_c)::value;
      using L = RowSplitLayout<ClusterOperandType<scalar_t, kOps>, 1024, NT>;
      // The partials (and kHalf's row scales).
      return launch_layout(&lstm_persistent_forward_row_split_kernel<scalar_t, kTraining, 1024, NT>, 1024, L::kRowWords,
                           L::kTileBytes, L::kPartialBytes + (kHalf ? L::kRowScaleBytes : 0), L::kWsmBytes,
                           (s.B + 1) / 2 * 1024 * L::ES);
    } else {
      return false;
    }
  };
  if (s.H == 1024 && cluster_row_split()) {
    if (s.B <= 16 && launch_row_split(IntConst<1>{})) return true;
    if (s.B > 16 && row_split_wide()) {
      if (s.B <= 32 ? launch_row_split(IntConst<2>{}) : launch_row_split(IntConst<4>{})) return true;
    }
  }
  auto try_instance = [&](auto mt_c, auto hc_c) {
    constexpr int MT = decltype(mt_c)::value, HC = decltype(hc_c)::value;
    if constexpr (kFloat && !kHalf && HC > 512 && (kX3 || MT > 2)) {
      // float32 at H = 1024: with TF32 up to 2 m16 tiles (W_hh's 128 KB slice half in shared
      // memory beside a 66 KB A tile and 80 KB of partials); x3 keeps twice the fragments.
      return false;
    } else {
      if (s.H != HC || (s.B > 32 ? 4 : s.B > 16 ? 2 : 1) != MT) return false;
      // All of K in each block (16-bit operands, one m16 tile, H = 1024) where cluster_whole_k
      // asks for it.
      if constexpr (MT == 1 && HC == 1024 && (kOps == ClusterOperands::kSixteenBit || kHalf)) {
        if (cluster_whole_k(s.B)) return launch_instance(mt_c, hc_c, std::true_type{});
      }
      return launch_instance(mt_c, hc_c, std::false_type{});
    }
  };
  auto try_tiles = [&](auto hc_c) {  // 1, 2 or 4 m16 tiles of rows
    return try_instance(IntConst<1>{}, hc_c) || try_instance(IntConst<2>{}, hc_c) || try_instance(IntConst<4>{}, hc_c);
  };
  return try_tiles(IntConst<256>{}) || try_tiles(IntConst<512>{}) || try_tiles(IntConst<1024>{});
}

// The instances run_forward (lstm_persistent.cu) calls: each dtype's operands.
#define SK_INSTANTIATE_CLUSTER(T, OPS)                                                                              \
  template bool run_cluster_forward<T, false, OPS>(const LstmSizes&, const cudaDeviceProp&, FwdArgs<T>&,            \
                                                   const at::Tensor&);                                              \
  template bool run_cluster_forward<T, true, OPS>(const LstmSizes&, const cudaDeviceProp&, FwdArgs<T>&,             \
                                                  const at::Tensor&);
SK_INSTANTIATE_CLUSTER(float, ClusterOperands::kTf32)
SK_INSTANTIATE_CLUSTER(float, ClusterOperands::kHalfScaled)
SK_INSTANTIATE_CLUSTER(float, ClusterOperands::kTf32x3)
SK_INSTANTIATE_CLUSTER(c10::Half, ClusterOperands::kSixteenBit)
SK_INSTANTIATE_CLUSTER(c10::BFloat16, ClusterOperands::kSixteenBit)
#undef SK_INSTANTIATE_CLUSTER

}  // namespace persistent
}  // namespace cuda
}  // namespace seqkernels
