// The persistent LSTM loop's direct forward kernel (B <= 16, tensor cores): lstm_persistent.cu has
// the loop's design, lstm_persistent_common.cuh its shared parts; the comment below this kernel's.

#include "lstm_persistent_common.cuh"

namespace seqkernels {
namespace cuda {
namespace persistent {
namespace {

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
// rows then ran in two passes, for want of registers.) h0's non-finite values enter the MMAs as 0
// and the gate threads add their products in float32, as in kHalfX3 below (split, an inf would
// give inf - inf = NaN).
//
// float32 with TF32 off at B <= 8, Hp > 512 on fp16 parts (Path::kHalfX3, 2026-11-28). The same three
// products on fp16 parts instead of TF32 ones: a value x (W_hh scaled per warp and h0 per row by
// powers of two, as kHalfScaled's) is big = fp16(x) and small = fp16(2^11 (x - big)), 22
// significant bits as the TF32 parts (2^-22 of the value: x3_bits' rounding; below fp16's normal
// range, 2^-36 of the largest value at most). The exchange is kTf32x3's; the consumer rounds each
// pair of values to fp16 (big) and their remainders times 2^11 (small), and the A tile's rows
// g + 8 carry row g's small pair as in kTf32x3 at B <= 8: two fp16 MMAs per k16 step instead of
// four TF32 ones, and W_hh's two parts take 8 bytes a weight, TF32 parts' half, so that at
// Hp = 1024 half of them stay in registers and the rest (64 KB, not 160) in shared memory. The
// small terms are added times 2^-11. h0's non-finite values (inf, NaN) enter the MMAs as 0, and
// the gate threads of the rows that read them add their products with W_hh in float32 (cold:
// a flag per row), so an inf gives what a float32 GEMM gives, not inf - inf = NaN between parts.
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
  return P == Path::kMma16 || P == Path::kHalfScaled ? 1 : P == Path::kTf32 || P == Path::kHalfX3 ? 2 : 4;
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
// kHalfX3's fp16 parts of an x3 word's two values, each part as an MMA operand pair (the word's
// first value in the low half): .x the values rounded to fp16 (big), .y 2^11 times their
// remainders (small; the remainders are exact in float32).
__device__ __forceinline__ uint2 x3_half_parts(u64 w) {
  const float v0 = __uint_as_float(x3_first(w)), v1 = __uint_as_float(x3_second(w));
  uint32_t big, small;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(big) : "f"(v1), "f"(v0));  // the first operand -> the upper half
  float b0, b1;
  asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
      : "=f"(b0), "=f"(b1)
      : "r"(big));
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(small) : "f"((v1 - b1) * 2048.0f), "f"((v0 - b0) * 2048.0f));
  return make_uint2(big, small);
}
// kHalfX3's part of a scaled W_hh value (resident fragments, once): 0 big, 1 small (0 where the
// value is not finite, which big keeps).
__device__ __forceinline__ c10::Half half_x3_part(float x, int part) {
  const c10::Half big(x);
  if (part == 0) return big;
  const float rem = x - static_cast<float>(big);
  return c10::Half(isfinite(rem) ? rem * 2048.0f : 0.0f);
}
// Sum of W_hh row w_row's products with the non-finite values of an h0 row (kTf32x3, kHalfX3, which
// multiply those as 0): what a float32 GEMM adds for them (inf or NaN). Cold path.
template <class scalar_t>
__device__ __noinline__ float h0_non_finite_products(const scalar_t* w_row, const scalar_t* h0_row, int H) {
  float sum = 0.0f;
  for (int k = 0; k < H; ++k) {
    const float v = static_cast<float>(h0_row[k]);
    if (!isfinite(v)) sum += static_cast<float>(w_row[k]) * v;
  }
  return sum;
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
// pairs (float, non-finite values as 0; kHalfX3 of the row times its scale) or (kHalfScaled) fp16
// values of the row times its scale. Cold path, out of line.
template <class scalar_t, Path P>
__device__ __noinline__ ulonglong2 h0_pair(const scalar_t* h0_row, int H, int word, float scale) {
  constexpr bool kX3Words = P == Path::kTf32x3 || P == Path::kHalfX3;
  u64 p[2];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    u64 bits = 0;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int k = (word + w) * 2 + e;
      if (k < H) {
        const scalar_t v = h0_row[k];
        if constexpr (kX3Words) {  // non-finite values as 0 (the kernel adds them); kHalfX3's scaled
          const float x = P == Path::kHalfX3 ? static_cast<float>(v) * scale : static_cast<float>(v);
          bits |= static_cast<u64>(isfinite(x) ? x3_bits(x) : 0u) << (30 * e);
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
// the payloads of this lane's pairs, as the LL buffer would hold them (kHalfScaled, kHalfX3: each
// row times row_scale[row]). Cold path (its loads are out of line in h0_pair; the arrays stay in registers,
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
        const float scale = P == Path::kHalfScaled || P == Path::kHalfX3 ? row_scale[row] : 1.0f;
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
  constexpr bool kX3 = P == Path::kTf32x3;                // float32, TF32 off: x3_bits pairs, TF32 parts
  constexpr bool kHalfX3 = P == Path::kHalfX3;            // float32, TF32 off: x3_bits pairs, fp16 parts
  constexpr bool kX3Words = kX3 || kHalfX3;               // h exchanged as x3_bits pairs
  constexpr bool kTf32Pairs = P == Path::kTf32 || kX3Words;  // float h, two units per word
  constexpr bool kHalf = P == Path::kHalfScaled;        // float32, TF32: fp16 words, scaled W_hh and h0
  constexpr bool kScaled = kHalf || kHalfX3;            // fp16 operands: W_hh scaled per warp, h0 per row
  static_assert(kTf32Pairs || kHalf || sizeof(scalar_t) == 2, "direct kernel: 16-bit types or float32");
  static_assert(!(kTf32Pairs || kHalf) || std::is_same_v<scalar_t, float>, "direct kernel: float32 paths");
  static_assert(!kHalfX3 || kBranchFreeRows == 1, "kHalfX3: one batch row per lane (B <= 8)");
  using MmaT = std::conditional_t<kScaled, c10::Half, scalar_t>;  // the MMA's operand type
  // MMAs per k-step of 8 LL words (16 elements): 16-bit 1; TF32 2; x3 6 (4 with kStacked); x3 on
  // fp16 parts 2. The resident fragments per k-step: [kFrag][2] registers (x3: W's big and small
  // parts of each of the two TF32 MMAs, m = 2 * mma + part; on fp16 parts m = part).
  constexpr int kFrag = direct_frags(P);
  constexpr int PAD = U4;  // Geometry::pad_shift
  // x3 with one batch row per lane: the small values ride in the A tile's rows g + 8 (step 2).
  constexpr bool kStacked = kX3Words && kBranchFreeRows == 1;
  constexpr int kFlagShift = kX3Words ? kX3FlagShift : kTf32Pairs ? kTf32PairFlagShift : 32;
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
  // kScaled: h0's row scales [0, 16) and their inverses [16, 32), after the step table; kX3Words
  // [32, 48): 1 where the row holds a non-finite value.
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
  // kScaled: this warp's fragments scaled by w_scale, its partial sums by w_unscale (powers of two).
  float w_scale = 1.0f, w_unscale = 1.0f;
  {
    const scalar_t* __restrict__ w_hh = a.w_hh;
    auto wf = [&](int k, int c) -> scalar_t {
      const int u = c & (U - 1), gate = c >> g.lg_u;
      if (gate >= 4 || j0 + u >= H || k >= H) return static_cast<scalar_t>(0.0f);
      return w_hh[static_cast<int64_t>(gate * H + j0 + u) * H + k];
    };
    if constexpr (kScaled) {  // the largest finite magnitude of this warp's fragments (loaded below)
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
          } else if constexpr (kHalfX3) {  // the 16-bit layout below, of the scaled values' part m
            auto part_of = [&](int k) { return half_x3_part(static_cast<float>(wf(k, col)) * w_scale, m); };
            b0 = pack2(part_of(k0), part_of(k0 + 1));
            b1 = pack2(part_of(k0 + 2), part_of(k0 + 3));
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
  if constexpr (kScaled || kX3Words) {
    // kScaled: h0 may hold any value: each row as fp16 times the power of two that takes its largest
    // finite magnitude into [2^14, 2^15); the partial sums of the rows that read h0 are multiplied
    // back. kX3Words: the rows that hold a non-finite value (their products with it added in float32).
    for (int r = warp; r < B; r += kWarps) {
      float m = 0.0f;
      bool non_finite = false;
      const scalar_t* h0_row = a.h0 + static_cast<int64_t>(r) * H;
      for (int k = lane; k < H; k += 32) {
        const float v = static_cast<float>(h0_row[k]);
        if constexpr (kScaled) m = finite_abs_max(m, v);
        if constexpr (kX3Words) non_finite |= !isfinite(v);
      }
      float scale = 1.0f, unscale = 1.0f;
      if constexpr (kScaled) power_of_two_scales(warp_max(m), scale, unscale);
      if constexpr (kX3Words) non_finite = __any_sync(0xffffffffu, non_finite);
      if (lane == 0) {
        if constexpr (kScaled) {
          h0_scale[r] = scale;
          h0_scale[16 + r] = unscale;
        }
        if constexpr (kX3Words) h0_scale[32 + r] = non_finite ? 1.0f : 0.0f;
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
                          : kX3Words            ? x3_flag(s - 1)
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
    } else if constexpr (kHalfX3) {
      // A's rows g: row g's big fp16 pairs, rows g + 8 its small ones (kStacked): A·W_big gives
      // big·big (rows g) and small·big (rows g + 8), A·W_small big·small (rows g) and small·small
      // (dropped). Two dependent MMA chains per tile.
      float acc_lo[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) acc_lo[nt][0] = acc_lo[nt][1] = acc_lo[nt][2] = acc_lo[nt][3] = 0.f;
#pragma unroll
      for (int f = 0; f < KPC; ++f) {
        // Word 2t (lo) holds this lane's elements k = 2t, 2t + 1 of the k16 step, word 2t + 1 (hi)
        // k = 2t + 8, 2t + 9, as in the 16-bit layout.
        const uint2 p0 = x3_half_parts(lo[0][f]), p2 = x3_half_parts(hi[0][f]);
        const uint32_t af[4] = {p0.x, p0.y, p2.x, p2.y};
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          uint2 wb, ws;
          if (f < KREG) {
            const uint32_t(&b)[kFrag][2] = bfr[nt][f < KREG ? f : 0];
            wb = make_uint2(b[0][0], b[0][1]);
            ws = make_uint2(b[1][0], b[1][1]);
          } else {
            wb = wsm[(((f - KREG) * kFrag + 0) * kNT + nt) * 32];
            ws = wsm[(((f - KREG) * kFrag + 1) * kNT + nt) * 32];
          }
          MmaInst<c10::Half>::run(acc_lo[nt], af, ws.x, ws.y);
          MmaInst<c10::Half>::run(acc[nt], af, wb.x, wb.y);
        }
      }
      // The small terms times 2^-11, then back from the scaled fragments (exact: powers of two).
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        acc[nt][0] = (acc[nt][0] + (acc[nt][2] + acc_lo[nt][0]) * 0x1p-11f) * w_unscale;
        acc[nt][1] = (acc[nt][1] + (acc[nt][3] + acc_lo[nt][1]) * 0x1p-11f) * w_unscale;
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
      // All four sums first, then the rare branch once: a branch between the sums would serialise
      // their shared-memory loads on the path to publication.
      acc_t partial[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        partial[q] = sum_partials<kWarps>(rr + q * U, kWarps, kDirectWarp, 0);
        // kScaled: the rows that read h0 this step ([nll, bt)) read it times their row's power of two.
        if constexpr (kScaled) partial[q] *= it.n >= nll ? h0_scale[16 + it.n] : 1.0f;
      }
      if constexpr (kX3Words) {
        // kX3Words: h0's non-finite values entered the MMAs as 0; their products are added here.
        if (__builtin_expect(it.n >= nll && h0_scale[32 + it.n] != 0.0f, 0)) {
#pragma unroll  // unrolled: a rolled loop indexes partial[] and puts it on the stack
          for (int q = 0; q < 4; ++q) {
            partial[q] += h0_non_finite_products(a.w_hh + (static_cast<int64_t>(q) * H + it.j) * H,
                                                 a.h0 + static_cast<int64_t>(it.n) * H, H);
          }
        }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) pq[q] = pv[q] + bias_r[q] + partial[q];
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
    if constexpr (kX3Words) {
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
  // kHalfScaled: h0's 16 row scales and their inverses after the step table; kHalfX3 16 row flags more
  // (kTf32x3 those flags at the same offsets).
  const size_t h0_scales =
      (P == Path::kHalfScaled ? 32 : P == Path::kHalfX3 || P == Path::kTf32x3 ? 48 : 0) * sizeof(float);
  g.smem = g.off_seg + static_cast<int>(sizeof(SegTable) + h0_scales);
  return static_cast<size_t>(g.smem) <= prop.sharedMemPerBlockOptin;
}

}  // namespace

// The direct forward kernel (DP: kMma16, kTf32, kTf32x3, kHalfScaled or kHalfX3) where one of its instances
// takes the call; false otherwise, having launched nothing.
template <class scalar_t, Path DP, bool kTraining>
bool run_direct_forward(const LstmSizes& s, const cudaDeviceProp& prop, FwdArgs<scalar_t>& args,
                        const at::Tensor& like) {
  // The kernel instance is chosen by KPC, the k-steps per warp of the geometry, and KPC
  // depends on U: try each instance with the U values that give its KPC.
  auto try_direct = [&](auto kpc_c, auto u4_c, auto rows_c) {
    constexpr int KPC = decltype(kpc_c)::value, U4 = decltype(u4_c)::value, ROWS = decltype(rows_c)::value;
    // The k-steps whose W_hh fragments stay in registers, the rest in shared memory: TF32 and x3
    // on fp16 parts (two fragments per k-step) at 8 k-steps per warp half; x3 on TF32 parts (four)
    // 3 of 8 (160 KB in shared memory at 8 units per block), and 2 of 4 at 8 units per block.
    constexpr bool kTwoFrags = DP == Path::kTf32 || DP == Path::kHalfX3;
    constexpr int KREG = DP == Path::kTf32x3       ? (KPC == 8 ? 3 : KPC == 4 && !U4 ? 2 : KPC)
                         : kTwoFrags && KPC == 8 ? 4
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
  if constexpr (DP == Path::kHalfX3) {
    // B <= 8 (the A tile's rows g + 8 hold the small parts) at 8 k-steps per warp (Hp > 512), where
    // TF32 parts kept 160 KB of W_hh in shared memory; at Hp <= 512 those stay faster
    // (direct_x3_half_products' measurements, lstm_persistent.cuh).
    return rows == 1 && (try_direct(IntConst<8>{}, IntConst<1>{}, IntConst<1>{}) ||
                         try_direct(IntConst<8>{}, IntConst<0>{}, IntConst<1>{}));
  } else {
    if constexpr (DP == Path::kMma16 || DP == Path::kHalfScaled) {
      if (rows == 0) return try_each(IntConst<0>{});
    }
    return rows == 1 ? try_each(IntConst<1>{}) : try_each(IntConst<2>{});
  }
}

// The instances run_forward (lstm_persistent.cu) calls: tensor-core paths of each dtype.
#define SK_INSTANTIATE_DIRECT(T, DP)                                                                                \
  template bool run_direct_forward<T, DP, false>(const LstmSizes&, const cudaDeviceProp&, FwdArgs<T>&,              \
                                                 const at::Tensor&);                                                \
  template bool run_direct_forward<T, DP, true>(const LstmSizes&, const cudaDeviceProp&, FwdArgs<T>&,               \
                                                const at::Tensor&);
SK_INSTANTIATE_DIRECT(float, Path::kTf32)
SK_INSTANTIATE_DIRECT(float, Path::kHalfScaled)
SK_INSTANTIATE_DIRECT(float, Path::kTf32x3)
SK_INSTANTIATE_DIRECT(float, Path::kHalfX3)
SK_INSTANTIATE_DIRECT(c10::Half, Path::kMma16)
SK_INSTANTIATE_DIRECT(c10::BFloat16, Path::kMma16)
#undef SK_INSTANTIATE_DIRECT

}  // namespace persistent
}  // namespace cuda
}  // namespace seqkernels
