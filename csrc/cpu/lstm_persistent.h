// Persistent small-batch LSTM loops for the CPU (float32; lstm.cpp adds a projection phase to
// the forward and the backward, forward_persistent_projected and backward_persistent_projected).
//
// At small batch a step's recurrent product is a few hundred kFLOP: a BLAS call per step
// costs more in threading and packing overhead than in arithmetic. Here each thread owns
// a contiguous range of hidden units (all four gates of them) for the whole sequence,
// keeps its slice of W_hh hot in its own cache, computes its gate pre-activations with a
// register-blocked kernel, applies the gate math in place, and meets the other threads at
// one barrier per step. This is the CPU counterpart of the persistent CUDA kernel.
//
// Shape legend: T steps, N packed rows, B batch, H hidden, G = 4H, step t owns rows
// [off_t, off_t + bt).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "amx_x3.h"
#include "seqkernels/lstm_cell.h"
#include "vec_math.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include <unistd.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace seqkernels::cpu {

// Eight float lanes: one AVX2 register. GCC/Clang vector extensions keep the kernels
// readable and portable (they lower to whatever the target offers).
typedef float v8f __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }
// (An initialiser list, not v8f{} + x: 0 + x is not x for x = -0, so that would cost an add.)
inline v8f splat8(float x) { return v8f{x, x, x, x, x, x, x, x}; }

constexpr int64_t kUnitTile = 8;              // AVX2: hidden units per packed tile (one register per gate)
constexpr int64_t kPersistentMaxBatch = 256;  // measured (2-core EPYC, H 256/512, both kernel sets): faster than the BLAS loop at every B up to 256
constexpr int64_t kChunkK = 128;              // AVX2: k per L1-resident chunk of a W tile (16 KB)
constexpr int kSpinsBeforeSteal = 2048;

// What a product's accumulators start from in its first k-chunk: the pre-activations already
// in `pre` (a second product, or the input projection computed before the loop), the bias
// (the first product of a step: no per-step copy of the bias into `pre`), or zero.
enum class AccStart { kPre, kBias, kZero };

// Which register width the persistent loop's products use. AVX-512 doubles the registers
// (32) as well as their width, which is what lets a tile keep 4 rows x 4 gates of
// accumulators and load each W vector once per 4 FMAs; the AVX2 kernels are the baseline.
enum class CpuKernels { kAvx2, kAvx512 };

// AVX-512 where the CPU (and OS) has it, unless SEQKERNELS_CPU_AVX512=0 (a diagnostic
// switch, also how the tests reach the AVX2 kernels on an AVX-512 machine).
inline CpuKernels cpu_kernels() {
#if defined(__x86_64__) || defined(_M_X64)
  const char* env = std::getenv("SEQKERNELS_CPU_AVX512");
  const bool allowed = env == nullptr || std::strcmp(env, "0") != 0;
  if (allowed && __builtin_cpu_supports("avx512f")) return CpuKernels::kAvx512;
#endif
  return CpuKernels::kAvx2;
}

// Hidden units per packed tile: one vector register per gate.
inline int64_t unit_tile(CpuKernels kernels) { return kernels == CpuKernels::kAvx512 ? 16 : kUnitTile; }
// Whether pack_gate_weights lays out the forward's W for `kernels` in gate pairs (AVX-512).
inline bool packs_gate_pairs(CpuKernels kernels) { return kernels == CpuKernels::kAvx512; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#endif
}

// Runs step_fn(part, s) for every part in [0, parts) and every s in [0, steps), all parts
// of step s before any of step s + 1. Threads start on their own parts (cache affinity);
// a thread that finds a part of the current step unclaimed after spinning runs it itself,
// so the loop completes with any number of threads, including one (nested parallelism);
// with several parts per thread it takes unclaimed parts without spinning first.
template <class StepFn>
void run_steps(int64_t parts, int64_t steps, const StepFn& step_fn) {
  std::vector<std::atomic<int64_t>> next_step(parts);
  for (auto& n : next_step) n.store(0, std::memory_order_relaxed);
  std::atomic<int64_t> done{0};
  auto try_run = [&](int64_t p, int64_t s) {
    int64_t expected = s;
    if (next_step[p].load(std::memory_order_relaxed) == s &&
        next_step[p].compare_exchange_strong(expected, s + 1, std::memory_order_acq_rel)) {
      step_fn(p, s);
      done.fetch_add(1, std::memory_order_acq_rel);
    }
  };
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t p = begin; p < end; ++p) try_run(p, s);
      // Several parts per thread: take the others' unstarted parts at once, last first (their
      // owners run theirs first to last), so that a slower core holds the step up by one part
      // at most.
      if (end - begin > 1) {
        for (int64_t i = 1; i <= parts; ++i) try_run((begin + parts - i) % parts, s);
      }
      const int64_t target = (s + 1) * parts;
      int spins = 0;
      while (done.load(std::memory_order_acquire) < target) {
        if (++spins < kSpinsBeforeSteal) {
          cpu_relax();
          continue;
        }
        for (int64_t p = 0; p < parts; ++p) try_run(p, s);
        std::this_thread::yield();
        spins = 0;
      }
    }
  });
}

// The L2 cache of one core in bytes (0 where the system does not say).
inline int64_t l2_cache_bytes() {
  static const int64_t bytes = std::max<long>(0, sysconf(_SC_LEVEL2_CACHE_SIZE));
  return bytes;
}

// Hidden units [j0, j1) owned by a part: whole tiles, split as evenly as possible.
struct UnitRange {
  int64_t j0, j1;
};
inline UnitRange part_units(int64_t part, int64_t parts, int64_t H, int64_t tile) {
  const int64_t tiles = (H + tile - 1) / tile;
  const int64_t u0 = part * tiles / parts, u1 = (part + 1) * tiles / parts;
  return {std::min(H, u0 * tile), std::min(H, u1 * tile)};
}

inline int64_t packed_gate_weights_numel(int64_t H, int64_t K, int64_t tile) { return (H + tile - 1) / tile * K * 4 * tile; }

// dst[k * ldd + l] = src[l * lds + k] for an 8 x 8 block (8 rows of src, 8 of dst).
inline void transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
#if defined(__AVX2__)
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
#else
  for (int k = 0; k < 8; ++k)
    for (int l = 0; l < 8; ++l) dst[k * ldd + l] = src[l * lds + k];
#endif
}

// w [G, K] (W_hh with K = H, W_ih with K = I) -> packed, per tile of `tile` units, as
// [K, 4 gates, tile] (the AVX2 kernels) or, with `gate_pairs`, as [2 gate pairs, K, 2 gates,
// tile] (the AVX-512 kernels: avx512::tile_rows_pair streams one pair's 128-byte rows, and
// avx512::tile_rows reads the two pairs' rows of a k side by side). Units past H are zero.
// It runs on every call, so it must cost about one pass over W: the source is read 8 rows at
// a time, each row's cache line consumed whole (16 k) by two 8 x 8 transposes. Gathering one
// k of 64 rows at a time instead (the first version) touched rows K floats apart, which at
// K = 512 or 1024 share one L1 set: a miss per element, 1.4 ms per call at H = 512 and 7 ms at
// H = 1024, more than an LSTMCell step.
inline void pack_gate_weights(const float* w, int64_t H, int64_t K, int64_t tile, bool gate_pairs, float* packed) {
  const int64_t tiles = (H + tile - 1) / tile;
  const int64_t per_row = gate_pairs ? 2 : 4;  // gates in one packed row (one k)
  at::parallel_for(0, tiles, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      for (int64_t g = 0; g < 4; ++g) {
        // Gate g's rows: row k at dst + k * ld.
        float* dst = packed + u * K * 4 * tile + (g / per_row) * K * per_row * tile + (g % per_row) * tile;
        const int64_t ld = per_row * tile;
        for (int64_t l0 = 0; l0 < tile; l0 += 8) {
          const int64_t j0 = u * tile + l0;
          const int64_t k_fast = j0 + 8 <= H ? K / 16 * 16 : 0;  // whole 8-unit groups, 16-k blocks
          const float* src = w + (g * H + j0) * K;
          for (int64_t k = 0; k < k_fast; k += 16) {
            transpose8x8(src + k, K, dst + k * ld + l0, ld);
            transpose8x8(src + k + 8, K, dst + (k + 8) * ld + l0, ld);
          }
          for (int64_t k = k_fast; k < K; ++k)
            for (int64_t l = l0; l < l0 + 8; ++l) {
              const int64_t j = u * tile + l;
              dst[k * ld + l] = j < H ? w[(g * H + j) * K + k] : 0.f;
            }
        }
      }
    }
  });
}

// pre[r, g*H + j0 .. +nj] += a[r, k0:k1]·W[g*H + j0 .. +nj, k0:k1]ᵀ for R rows and one
// tile, W being W_hh (a = h) or W_ih (a = x) (callers split k into chunks so that a chunk
// of the tile stays in L1 while every row pair streams over it).
//   pre: [R, G] row stride ldp; a: [R, K] row stride lda; w_tile: packed [K, 4, 8]
// An FMA has a latency of ~4 cycles and two issue per cycle, so a core needs >= 8
// independent accumulators: R rows × 4 gates × S interleaved k-streams (S = 2 for a
// single row) keeps both FMA pipes busy.
//   start: kPre adds to pre; kBias starts from bias[g*H + j] (every row), kZero from 0
template <int R, int S>
inline void tile_product(int64_t H, int64_t j0, int64_t nj, int64_t k0, int64_t k1, const float* a, int64_t lda,
                           const float* w_tile, float* pre, int64_t ldp, AccStart start, const float* bias) {
  const bool full = nj == kUnitTile;  // only the last tile of an H that is no multiple of 8 is partial
  v8f acc[S][R][4];
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < 4; ++g) {
      const float* src = start == AccStart::kBias ? bias + g * H + j0 : pre + r * ldp + g * H + j0;
      if (start == AccStart::kZero) {
        acc[0][r][g] = v8f{};
      } else if (full) {
        acc[0][r][g] = load8(src);
      } else {
        float lanes[kUnitTile] = {};
        for (int64_t l = 0; l < nj; ++l) lanes[l] = src[l];
        acc[0][r][g] = load8(lanes);
      }
      for (int st = 1; st < S; ++st) acc[st][r][g] = v8f{};
    }
  }
  int64_t k = k0;
  for (; k + S <= k1; k += S) {
    for (int st = 0; st < S; ++st) {
      const float* w = w_tile + (k + st) * 4 * kUnitTile;
      const v8f w0 = load8(w), w1 = load8(w + 8), w2 = load8(w + 16), w3 = load8(w + 24);
      for (int r = 0; r < R; ++r) {
        const v8f hk = splat8(a[r * lda + k + st]);
        acc[st][r][0] += hk * w0;
        acc[st][r][1] += hk * w1;
        acc[st][r][2] += hk * w2;
        acc[st][r][3] += hk * w3;
      }
    }
  }
  for (; k < k1; ++k) {
    const float* w = w_tile + k * 4 * kUnitTile;
    for (int r = 0; r < R; ++r) {
      const v8f hk = splat8(a[r * lda + k]);
      for (int g = 0; g < 4; ++g) acc[0][r][g] += hk * load8(w + 8 * g);
    }
  }
  for (int st = 1; st < S; ++st)
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < 4; ++g) acc[0][r][g] += acc[st][r][g];
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < 4; ++g) {
      float* dst = pre + r * ldp + g * H + j0;
      if (full) {
        store8(dst, acc[0][r][g]);
      } else {
        float lanes[kUnitTile];
        store8(lanes, acc[0][r][g]);
        for (int64_t l = 0; l < nj; ++l) dst[l] = lanes[l];
      }
    }
  }
}

// The same product for R rows, two gates at a time: R rows x 2 gates of accumulators
// (12 at R = 6) and two W vectors in registers; the h_k broadcasts come from memory. With
// 16 registers this is the AVX2 analogue of a 6x16 SGEMM micro-kernel: each W vector
// feeds R FMAs. Single thread on the 2-core AVX2 EPYC (Zen 3), a part's whole product
// (B = 8 / 64, H = 256 / 512): 84-91 GFLOP/s at R = 6 against 42-68 for
// tile_product<2, 1> (its 8 accumulators leave the FMA pipes waiting on latency).
//   arguments as tile_product, but A as the block's rows packed [K, R] (pack_row_blocks_avx2)
template <int R>
inline void tile_product_pairs(int64_t H, int64_t j0, int64_t nj, int64_t k0, int64_t k1, const float* a_packed,
                               const float* w_tile, float* pre, int64_t ldp, AccStart start, const float* bias) {
  const bool full = nj == kUnitTile;
  for (int g0 = 0; g0 < 4; g0 += 2) {
    v8f acc[R][2];
    for (int r = 0; r < R; ++r) {
      for (int g = 0; g < 2; ++g) {
        const float* src = start == AccStart::kBias ? bias + (g0 + g) * H + j0 : pre + r * ldp + (g0 + g) * H + j0;
        if (start == AccStart::kZero) {
          acc[r][g] = v8f{};
        } else if (full) {
          acc[r][g] = load8(src);
        } else {
          float lanes[kUnitTile] = {};
          for (int64_t l = 0; l < nj; ++l) lanes[l] = src[l];
          acc[r][g] = load8(lanes);
        }
      }
    }
    const float* w = w_tile + k0 * 4 * kUnitTile + g0 * kUnitTile;
    const float* a = a_packed + k0 * R;
    for (int64_t k = k0; k < k1; ++k, w += 4 * kUnitTile, a += R) {
      const v8f w0 = load8(w), w1 = load8(w + kUnitTile);
      for (int r = 0; r < R; ++r) {
        const v8f hk = splat8(a[r]);
        acc[r][0] += hk * w0;
        acc[r][1] += hk * w1;
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int g = 0; g < 2; ++g) {
        float* dst = pre + r * ldp + (g0 + g) * H + j0;
        if (full) {
          store8(dst, acc[r][g]);
        } else {
          float lanes[kUnitTile];
          store8(lanes, acc[r][g]);
          for (int64_t l = 0; l < nj; ++l) dst[l] = lanes[l];
        }
      }
    }
  }
}

// Calls block(rows, b) over the rows [0, bt) in blocks of 6, rows a
// std::integral_constant<int, R> (the kernels' template argument). A remainder of 2 or 3
// after a block of 6 is rebalanced into 4 + 4 or 5 + 4: a pair kernel's R rows hold 2R
// accumulators, too few below R = 4 to hide the FMA latency.
template <class Block>
inline void for_row_blocks_avx2(int64_t bt, const Block& block) {
  const int64_t rem = bt % 6;
  const int64_t sixes = bt / 6 - (bt >= 6 && (rem == 2 || rem == 3) ? 1 : 0);
  int64_t b = 0;
  for (; b < 6 * sixes; b += 6) block(std::integral_constant<int, 6>{}, b);
  for (int64_t left = bt - b; left > 0; left = bt - b) {
    const int64_t n = left > 5 ? left - 4 : left;  // 8 -> 4 + 4, 9 -> 5 + 4
    switch (n) {
      case 5: block(std::integral_constant<int, 5>{}, b); break;
      case 4: block(std::integral_constant<int, 4>{}, b); break;
      case 3: block(std::integral_constant<int, 3>{}, b); break;
      case 2: block(std::integral_constant<int, 2>{}, b); break;
      default: block(std::integral_constant<int, 1>{}, b); break;
    }
    b += n;
  }
}

// Rows [0, bt) of a ([bt, K], row stride lda) in the blocks of for_row_blocks_avx2, each block
// of R rows packed [K, R] and starting at the result + b * K (a per-thread buffer, valid until
// the thread's next call). The kernels then broadcast from one pointer at fixed offsets:
// reading the rows in place, GCC kept the row offsets on the stack and reloaded them every k
// (13 loads per 12 FMAs instead of 8). Costs bt * K copies per part and product, 1-2% of
// the product's memory traffic.
inline const float* pack_row_blocks_avx2(const float* a, int64_t lda, int64_t bt, int64_t K) {
  thread_local std::vector<float> packed;
  packed.resize(std::max<int64_t>(1, bt * K));
  for_row_blocks_avx2(bt, [&](auto r, int64_t b) {
    constexpr int R = decltype(r)::value;
    float* dst = packed.data() + b * K;
    for (int64_t k = 0; k < K; ++k)
      for (int rr = 0; rr < R; ++rr) dst[k * R + rr] = a[(b + rr) * lda + k];
  });
  return packed.data();
}

// One part's share of a step's product with W_hh (a = h_{t-1}, K = H) or W_ih (a = x_t,
// K = I), AVX2: pre[:bt, g*H + j] += a[:bt, :]·W[g*H + j, :]ᵀ for its units j in [j0, j1).
// Rows go in blocks of 6 (tile_product_pairs); one or two rows left over take all four gates
// at once (tile_product: 8 accumulators, where a pair kernel would have 2 or 4).
//   a: [bt, K] row stride lda; w_packed: pack_gate_weights layout with kUnitTile; pre: [bt, G] row stride ldp
//   start, bias: what the accumulators start from (AccStart; bias [G])
inline void units_product_avx2(int64_t H, int64_t K, int64_t bt, int64_t j0, int64_t j1, const float* a, int64_t lda,
                               const float* w_packed, float* pre, int64_t ldp, AccStart start, const float* bias) {
  const float* a_packed = pack_row_blocks_avx2(a, lda, bt, K);
  for (int64_t j = j0; j < j1; j += kUnitTile) {
    const int64_t nj = std::min(kUnitTile, j1 - j);
    const float* w_tile = w_packed + (j / kUnitTile) * K * 4 * kUnitTile;
    // K = 0 still runs one empty chunk, so that the start values reach pre.
    for (int64_t k0 = 0; k0 < std::max<int64_t>(K, 1); k0 += kChunkK) {
      const int64_t k1 = std::min(K, k0 + kChunkK);
      const AccStart chunk_start = k0 == 0 ? start : AccStart::kPre;
      for_row_blocks_avx2(bt, [&](auto r, int64_t b) {
        constexpr int R = decltype(r)::value;
        if constexpr (R >= 3) {
          tile_product_pairs<R>(H, j, nj, k0, k1, a_packed + b * K, w_tile, pre + b * ldp, ldp, chunk_start, bias);
        } else {  // all four gates at once: 8 accumulators
          tile_product<R, 3 - R>(H, j, nj, k0, k1, a + b * lda, lda, w_tile, pre + b * ldp, ldp, chunk_start, bias);
        }
      });
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// LstmGates<__m256> drops __m256's alignment attribute (harmless: register values only).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
// FastFloatMath (vec_math.h) on 8 lanes, with its constants (fast_math): the gate passes of
// the AVX2 loop run lstm_cell.h on whole registers. GCC's auto-vectorised scalar loop
// (forward_gate_rows in lstm.cpp) took ~28% of a B = 8, H = 256 `infer` call on the 2-core
// AVX2 EPYC (perf), as much as the recurrent products.
struct Avx2Math {
  static inline __m256 exp(__m256 x) {
    using namespace fast_math;
    // x second: MAXPS / MINPS return their second operand where either is NaN, so NaN stays NaN
    // (with x first a NaN gate input became exp(kExpMin): finite outputs where nn.LSTM has NaN).
    x = _mm256_min_ps(_mm256_set1_ps(kExpMax), _mm256_max_ps(_mm256_set1_ps(kExpMin), x));
    const __m256 shifter = _mm256_set1_ps(kShifter);
    const __m256 shifted = _mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), shifter);
    const __m256 n = _mm256_sub_ps(shifted, shifter);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
    __m256 p = _mm256_set1_ps(kExpPoly[0]);
    for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    const __m256i scale_bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(kShifterBits)),
                         _mm256_set1_epi32(127)),
        23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(scale_bits));
  }
  static inline __m256 sigmoid(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(one, _mm256_add_ps(one, exp(_mm256_sub_ps(_mm256_setzero_ps(), x))));
  }
  static inline __m256 tanh(__m256 x) {
    using namespace fast_math;
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    const __m256 ax = _mm256_andnot_ps(sign_bit, x);
    const __m256 e = exp(_mm256_mul_ps(_mm256_set1_ps(-2.0f), ax));
    const __m256 big = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    const __m256 x2 = _mm256_mul_ps(x, x);
    __m256 series = _mm256_fmadd_ps(x2, _mm256_set1_ps(kTanhSeries[2]), _mm256_set1_ps(kTanhSeries[1]));
    series = _mm256_fmadd_ps(x2, series, _mm256_set1_ps(kTanhSeries[0]));
    series = _mm256_mul_ps(ax, _mm256_fmadd_ps(x2, series, one));
    const __m256 small = _mm256_cmp_ps(ax, _mm256_set1_ps(kTanhSeriesBelow), _CMP_LT_OQ);
    const __m256 mag = _mm256_blendv_ps(big, series, small);
    return _mm256_or_ps(mag, _mm256_and_ps(x, sign_bit));
  }
};

// Lanes [0, n) of a vector of 8 (n may exceed 8): the mask of _mm256_maskload_ps / maskstore.
inline __m256i lanes8(int64_t n) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, 8))), index);
}

// forward_gate_rows (lstm.cpp) on 8 units at a time, for float32: batch rows [0, bt), hidden
// units [j0, j1). Same layouts: pre [bt, G] row stride ldp; cbuf [B, H]; m_out [bt, H];
// gates [bt, G] / cells [bt, H] when training; h_copy [bt, H] (row stride H) gets m_out again.
// gates may be pre itself (forward_gate_rows): a unit's loads come before its stores.
template <bool kTraining>
__attribute__((flatten)) inline void gate_rows_avx2(int64_t bt, int64_t j0, int64_t j1, int64_t H, const float* pre,
                                                    int64_t ldp, float* cbuf, float* m_out, float* gates,
                                                    float* cells, float* h_copy) {
  const int64_t G = 4 * H;
  for (int64_t b = 0; b < bt; ++b) {
    const float* p = pre + b * ldp;
    for (int64_t j = j0; j < j1; j += kUnitTile) {
      const __m256i mask = lanes8(j1 - j);
      const LstmGates<__m256> pre_j{_mm256_maskload_ps(p + j, mask), _mm256_maskload_ps(p + H + j, mask),
                                    _mm256_maskload_ps(p + 2 * H + j, mask),
                                    _mm256_maskload_ps(p + 3 * H + j, mask)};
      LstmGates<__m256> act;
      __m256 c_new, m_new;
      lstm_cell_forward<Avx2Math>(pre_j, _mm256_maskload_ps(cbuf + b * H + j, mask), act, c_new, m_new);
      _mm256_maskstore_ps(cbuf + b * H + j, mask, c_new);
      _mm256_maskstore_ps(m_out + b * H + j, mask, m_new);
      _mm256_maskstore_ps(h_copy + b * H + j, mask, m_new);
      if constexpr (kTraining) {
        float* gs = gates + b * G + j;
        _mm256_maskstore_ps(gs, mask, act.i);
        _mm256_maskstore_ps(gs + H, mask, act.f);
        _mm256_maskstore_ps(gs + 2 * H, mask, act.g);
        _mm256_maskstore_ps(gs + 3 * H, mask, act.o);
        _mm256_maskstore_ps(cells + b * H + j, mask, c_new);
      }
    }
  }
}

// backward_gate_rows (lstm.cpp, no projection) on 8 units at a time, for float32, with
// dL/dh_t = dh + grad_y summed in registers (no pass of its own): batch rows [0, bt), hidden
// units [j0, j1). Layouts as avx512::backward_gate_rows: gates [bt, G]; cells [bt, H];
// prev_cells / c0 [.., H] (rows b < n_prev from prev_cells); dh, grad_y [bt, H]; dcbuf [B, H]
// dL/dc_t in, dL/dc_{t-1} out; dpre [bt, G].
__attribute__((flatten)) inline void backward_gate_rows_avx2(int64_t bt, int64_t j0, int64_t j1, int64_t H,
                                                             const float* gates, const float* cells,
                                                             const float* prev_cells, int64_t n_prev, const float* c0,
                                                             const float* dh, const float* grad_y, float* dcbuf,
                                                             float* dpre) {
  const int64_t G = 4 * H;
  for (int64_t b = 0; b < bt; ++b) {
    const float* a = gates + b * G;
    const float* cp = b < n_prev ? prev_cells + b * H : c0 + b * H;
    float* dp = dpre + b * G;
    for (int64_t j = j0; j < j1; j += kUnitTile) {
      const __m256i mask = lanes8(j1 - j);
      const LstmGates<__m256> act{_mm256_maskload_ps(a + j, mask), _mm256_maskload_ps(a + H + j, mask),
                                  _mm256_maskload_ps(a + 2 * H + j, mask), _mm256_maskload_ps(a + 3 * H + j, mask)};
      const __m256 dm =
          _mm256_add_ps(_mm256_maskload_ps(dh + b * H + j, mask), _mm256_maskload_ps(grad_y + b * H + j, mask));
      LstmGates<__m256> d;
      __m256 dc_prev, m;
      lstm_cell_backward<Avx2Math>(act, _mm256_maskload_ps(cells + b * H + j, mask), _mm256_maskload_ps(cp + j, mask),
                                   dm, _mm256_maskload_ps(dcbuf + b * H + j, mask), d, dc_prev, m);
      _mm256_maskstore_ps(dcbuf + b * H + j, mask, dc_prev);
      _mm256_maskstore_ps(dp + j, mask, d.i);
      _mm256_maskstore_ps(dp + H + j, mask, d.f);
      _mm256_maskstore_ps(dp + 2 * H + j, mask, d.g);
      _mm256_maskstore_ps(dp + 3 * H + j, mask, d.o);
    }
  }
}
#pragma GCC diagnostic pop
#define SEQKERNELS_AVX2_GATES 1
#endif  // __AVX2__ && __FMA__

// W_hh [G, H] -> [column blocks of `block` units, G, block], or with `halves`
// [column blocks, 2 halves, G, block / 2] (AVX-512: avx512::grad_rows_half streams one half's
// 128-byte rows, avx512::grad_rows reads both halves' rows of a gate row): the backward's
// products then read each chunk of gate rows as one contiguous block. In W_hh itself
// consecutive gate rows of a block lie H floats apart, so at H = 256 a 16 KB chunk would fall
// into a quarter of the L1 sets and not stay resident (AVX-512, B = 8, H = 256 `train`: 59.6
// -> 43.2 ms; AVX2 on the 2-core AVX2 EPYC: docs/kernels.md). Units past H are zero.
inline int64_t packed_w_hh_columns_numel(int64_t H, int64_t block) { return (H + block - 1) / block * 4 * H * block; }
inline void pack_w_hh_columns(const float* w_hh, int64_t H, int64_t block, bool halves, float* packed) {
  const int64_t G = 4 * H, blocks = (H + block - 1) / block;
  const int64_t parts = halves ? 2 : 1, width = block / parts;
  at::parallel_for(0, blocks * G, 256, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t blk = i / G, g = i % G;
      for (int64_t p = 0; p < parts; ++p) {
        float* dst = packed + blk * G * block + p * G * width + g * width;
        const int64_t k0 = blk * block + p * width;
        const int64_t n = std::clamp<int64_t>(H - k0, 0, width);  // the last block may be partial
        std::memcpy(dst, w_hh + g * H + k0, sizeof(float) * n);
        std::fill(dst + n, dst + width, 0.f);
      }
    }
  });
}

constexpr int64_t kGradBlockAvx2 = 2 * kUnitTile;  // AVX2 backward: units per column block (two vectors)
constexpr int64_t kChunkGAvx2 = 256;               // gate rows per chunk: 256 x 16 units x 4 B = 16 KB of W_hh
constexpr int64_t kPackGradBlocksAvx2 = 4;         // column blocks per part from which dpre is packed

// dh[r, k0 .. k0 + 16) (+)= dpre[r, g0:g1]·W_hh[g0:g1, k0 .. k0 + 16) for R rows (AVX2): the
// first chunk of gate rows writes, later ones add (a fixed order: deterministic). R rows x 2
// vectors of accumulators, as tile_product_pairs, in two interleaved g-streams for R <= 2;
// nk: units of the block that exist.
//   dpre_rows: the block's rows of dpre, packed [G, R] (pack_row_blocks_avx2) or [R, G] row
//   stride G; w_block: packed [G, 16] of the block at k0; dh: [R, H] row stride H
template <int R, bool kPacked>
inline void grad_rows_avx2(int64_t H, int64_t k0, int64_t nk, int64_t g0, int64_t g1, const float* dpre_rows,
                           const float* w_block, float* dh) {
  constexpr int S = R <= 2 ? 2 : 1;  // interleaved g-streams: at least 4 accumulators
  const int64_t G = 4 * H;
  const auto dpre = [&](int r, int64_t g) { return kPacked ? dpre_rows[g * R + r] : dpre_rows[r * G + g]; };
  v8f acc[S][R][2];
  for (int r = 0; r < R; ++r) {
    float lanes[kGradBlockAvx2] = {};
    if (g0 > 0) std::memcpy(lanes, dh + r * H + k0, sizeof(float) * nk);
    acc[0][r][0] = load8(lanes);
    acc[0][r][1] = load8(lanes + kUnitTile);
    for (int st = 1; st < S; ++st) acc[st][r][0] = acc[st][r][1] = v8f{};
  }
  int64_t g = g0;
  for (; g + S <= g1; g += S) {
    for (int st = 0; st < S; ++st) {
      const float* w = w_block + (g + st) * kGradBlockAvx2;
      const v8f w0 = load8(w), w1 = load8(w + kUnitTile);
      for (int r = 0; r < R; ++r) {
        const v8f d = splat8(dpre(r, g + st));
        acc[st][r][0] += d * w0;
        acc[st][r][1] += d * w1;
      }
    }
  }
  for (; g < g1; ++g) {
    const float* w = w_block + g * kGradBlockAvx2;
    for (int r = 0; r < R; ++r) {
      const v8f d = splat8(dpre(r, g));
      acc[0][r][0] += d * load8(w);
      acc[0][r][1] += d * load8(w + kUnitTile);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int st = 1; st < S; ++st) {
      acc[0][r][0] += acc[st][r][0];
      acc[0][r][1] += acc[st][r][1];
    }
    float lanes[kGradBlockAvx2];
    store8(lanes, acc[0][r][0]);
    store8(lanes + kUnitTile, acc[0][r][1]);
    std::memcpy(dh + r * H + k0, lanes, sizeof(float) * nk);
  }
}

// dh[:bt, k] = dpre[:bt, :]·W_hh[:, k] for the units k in [k0, k1) (k0 a multiple of 16),
// in column blocks of 16 units and chunks of kChunkGAvx2 gate rows (each chunk stays in L1
// over all row blocks), rows in blocks as units_product_avx2.
//   w_packed: pack_w_hh_columns layout with kGradBlockAvx2
inline void recurrent_grad_units_avx2(int64_t bt, int64_t H, int64_t k0, int64_t k1, const float* dpre,
                                      const float* w_packed, float* dh) {
  const int64_t G = 4 * H;
  // Each column block reads all of dpre once, so packing it (one more write and read of it)
  // is paid back from a few blocks per part; at B >= 16 and H = 256 a part has two (several
  // parts per thread). On the 2-core AVX2 EPYC packing looked ~5% faster at B = 8 and ~5%
  // slower at B = 16 (`train`, H = 256), both within that machine's run-to-run noise.
  const bool packed = k1 - k0 >= kPackGradBlocksAvx2 * kGradBlockAvx2;
  const float* rows_src = packed ? pack_row_blocks_avx2(dpre, G, bt, G) : dpre;
  for (int64_t kb = k0; kb < k1; kb += kGradBlockAvx2) {
    const int64_t nk = std::min(kGradBlockAvx2, k1 - kb);
    const float* w_block = w_packed + (kb / kGradBlockAvx2) * G * kGradBlockAvx2;
    for (int64_t g0 = 0; g0 < G; g0 += kChunkGAvx2) {
      const int64_t g1 = std::min(G, g0 + kChunkGAvx2);
      for_row_blocks_avx2(bt, [&](auto r, int64_t b) {
        constexpr int R = decltype(r)::value;
        if (packed) {
          grad_rows_avx2<R, true>(H, kb, nk, g0, g1, rows_src + b * G, w_block, dh + b * H);
        } else {
          grad_rows_avx2<R, false>(H, kb, nk, g0, g1, rows_src + b * G, w_block, dh + b * H);
        }
      });
    }
  }
}

// ---------------------------------------------------------------------------------------
// AVX-512 kernels (x86-64 only; compiled for AVX-512 by function attribute and called only
// when cpu_kernels() says the CPU has it). Tiles of 16 units: one zmm register per gate.
#if defined(__x86_64__) || defined(_M_X64)
#define SEQKERNELS_AVX512 __attribute__((target("avx512f,avx2,fma")))
// LstmGates<__m512> drops __m512's alignment attribute (harmless: it only lives in registers
// and on the stack of target functions); GCC 12's AVX-512 headers warn about their own
// deliberately undefined vectors (_mm512_undefined_ps).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace avx512 {

constexpr int64_t kTile = 16;
// k per chunk of a W tile in the forward products: a chunk (k x 4 gates x 16 units x 4 B) stays
// in L1 while every row block streams over it. 128 k (32 KB) where the L1 data cache holds
// 48 KB or more (Intel since Ice Lake), else 64 k (16 KB; AMD Zen 4's L1 is 32 KB). Measured
// with bench_lstm.py-like A/B runs: on a 2-core Xeon (48 KB L1), B = 64, H = 256 `infer` went
// from 0.96x to 1.00-1.01x nn.LSTM with 128 (256 k: 0.92x); 64 was the best on the 2-core EPYC.
SEQKERNELS_AVX512 inline int64_t forward_chunk_k() {
  static const int64_t chunk = sysconf(_SC_LEVEL1_DCACHE_SIZE) >= 48 * 1024 ? 128 : 64;
  return chunk;
}
constexpr int64_t kChunkG = 64;   // backward: 64 gate rows x 64 units x 4 B = 16 KB of W_hh per chunk
constexpr int kRows = 4;          // rows per block: 4 rows x 4 gates = 16 accumulators + 4 W + 1 h register

SEQKERNELS_AVX512 inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

// Calls block(rows, b) for the rows [0, bt) in blocks of kRows and one block of the 1-3 rows
// left, rows a std::integral_constant<int, R> (the kernels' template argument).
template <class Block>
SEQKERNELS_AVX512 inline void for_row_blocks(int64_t bt, const Block& block) {
  int64_t b = 0;
  for (; b + kRows <= bt; b += kRows) block(std::integral_constant<int, kRows>{}, b);
  switch (bt - b) {
    case 3: block(std::integral_constant<int, 3>{}, b); break;
    case 2: block(std::integral_constant<int, 2>{}, b); break;
    case 1: block(std::integral_constant<int, 1>{}, b); break;
    default: break;
  }
}

// pre[r, g*H + j .. +16) += a[r, k0:k1]·W[g*H + j .. +16, k0:k1]ᵀ for R rows of one tile
// (W = W_hh or W_ih, as tile_product); `mask` keeps the lanes of units that exist (a
// last tile of an H that is no multiple of 16).
//   pre: [R, G] row stride ldp, offset to unit j; a: [R, K] row stride lda; w_tile: packed
//   [2 gate pairs, K, 2, 16] (pack_gate_weights with gate_pairs), the pairs `pair_stride` floats apart
// An FMA has a latency of ~4 cycles, so a core needs >= 4-8 independent accumulators:
// R rows x 4 gates, and for R = 1 two interleaved k-streams.
//   start: kPre adds to pre; kBias starts from bias[g*H + j] (bias offset to unit j), kZero from 0
template <int R>
SEQKERNELS_AVX512 inline void tile_rows(int64_t H, __mmask16 mask, int64_t k0, int64_t k1, const float* a,
                                        int64_t lda, const float* w_tile, int64_t pair_stride, float* pre,
                                        int64_t ldp, AccStart start, const float* bias) {
  constexpr int S = R == 1 ? 2 : 1;
  __m512 acc[S][R][4];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < 4; ++g) {
      acc[0][r][g] = start == AccStart::kPre    ? _mm512_maskz_loadu_ps(mask, pre + r * ldp + g * H)
                     : start == AccStart::kBias ? _mm512_maskz_loadu_ps(mask, bias + g * H)
                                                : _mm512_setzero_ps();
      for (int st = 1; st < S; ++st) acc[st][r][g] = _mm512_setzero_ps();
    }
  const float* w_pair1 = w_tile + pair_stride;
  int64_t k = k0;
  for (; k + S <= k1; k += S) {
    for (int st = 0; st < S; ++st) {
      const float* w = w_tile + (k + st) * 2 * kTile;
      const float* v = w_pair1 + (k + st) * 2 * kTile;
      const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(v),
                   w3 = _mm512_loadu_ps(v + 16);
      for (int r = 0; r < R; ++r) {
        const __m512 hk = _mm512_set1_ps(a[r * lda + k + st]);
        acc[st][r][0] = _mm512_fmadd_ps(hk, w0, acc[st][r][0]);
        acc[st][r][1] = _mm512_fmadd_ps(hk, w1, acc[st][r][1]);
        acc[st][r][2] = _mm512_fmadd_ps(hk, w2, acc[st][r][2]);
        acc[st][r][3] = _mm512_fmadd_ps(hk, w3, acc[st][r][3]);
      }
    }
  }
  for (; k < k1; ++k) {
    const float* w = w_tile + k * 2 * kTile;
    const float* v = w_pair1 + k * 2 * kTile;
    const __m512 wg[4] = {_mm512_loadu_ps(w), _mm512_loadu_ps(w + 16), _mm512_loadu_ps(v), _mm512_loadu_ps(v + 16)};
    for (int r = 0; r < R; ++r) {
      const __m512 hk = _mm512_set1_ps(a[r * lda + k]);
      for (int g = 0; g < 4; ++g) acc[0][r][g] = _mm512_fmadd_ps(hk, wg[g], acc[0][r][g]);
    }
  }
  for (int st = 1; st < S; ++st)
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < 4; ++g) acc[0][r][g] = _mm512_add_ps(acc[0][r][g], acc[st][r][g]);
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < 4; ++g) _mm512_mask_storeu_ps(pre + r * ldp + g * H, mask, acc[0][r][g]);
}

// Bytes ahead of its loads that tile_rows_pair and grad_rows_half prefetch W (16 rows of 128
// bytes). Measured on the 2-core Xeon, B = 8, one part's product alone, 1 / 2 / 4 KB ahead
// (none: the first row of each): forward H = 512 (2 MB of W, mostly from L3) 56.6 / 54.3 /
// 63.8 us (72.7), B = 6 49.6 / 43.9 / 54.9, H = 256 (512 KB, from L2) 11.0 / 11.0 / 11.6 (11.8);
// backward H = 512 57.6 / 52.9 / 66.1 (65.8), B = 6 47.2 / 51.4 / 52.6 (59.3), H = 256 11.3 /
// 11.1 / 11.7 (11.8).
constexpr int kPairPrefetchBytes = 2048;

// acc[r][v] += Σ_k a[r * lda + k] · w[k * 32 + 16 v .. +16) for R rows over n rows of w, each
// row two vectors (32 floats), prefetched kPairPrefetchBytes ahead (past the end of w is
// harmless: a prefetch never faults). The inner loop of tile_rows_pair and grad_rows_half.
template <int R>
SEQKERNELS_AVX512 inline void rows_times_two_vectors(int64_t n, const float* a, int64_t lda, const float* w,
                                                     __m512 (&acc)[R][2]) {
  for (int64_t k = 0; k < n; ++k, w += 2 * kTile) {
    _mm_prefetch(reinterpret_cast<const char*>(w) + kPairPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w) + kPairPrefetchBytes + 64, _MM_HINT_T0);
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 ak = _mm512_set1_ps(a[r * lda + k]);
      acc[r][0] = _mm512_fmadd_ps(ak, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(ak, w1, acc[r][1]);
    }
  }
}

// The product of tile_rows for R = 5..8 rows, over all of K, two gates at a time (gate pair gp:
// gates 2gp and 2gp + 1): R x 2 accumulators, 2 W vectors per k for 2R FMAs. Where tile_rows
// covers 8 rows as two blocks of 4, the first block's loads of W (from L2, or L3 when a part's
// W outgrows L2) come at 256 bytes per 16 FMAs and stall on it, and the second block's hit L1;
// here every k-step needs 128 bytes per 16 FMAs, which the caches (and the prefetch) keep up
// with. 2-core Xeon, B = 8, one part's product alone (the old kernel / this): H = 512 73.9 /
// 53.9 us (53 / 73 % of the FMA peak), H = 256 12.4 / 11.4; B = 16, H = 256 (two blocks of 8)
// 23.6 / 20.6; B = 32 and 64 alike.
//   w_pair: the pair's rows [K, 2, 16] (pack_gate_weights with gate_pairs); other arguments as
//   tile_rows, pre and bias offset to unit j
template <int R>
SEQKERNELS_AVX512 inline void tile_rows_pair(int64_t H, __mmask16 mask, int gp, int64_t K, const float* a,
                                             int64_t lda, const float* w_pair, float* pre, int64_t ldp,
                                             AccStart start, const float* bias) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < 2; ++g) {
      const int64_t col = (2 * gp + g) * H;
      acc[r][g] = start == AccStart::kPre    ? _mm512_maskz_loadu_ps(mask, pre + r * ldp + col)
                  : start == AccStart::kBias ? _mm512_maskz_loadu_ps(mask, bias + col)
                                             : _mm512_setzero_ps();
    }
  rows_times_two_vectors<R>(K, a, lda, w_pair, acc);
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < 2; ++g) _mm512_mask_storeu_ps(pre + r * ldp + (2 * gp + g) * H, mask, acc[r][g]);
}

// Calls block(rows, b) for the row blocks of units_product's gate-pair kernel: blocks of 8
// rows while at least 5 remain (the last of them 5-8 rows); returns the first row left
// (0-4 rows remain for tile_rows).
template <class Block>
SEQKERNELS_AVX512 inline int64_t for_pair_row_blocks(int64_t bt, const Block& block) {
  int64_t b = 0;
  for (; bt - b >= 5; b += 8) {
    switch (std::min<int64_t>(bt - b, 8)) {
      case 5: block(std::integral_constant<int, 5>{}, b); break;
      case 6: block(std::integral_constant<int, 6>{}, b); break;
      case 7: block(std::integral_constant<int, 7>{}, b); break;
      default: block(std::integral_constant<int, 8>{}, b); break;
    }
  }
  return std::min(b, bt);
}

// A part's product, as units_product_avx2 with 16-unit tiles: rows in blocks of 5-8 on
// tile_rows_pair, the 1-4 rows left (all of them below B = 5) on tile_rows in k-chunks.
//   a: [bt, K] row stride lda; w_packed: pack_gate_weights layout with kTile and gate pairs;
//   pre: [bt, G] row stride ldp
SEQKERNELS_AVX512 inline void units_product(int64_t H, int64_t K, int64_t bt, int64_t j0, int64_t j1, const float* a,
                                            int64_t lda, const float* w_packed, float* pre, int64_t ldp,
                                            AccStart start, const float* bias) {
  const int64_t pair_stride = K * 2 * kTile;
  for (int64_t j = j0; j < j1; j += kTile) {
    const __mmask16 mask = lanes(j1 - j);
    const float* w_tile = w_packed + (j / kTile) * K * 4 * kTile;
    const float* bias_j = bias ? bias + j : nullptr;
    const int64_t rest = K == 0 ? 0 : for_pair_row_blocks(bt, [&](auto rows, int64_t b) SEQKERNELS_AVX512 {
      for (int gp = 0; gp < 2; ++gp) {
        tile_rows_pair<decltype(rows)::value>(H, mask, gp, K, a + b * lda, lda, w_tile + gp * pair_stride,
                                              pre + b * ldp + j, ldp, start, bias_j);
      }
    });
    if (rest == bt) continue;
    // K = 0 still runs one empty chunk, so that the start values reach pre.
    const int64_t chunk_k = forward_chunk_k();
    for (int64_t k0 = 0; k0 < std::max<int64_t>(K, 1); k0 += chunk_k) {
      const int64_t k1 = std::min(K, k0 + chunk_k);
      const AccStart chunk_start = k0 == 0 ? start : AccStart::kPre;
      for_row_blocks(bt - rest, [&](auto rows, int64_t b) SEQKERNELS_AVX512 {
        tile_rows<decltype(rows)::value>(H, mask, k0, k1, a + (rest + b) * lda, lda, w_tile, pair_stride,
                                         pre + (rest + b) * ldp + j, ldp, chunk_start, bias_j);
      });
    }
  }
}

// FastFloatMath (vec_math.h) on 16 lanes, with its constants (fast_math), so that
// lstm_cell_forward runs on whole registers instead of the auto-vectorised AVX2 loop (the
// gate pass was ~20 cycles per unit).
struct Avx512Math {
  SEQKERNELS_AVX512 static inline __m512 exp(__m512 x) {
    using namespace fast_math;
    // x second, so that NaN stays NaN (Avx2Math::exp).
    x = _mm512_min_ps(_mm512_set1_ps(kExpMax), _mm512_max_ps(_mm512_set1_ps(kExpMin), x));
    const __m512 shifter = _mm512_set1_ps(kShifter);
    const __m512 shifted = _mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), shifter);
    const __m512 n = _mm512_sub_ps(shifted, shifter);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
    __m512 p = _mm512_set1_ps(kExpPoly[0]);
    for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    const __m512i scale_bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_set1_epi32(kShifterBits)),
                         _mm512_set1_epi32(127)),
        23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(scale_bits));
  }
  SEQKERNELS_AVX512 static inline __m512 sigmoid(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
  }
  SEQKERNELS_AVX512 static inline __m512 tanh(__m512 x) {
    using namespace fast_math;
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 ax = _mm512_abs_ps(x);
    const __m512 e = exp(_mm512_mul_ps(_mm512_set1_ps(-2.0f), ax));
    const __m512 big = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    const __m512 x2 = _mm512_mul_ps(x, x);
    __m512 series = _mm512_fmadd_ps(x2, _mm512_set1_ps(kTanhSeries[2]), _mm512_set1_ps(kTanhSeries[1]));
    series = _mm512_fmadd_ps(x2, series, _mm512_set1_ps(kTanhSeries[0]));
    series = _mm512_mul_ps(ax, _mm512_fmadd_ps(x2, series, one));
    const __mmask16 small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(kTanhSeriesBelow), _CMP_LT_OQ);
    const __m512 mag = _mm512_mask_blend_ps(small, big, series);
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(mag), sign));
  }
};

// forward_gate_rows (lstm.cpp) on 16 units at a time, for float32: batch rows [0, bt),
// hidden units [j0, j1). Same layouts: pre [bt, G] row stride ldp; cbuf [B, H]; m_out [bt, H];
// gates [bt, G] / cells [bt, H] when training; h_copy [bt, H] (row stride H) gets m_out again.
// gates may be pre itself (forward_gate_rows): a unit's loads come before its stores.
template <bool kTraining>
SEQKERNELS_AVX512 __attribute__((flatten)) inline void gate_rows(int64_t bt, int64_t j0, int64_t j1, int64_t H, const float* pre, int64_t ldp,
                                        float* cbuf, float* m_out, float* gates, float* cells, float* h_copy) {
  const int64_t G = 4 * H;
  for (int64_t b = 0; b < bt; ++b) {
    const float* p = pre + b * ldp;
    for (int64_t j = j0; j < j1; j += kTile) {
      const __mmask16 mask = lanes(j1 - j);
      const LstmGates<__m512> pre_j{_mm512_maskz_loadu_ps(mask, p + j), _mm512_maskz_loadu_ps(mask, p + H + j),
                                    _mm512_maskz_loadu_ps(mask, p + 2 * H + j),
                                    _mm512_maskz_loadu_ps(mask, p + 3 * H + j)};
      LstmGates<__m512> act;
      __m512 c_new, m_new;
      lstm_cell_forward<Avx512Math>(pre_j, _mm512_maskz_loadu_ps(mask, cbuf + b * H + j), act, c_new, m_new);
      _mm512_mask_storeu_ps(cbuf + b * H + j, mask, c_new);
      _mm512_mask_storeu_ps(m_out + b * H + j, mask, m_new);
      _mm512_mask_storeu_ps(h_copy + b * H + j, mask, m_new);
      if constexpr (kTraining) {
        float* gs = gates + b * G + j;
        _mm512_mask_storeu_ps(gs, mask, act.i);
        _mm512_mask_storeu_ps(gs + H, mask, act.f);
        _mm512_mask_storeu_ps(gs + 2 * H, mask, act.g);
        _mm512_mask_storeu_ps(gs + 3 * H, mask, act.o);
        _mm512_mask_storeu_ps(cells + b * H + j, mask, c_new);
      }
    }
  }
}

// backward_gate_rows (lstm.cpp, no projection) on 16 units at a time, for float32: batch rows
// [0, bt), hidden units [j0, j1), with dL/dh_t = dh + grad_y summed in registers (no pass of
// its own). Same layouts: gates [bt, G]; cells [bt, H]; prev_cells / c0 [.., H] (rows b <
// n_prev from prev_cells); dh, grad_y [bt, H]; dcbuf [B, H] dL/dc_t in, dL/dc_{t-1} out;
// dpre [bt, G].
SEQKERNELS_AVX512 __attribute__((flatten)) inline void backward_gate_rows(int64_t bt, int64_t j0, int64_t j1, int64_t H, const float* gates,
                                                 const float* cells, const float* prev_cells, int64_t n_prev,
                                                 const float* c0, const float* dh, const float* grad_y, float* dcbuf,
                                                 float* dpre) {
  const int64_t G = 4 * H;
  for (int64_t b = 0; b < bt; ++b) {
    const float* a = gates + b * G;
    const float* cp = b < n_prev ? prev_cells + b * H : c0 + b * H;
    float* dp = dpre + b * G;
    for (int64_t j = j0; j < j1; j += kTile) {
      const __mmask16 mask = lanes(j1 - j);
      const LstmGates<__m512> act{_mm512_maskz_loadu_ps(mask, a + j), _mm512_maskz_loadu_ps(mask, a + H + j),
                                  _mm512_maskz_loadu_ps(mask, a + 2 * H + j),
                                  _mm512_maskz_loadu_ps(mask, a + 3 * H + j)};
      const __m512 dm = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, dh + b * H + j),
                                      _mm512_maskz_loadu_ps(mask, grad_y + b * H + j));
      LstmGates<__m512> d;
      __m512 dc_prev, m;
      lstm_cell_backward<Avx512Math>(act, _mm512_maskz_loadu_ps(mask, cells + b * H + j),
                                     _mm512_maskz_loadu_ps(mask, cp + j), dm,
                                     _mm512_maskz_loadu_ps(mask, dcbuf + b * H + j), d, dc_prev, m);
      _mm512_mask_storeu_ps(dcbuf + b * H + j, mask, dc_prev);
      _mm512_mask_storeu_ps(dp + j, mask, d.i);
      _mm512_mask_storeu_ps(dp + H + j, mask, d.f);
      _mm512_mask_storeu_ps(dp + 2 * H + j, mask, d.g);
      _mm512_mask_storeu_ps(dp + 3 * H + j, mask, d.o);
    }
  }
}

constexpr int64_t kGradBlock = 4 * kTile;  // units per packed column block of W_hh

// dh[r, k0 .. k0 + 64) (+)= dpre[r, g0:g1]·W_hh[g0:g1, k0 .. k0 + 64) for R rows: the first
// chunk of gate rows writes, later ones add (a fixed order: deterministic). mask[v] keeps
// the units of vector v that exist.
//   dpre: [R, G] row stride G; w_block: packed [2 halves, G, 32] of the block at k0 (pack_w_hh_columns
//   with halves); dh: [R, H] row stride H
template <int R>
SEQKERNELS_AVX512 inline void grad_rows(int64_t H, int64_t k0, const __mmask16 (&mask)[4], int64_t g0, int64_t g1,
                                        const float* dpre, const float* w_block, float* dh) {
  const int64_t G = 4 * H;
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v)
      acc[r][v] = g0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[v], dh + r * H + k0 + 16 * v);
  const float* w_half1 = w_block + G * kGradBlock / 2;
  for (int64_t g = g0; g < g1; ++g) {
    const float* w = w_block + g * kGradBlock / 2;
    const float* u = w_half1 + g * kGradBlock / 2;
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(u),
                 w3 = _mm512_loadu_ps(u + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_set1_ps(dpre[r * G + g]);
      acc[r][0] = _mm512_fmadd_ps(d, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(d, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(d, w2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(d, w3, acc[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm512_mask_storeu_ps(dh + r * H + k0 + 16 * v, mask[v], acc[r][v]);
}

// grad_rows for R = 5..8 rows, half `hf` of the block (its units 32 hf .. 32 hf + 32), over all
// G gate rows at once: the forward's tile_rows_pair for the backward (same reasons, same
// prefetch). One part's product alone on the 2-core Xeon, grad_rows in row blocks of 4 / this:
// B = 8, H = 512 75.2 / 52.9 us; B = 6, H = 512 65.5 / 51.4; B = 8, H = 256 12.9 / 11.1;
// B = 16, H = 256 (two blocks of 8) 26.5 / 24.1 (with 4 KB of prefetch).
//   w_half: that half's rows [G, 32]; other arguments as grad_rows
template <int R>
SEQKERNELS_AVX512 inline void grad_rows_half(int64_t H, int64_t k0, const __mmask16 (&mask)[4], int hf,
                                             const float* dpre, const float* w_half, float* dh) {
  const int64_t G = 4 * H;
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  static_assert(kGradBlock / 2 == 2 * kTile, "a half's rows are two vectors");
  rows_times_two_vectors<R>(G, dpre, G, w_half, acc);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2; ++v)
      _mm512_mask_storeu_ps(dh + r * H + k0 + 32 * hf + 16 * v, mask[2 * hf + v], acc[r][v]);
}

// dh[:bt, k] = dpre[:bt, :]·W_hh[:, k] for the units k in [k0, k1) (k0 a multiple of 64), in
// blocks of 64 units: rows in blocks of 5-8 on grad_rows_half over all gate rows, the 1-4 rows
// left (all of them below B = 5) on grad_rows in chunks of kChunkG gate rows (each chunk stays
// in L1 over those rows' blocks).
//   w_packed: pack_w_hh_columns layout with halves
SEQKERNELS_AVX512 inline void recurrent_grad_units(int64_t bt, int64_t H, int64_t k0, int64_t k1, const float* dpre,
                                                   const float* w_packed, float* dh) {
  const int64_t G = 4 * H;
  for (int64_t kb = k0; kb < k1; kb += kGradBlock) {
    __mmask16 mask[4];
    for (int v = 0; v < 4; ++v) mask[v] = lanes(std::max<int64_t>(0, k1 - kb - 16 * v));
    const float* w_block = w_packed + (kb / kGradBlock) * G * kGradBlock;
    const int64_t rest = for_pair_row_blocks(bt, [&](auto rows, int64_t b) SEQKERNELS_AVX512 {
      for (int hf = 0; hf < 2; ++hf) {
        grad_rows_half<decltype(rows)::value>(H, kb, mask, hf, dpre + b * G, w_block + hf * G * kGradBlock / 2,
                                              dh + b * H);
      }
    });
    if (rest == bt) continue;
    for (int64_t g0 = 0; g0 < G; g0 += kChunkG) {
      const int64_t g1 = std::min(G, g0 + kChunkG);
      for_row_blocks(bt - rest, [&](auto rows, int64_t b) SEQKERNELS_AVX512 {
        grad_rows<decltype(rows)::value>(H, kb, mask, g0, g1, dpre + (rest + b) * G, w_block, dh + (rest + b) * H);
      });
    }
  }
}

}  // namespace avx512
#pragma GCC diagnostic pop
#undef SEQKERNELS_AVX512
#endif  // x86-64

// A part's product of a step, pre[:bt, its gate columns] = start + a·Wᵀ (start: AccStart,
// from pre itself, bias [G] or zero), with the kernels `kernels` (w_packed:
// pack_gate_weights with unit_tile(kernels)).
//   a: [bt, K] row stride lda; pre: [bt, G] row stride ldp
inline void part_product(CpuKernels kernels, int64_t H, int64_t K, int64_t bt, int64_t j0, int64_t j1, const float* a,
                         int64_t lda, const float* w_packed, float* pre, int64_t ldp, AccStart start = AccStart::kPre,
                         const float* bias = nullptr) {
  if (start == AccStart::kBias && bias == nullptr) start = AccStart::kZero;
#if defined(__x86_64__) || defined(_M_X64)
  if (kernels == CpuKernels::kAvx512)
    return avx512::units_product(H, K, bt, j0, j1, a, lda, w_packed, pre, ldp, start, bias);
#endif
  units_product_avx2(H, K, bt, j0, j1, a, lda, w_packed, pre, ldp, start, bias);
}

// The backward's parts own whole blocks of this many units (k0 of part_recurrent_grad).
inline int64_t backward_unit_tile(CpuKernels kernels) {
#if defined(__x86_64__) || defined(_M_X64)
  if (kernels == CpuKernels::kAvx512) return avx512::kGradBlock;
#endif
  return kGradBlockAvx2;
}

// W_hh in the layout part_recurrent_grad reads with `kernels`: packed by pack_w_hh_columns,
// in column blocks of kGradBlockAvx2 or avx512::kGradBlock units, into a tensor: PyTorch's
// CPU allocator aligns it to 64 bytes. (A large std::vector sits 16 bytes past a page
// boundary, so every other 32-byte load, and every 64-byte one, would span two cache lines.)
inline at::Tensor recurrent_grad_weights(CpuKernels kernels, const float* w_hh, int64_t H) {
  int64_t block = kGradBlockAvx2;
#if defined(__x86_64__) || defined(_M_X64)
  if (kernels == CpuKernels::kAvx512) block = avx512::kGradBlock;
#endif
  at::Tensor packed = at::empty({packed_w_hh_columns_numel(H, block)}, at::kFloat);
  pack_w_hh_columns(w_hh, H, block, /*halves=*/kernels == CpuKernels::kAvx512, packed.data_ptr<float>());
  return packed;
}

// A part's share of dL/dh_{t-1} = dpre_t·W_hh (its units k in [k0, k1), k0 a multiple of
// backward_unit_tile). w: recurrent_grad_weights(kernels, W_hh).
inline void part_recurrent_grad(CpuKernels kernels, int64_t bt, int64_t H, int64_t k0, int64_t k1, const float* dpre,
                                const float* w, float* dh) {
#if defined(__x86_64__) || defined(_M_X64)
  if (kernels == CpuKernels::kAvx512) return avx512::recurrent_grad_units(bt, H, k0, k1, dpre, w, dh);
#endif
  recurrent_grad_units_avx2(bt, H, k0, k1, dpre, w, dh);
}

// ---------------------------------------------------------------------------------------
// float32 products on AMX tiles (amx_x3.h: six bfloat16 partial products, float32's error
// class). Where they run (amx_products, amx_sequence_products), the forward's input projection is one AMX product
// before the loop and each step's recurrent product another, both over W packed once per call,
// and the backward's dh = dG·W_hh per step and dx = dG·W_ih after the loop; the gate passes stay
// the AVX-512 ones (every AMX CPU has AVX-512), the weight gradients MKL's.

// Where `auto` runs products on AMX, on a CPU that has it: from kAmxMinHidden hidden units, the
// step products from kAmxMinBatch rows, the whole-sequence ones from kAmxMinSequenceRows.
// Measured (docs/benchmarks.md, speed-up against nn.LSTM, AVX-512 -> AMX): the 2-core Xeon of
// development, H = 512, B = 16 / 32 / 64 `infer` 0.93 / 0.89 / 0.96x -> 1.40 / 1.24 / 1.22x;
// H = 384, B = 16 / 64 0.94 / 1.00x -> 1.47 / 1.22x (alternating calls); at B = 8 AMX lost,
// a tile product of 8 rows taking ~60 % of one of 16 (H = 512 1.20x -> 1.05x). At H = 256 the
// AVX-512 loop's weights fit each core's L2: the two were even there, and on the GPU machine's
// Xeon (2 of its 16 threads) AMX lost (B = 16 / 64 `infer` 1.07 / 1.10x -> 0.85 / 0.81x). That
// Xeon was mixed at H = 384 and 512 too (docs/kernels.md): this rule is the development
// machine's.
constexpr int64_t kAmxMinHidden = 384;
constexpr int64_t kAmxMinBatch = 16;
// The whole-sequence products of N = T·B rows (the input projection where it is not fused into
// the loop, dx): the AMX product's gain must pay for packing W in its layout (~1.5 ms at
// H = 512 on the 2-core Xeon, against ~0.5 ms for the AVX-512 layout; at B = 1, N = 256 the call
// was slower: H = 512 `infer` 14.6 against 13.2 ms).
constexpr int64_t kAmxMinSequenceRows = 1024;

// SEQKERNELS_CPU_AMX (diagnostic): unset, the rule above; "0" never; anything else wherever the
// CPU has AMX (the tests reach every row count with it). -1: unset, 0 / 1: forced.
inline int amx_mode() {
  if (!amx::hardware_available()) return 0;
  const char* env = std::getenv("SEQKERNELS_CPU_AMX");
  if (env == nullptr || env[0] == '\0') return -1;
  return std::strcmp(env, "0") != 0 ? 1 : 0;
}
// The step products of a loop with B rows and H units.
inline bool amx_products(int64_t B, int64_t H) {
  const int mode = amx_mode();
  return mode == -1 ? B >= kAmxMinBatch && H >= kAmxMinHidden : mode == 1;
}
// The whole-sequence products of N rows for H units.
inline bool amx_sequence_products(int64_t N, int64_t H) {
  const int mode = amx_mode();
  return mode == -1 ? N >= kAmxMinSequenceRows && H >= kAmxMinHidden : mode == 1;
}
// Which of a persistent loop's products run on AMX (the forward's and the backward's alike; AMX
// implies the AVX-512 kernels, whose gate passes it keeps): the whole-sequence ones (input
// projection, dx) and, with them, the step ones.
struct AmxUse {
  bool sequence, steps;
};
inline AmxUse amx_use(CpuKernels kernels, int64_t N, int64_t B, int64_t H) {
  const bool sequence = kernels == CpuKernels::kAvx512 && amx_sequence_products(N, H);
  return {sequence, sequence && amx_products(B, H)};
}

#if defined(SEQKERNELS_HAVE_AMX)
// W [G, K] (W_ih with K = I, W_hh with K = H) packed for AMX: group u = units [16 u, 16 u + 16),
// tile g = gate g; units past H zero. In a tensor of bfloat16 storage.
inline at::Tensor amx_pack_gate_weights(const float* w, int64_t H, int64_t K) {
  const int64_t groups = (H + amx::kTileCols - 1) / amx::kTileCols;
  at::Tensor packed = at::empty({amx::packed_numel(groups, K)}, at::kBFloat16);
  amx::pack_rows_major(w, K, K, groups,
                       [H](int64_t u, int64_t g, int64_t n) {
                         const int64_t j = u * amx::kTileCols + n;
                         return j < H ? g * H + j : int64_t{-1};
                       },
                       reinterpret_cast<uint16_t*>(packed.data_ptr()));
  return packed;
}

// One row block of one packed group on AMX: out tile t = (in ? in tile t : 0) + A·B_t for the
// m rows of the configured tiles, tile t at column t * tile_stride of out / in; the first valid[t]
// columns of tile t exist. Whole tiles load and store out / in directly (no epilogue); a group
// with a partial tile goes through a local block, so that it writes no column past valid[t].
//   a: A parts at the block's row 0 (part stride a_part, row stride a_ld, Kp columns); out, in:
//   row strides ldo / in_ld floats (in_ld = 0: one row for every row, e.g. a bias)
SEQKERNELS_AMX_TARGET inline void amx_block(const uint16_t* a, int64_t a_part, int64_t a_ld, int64_t Kp,
                                            const uint16_t* group, int64_t m, float* out, int64_t ldo,
                                            int64_t tile_stride, const int64_t (&valid)[4], const float* in,
                                            int64_t in_ld) {
  if (valid[0] == 16 && valid[1] == 16 && valid[2] == 16 && valid[3] == 16) {
    amx::group_product(a, a_part, a_ld, Kp, group, {in, in_ld, out, ldo, tile_stride});
    return;
  }
  alignas(64) float partial[amx::kGroupTiles][16][16];  // [tile][row][column]
  amx::group_product(a, a_part, a_ld, Kp, group, {nullptr, 0, &partial[0][0][0], 16, 256});
  for (int64_t t = 0; t < 4; ++t) {
    const __mmask16 mask = amx::lanes16(valid[t]);
    for (int64_t r = 0; r < m; ++r) {
      float* dst = out + r * ldo + t * tile_stride;
      const __m512 base = in ? _mm512_maskz_loadu_ps(mask, in + r * in_ld + t * tile_stride) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(dst, mask, _mm512_add_ps(base, _mm512_load_ps(partial[t][r])));
    }
  }
}

// W [K, N] (row stride ldw) packed for amx_columns_product, in a tensor of bfloat16 storage.
inline at::Tensor amx_pack_columns(const float* w, int64_t ldw, int64_t K, int64_t N) {
  const int64_t group_cols = amx::kGroupTiles * amx::kTileCols;
  at::Tensor packed = at::empty({amx::packed_numel((N + group_cols - 1) / group_cols, K)}, at::kBFloat16);
  amx::pack_cols_major(w, ldw, K, N, reinterpret_cast<uint16_t*>(packed.data_ptr()));
  return packed;
}

// pre[r, g*H + j] = (bias ? bias[g*H + j] : pre[r, g*H + j]) + Σ_k a[r, k]·W[g*H + j, k] for
// rows [0, bt) and the units j in [j0, j1) (j0 a multiple of 16), rows in blocks of 16.
//   a: A parts [3][.][a_row_stride(K)] (part stride a_part) at row 0; w_packed:
//   amx_pack_gate_weights(W, H, K); pre: [bt, G] row stride ldp
SEQKERNELS_AMX_TARGET inline void amx_units_product(int64_t H, int64_t K, const uint16_t* a, int64_t a_part,
                                                    int64_t bt, int64_t j0, int64_t j1, const uint16_t* w_packed,
                                                    float* pre, int64_t ldp, const float* bias) {
  const int64_t Kp = amx::padded_k(K), a_ld = amx::a_row_stride(K), group_numel = amx::packed_numel(1, K);
  amx::TileRows tiles;
  for (int64_t j = j0; j < j1; j += amx::kTileCols) {
    const int64_t nj = std::min(amx::kTileCols, j1 - j);
    const int64_t valid[4] = {nj, nj, nj, nj};
    const uint16_t* group = w_packed + (j / amx::kTileCols) * group_numel;
    for (int64_t b = 0; b < bt; b += amx::kTileRows) {
      const int64_t m = std::min(amx::kTileRows, bt - b);
      tiles.use(m);
      float* rows = pre + b * ldp + j;
      amx_block(a + b * a_ld, a_part, a_ld, Kp, group, m, rows, ldp, H, valid, bias ? bias + j : rows, bias ? 0 : ldp);
    }
  }
}

// c[r, n] = Σ_k a[r, k]·W[k, n] for rows [0, rows) and the columns n in [n0, n1) (n0 a multiple
// of 64) of a W packed by amx::pack_cols_major (groups of 64 columns), rows in blocks of 16: the
// backward's dh = dG·W_hh (K = G, N = H) and dx = dG·W_ih (N = I).
//   a: A parts [3][.][a_row_stride(K)] (part stride a_part) at row 0; c: [rows, N] row stride ldc
SEQKERNELS_AMX_TARGET inline void amx_columns_product(int64_t K, int64_t N, const uint16_t* a, int64_t a_part,
                                                      int64_t rows, int64_t n0, int64_t n1,
                                                      const uint16_t* w_packed, float* c, int64_t ldc) {
  const int64_t Kp = amx::padded_k(K), a_ld = amx::a_row_stride(K), cols = amx::kGroupTiles * amx::kTileCols;
  const int64_t group_numel = amx::packed_numel(1, K);
  amx::TileRows tiles;
  for (int64_t n = n0; n < n1; n += cols) {
    int64_t valid[4];
    for (int64_t t = 0; t < 4; ++t) valid[t] = std::clamp<int64_t>(n1 - n - 16 * t, 0, 16);
    const uint16_t* group = w_packed + (n / cols) * group_numel;
    for (int64_t b = 0; b < rows; b += amx::kTileRows) {
      const int64_t m = std::min(amx::kTileRows, rows - b);
      tiles.use(m);
      amx_block(a + b * a_ld, a_part, a_ld, Kp, group, m, c + b * ldc + n, ldc, amx::kTileCols, valid, nullptr, 0);
    }
  }
}

// Rows of a float32 matrix split per thread at a time in the whole-sequence AMX products: the
// panel's three parts (panel x Kp x 6 bytes, 768 KB at K = 512) and a group of W stay in L2
// while every row block of the panel passes over the group.
constexpr int64_t kAmxPanelRows = 256;

// For panels of kAmxPanelRows of M rows, in parallel: fill(buffer, r0, rows) writes the panel's
// A operand into a per-thread buffer of `numel` bfloat16 (a tensor: 64-byte aligned, amx_x3.h;
// zero where fill writes nothing), then panel_fn(buffer, r0, rows) runs its products.
template <class FillFn, class PanelFn>
SEQKERNELS_AMX_TARGET void amx_for_row_panels(int64_t M, int64_t numel, const FillFn& fill, const PanelFn& panel_fn) {
  const int64_t panels = (M + kAmxPanelRows - 1) / kAmxPanelRows;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) SEQKERNELS_AMX_TARGET {
    at::Tensor buffer = at::zeros({numel}, at::kBFloat16);
    uint16_t* a = reinterpret_cast<uint16_t*>(buffer.data_ptr());
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t r0 = p * kAmxPanelRows, rows = std::min(kAmxPanelRows, M - r0);
      fill(a, r0, rows);
      panel_fn(a, r0, rows);
    }
  });
}

// Calls panel_fn(parts, a_part, r0, rows) for panels of kAmxPanelRows rows of a ([M, K], row
// stride lda), in parallel, each panel split into a per-thread buffer first.
template <class PanelFn>
SEQKERNELS_AMX_TARGET void amx_for_panels(const float* a, int64_t lda, int64_t M, int64_t K, const PanelFn& panel_fn) {
  const int64_t ld = amx::a_row_stride(K);
  amx_for_row_panels(
      M, amx::kSplitParts * kAmxPanelRows * ld,
      [&](uint16_t* parts, int64_t r0, int64_t rows) { amx::split_rows(a + r0 * lda, lda, rows, K, parts); },
      [&](uint16_t* parts, int64_t r0, int64_t rows) { panel_fn(parts, rows * ld, r0, rows); });
}

// pre [N, G] = bias + x·W_ihᵀ for all N rows on AMX.
//   x: [N, I]; w_packed: amx_pack_gate_weights(W_ih); bias: [G] or null
SEQKERNELS_AMX_TARGET inline void amx_input_projection(const float* x, int64_t N, int64_t I, int64_t H,
                                                       const uint16_t* w_packed, const float* bias, float* pre) {
  const int64_t G = 4 * H;
  std::vector<float> zero_bias(bias ? 0 : G, 0.f);
  const float* start = bias ? bias : zero_bias.data();
  amx_for_panels(x, I, N, I, [&](const uint16_t* parts, int64_t a_part, int64_t r0, int64_t rows) {
    amx_units_product(H, I, parts, a_part, rows, 0, H, w_packed, pre + r0 * G, G, start);
  });
}

// dx [N, I] = dG·W_ih for all N rows on AMX.
//   dpre: [N, G]; w_packed: amx::pack_cols_major(W_ih, I, G, I)
SEQKERNELS_AMX_TARGET inline void amx_input_grad(const float* dpre, int64_t N, int64_t G, int64_t I,
                                                 const uint16_t* w_packed, float* dx) {
  amx_for_panels(dpre, G, N, G, [&](const uint16_t* parts, int64_t a_part, int64_t r0, int64_t rows) {
    amx_columns_product(G, I, parts, a_part, rows, 0, I, w_packed, dx + r0 * I, I);
  });
}

// ---------------------------------------------------------------------------------------
// bfloat16 on AMX: the persistent loop of a bfloat16 LSTM (no projection, H a multiple of 16)
// runs its products as one bfloat16 tile product per chunk (amx_x3.h, group_product_bf16) on
// the operands as they are: h_{t-1}·W_hhᵀ in the loop, the input projection before it or, where
// fuse_projection says so, in the same product (lstm.cpp, forward_persistent_bf16). The
// arithmetic is the BLAS loop's (bfloat16 products, float32 sums, gate math in float32, c
// kept in float32, h rounded to bfloat16 for y and for the next step); only the order of the
// sums differs. Where it applies: amx_bf16_loop_applies (lstm.cpp).
// (LstmGates<__m512> drops __m512's alignment attribute, as in the AVX-512 kernels above.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"

// W [G, K] bfloat16 (W_ih with K = I, W_hh with K = H) packed for group_product_bf16: group u =
// units [16 u, 16 u + 16), tile g = gate g.
inline at::Tensor amx_pack_gate_weights_bf16(const c10::BFloat16* w, int64_t H, int64_t K) {
  const int64_t groups = (H + amx::kTileCols - 1) / amx::kTileCols;
  at::Tensor packed = at::empty({amx::packed_numel_bf16(groups, K)}, at::kBFloat16);
  amx::pack_rows_major_bf16(reinterpret_cast<const uint16_t*>(w), K, K, groups,
                            [H](int64_t u, int64_t g, int64_t n) {
                              const int64_t j = u * amx::kTileCols + n;
                              return j < H ? g * H + j : int64_t{-1};
                            },
                            reinterpret_cast<uint16_t*>(packed.data_ptr()));
  return packed;
}

// out[r, n + t * tile_stride] = start[...] + Σ_k a[r, k]·W[k, column (n, t)] for rows [0, rows)
// and the packed groups that hold columns [n0, n1) (group n / group_cols; n0, n1 multiples of
// group_cols), rows in blocks of 16: each group's four accumulator tiles start from `start`
// (row stride start_ld; 0: one row for every row, a bias; null: zero) at the same offsets as
// out. The forward's units (group_cols 16, the tiles a unit group's four gates, tile_stride H)
// and the backward's dh = dG·W_hh (group_cols 64, four tiles of 16 units, tile_stride 16).
//   a: A layout ([.][a_row_stride(K)] bfloat16) at row 0; w_packed: groups of
//   amx::packed_numel_bf16(1, K); out: row stride ldo
inline void amx_bf16_groups_product(int64_t K, const uint16_t* a, int64_t rows, int64_t n0, int64_t n1,
                                    int64_t group_cols, int64_t tile_stride, const uint16_t* w_packed,
                                    const float* start, int64_t start_ld, float* out, int64_t ldo) {
  const int64_t Kp = amx::padded_k(K), a_ld = amx::a_row_stride(K), group_numel = amx::packed_numel_bf16(1, K);
  amx::TileRows tiles(/*b_tiles=*/2);
  for (int64_t n = n0; n < n1; n += group_cols) {
    const uint16_t* group = w_packed + (n / group_cols) * group_numel;
    for (int64_t b = 0; b < rows; b += amx::kTileRows) {
      tiles.use(std::min(amx::kTileRows, rows - b));
      amx::group_product_bf16(a + b * a_ld, a_ld, Kp, group,
                              {start ? start + b * start_ld + n : nullptr, start_ld, out + b * ldo + n, ldo,
                               tile_stride});
    }
  }
}

// pre[r, g*H + j] = start + a[r, :]·W[g*H + j, :]ᵀ for rows [0, bt) and the units j in [j0, j1)
// (j0, j1 multiples of 16), W packed by amx_pack_gate_weights_bf16(W, H, K); pre: [bt, G] row
// stride ldp; start as amx_bf16_groups_product's.
inline void amx_bf16_units_product(int64_t H, int64_t K, const uint16_t* a, int64_t bt, int64_t j0, int64_t j1,
                                   const uint16_t* w_packed, const float* start, int64_t start_ld, float* pre,
                                   int64_t ldp) {
  amx_bf16_groups_product(K, a, bt, j0, j1, amx::kTileCols, H, w_packed, start, start_ld, pre, ldp);
}

// pre [N, G] = bias + x·W_ihᵀ for all N rows on AMX, x in panels of kAmxPanelRows rows copied
// into A layout per thread.
//   x: [N, I] bfloat16; w_packed: amx_pack_gate_weights_bf16(W_ih, H, I); bias: [G] (zeros for a
//   layer without one)
inline void amx_bf16_input_projection(const c10::BFloat16* x, int64_t N, int64_t I, int64_t H,
                                      const uint16_t* w_packed, const float* bias, float* pre) {
  const int64_t G = 4 * H, ld = amx::a_row_stride(I);
  const uint16_t* x16 = reinterpret_cast<const uint16_t*>(x);
  amx_for_row_panels(
      N, kAmxPanelRows * ld,  // the padding past I stays zero
      [&](uint16_t* a, int64_t r0, int64_t rows) { amx::copy_rows_bf16(x16 + r0 * I, I, rows, I, a, ld); },
      [&](uint16_t* a, int64_t r0, int64_t rows) {
        amx_bf16_units_product(H, I, a, rows, 0, H, w_packed, bias, 0, pre + r0 * G, G);
      });
}

// forward_gate_rows (lstm.cpp) for bfloat16 on 16 units at a time: batch rows [0, bt), hidden
// units [j0, j1) (multiples of 16). pre [bt, G] row stride ldp and cbuf [B, H] in float32; m_out
// [bt, H], gates [bt, G] / cells [bt, H] when training, in bfloat16 (rounded to nearest even, as
// static_cast<c10::BFloat16>); h_next ([bt][ld_next], A layout) gets m_out again.
template <bool kTraining>
SEQKERNELS_AMX_TARGET __attribute__((flatten)) inline void gate_rows_bf16(int64_t bt, int64_t j0, int64_t j1, int64_t H,
                                                                          const float* pre, int64_t ldp, float* cbuf,
                                                                          uint16_t* m_out, uint16_t* gates,
                                                                          uint16_t* cells, uint16_t* h_next,
                                                                          int64_t ld_next) {
  const int64_t G = 4 * H;
  for (int64_t b = 0; b < bt; ++b) {
    const float* p = pre + b * ldp;
    for (int64_t j = j0; j < j1; j += avx512::kTile) {
      const LstmGates<__m512> pre_j{_mm512_loadu_ps(p + j), _mm512_loadu_ps(p + H + j),
                                    _mm512_loadu_ps(p + 2 * H + j), _mm512_loadu_ps(p + 3 * H + j)};
      LstmGates<__m512> act;
      __m512 c_new, m_new;
      lstm_cell_forward<avx512::Avx512Math>(pre_j, _mm512_loadu_ps(cbuf + b * H + j), act, c_new, m_new);
      _mm512_storeu_ps(cbuf + b * H + j, c_new);
      amx::store_bf16(m_out + b * H + j, m_new);
      amx::store_bf16(h_next + b * ld_next + j, m_new);
      if constexpr (kTraining) {
        uint16_t* gs = gates + b * G + j;
        amx::store_bf16(gs, act.i);
        amx::store_bf16(gs + H, act.f);
        amx::store_bf16(gs + 2 * H, act.g);
        amx::store_bf16(gs + 3 * H, act.o);
        amx::store_bf16(cells + b * H + j, c_new);
      }
    }
  }
}

// c[r, n] = Σ_k a[r, k]·W[k, n] for rows [0, rows) and the columns n in [n0, n1) (multiples of
// 64) of a W packed by amx::pack_cols_major_bf16: the bfloat16 backward's dh = dG·W_hh (K = G,
// N = H). a: A layout at row 0; c: [rows, N] row stride ldc.
inline void amx_bf16_columns_product(int64_t K, const uint16_t* a, int64_t rows, int64_t n0, int64_t n1,
                                     const uint16_t* w_packed, float* c, int64_t ldc) {
  amx_bf16_groups_product(K, a, rows, n0, n1, amx::kGroupTiles * amx::kTileCols, amx::kTileCols, w_packed, nullptr,
                          0, c, ldc);
}

// backward_gate_rows (lstm.cpp, no projection) for bfloat16 on 16 units at a time: batch rows
// [0, bt), hidden units [j0, j1) (multiples of 16), dL/dh_t = dh + grad_y summed in registers.
// gates [bt, G], cells [bt, H], prev_cells / c0 [.., H] (rows b < n_prev from prev_cells) and
// grad_y [bt, H] in bfloat16; dh [bt, H] and dcbuf [B, H] (dL/dc_t in, dL/dc_{t-1} out) in
// float32; dpre [bt, G] bfloat16 out, and again into d_next ([bt][ld_next], A layout).
SEQKERNELS_AMX_TARGET __attribute__((flatten)) inline void backward_gate_rows_bf16(
    int64_t bt, int64_t j0, int64_t j1, int64_t H, const uint16_t* gates, const uint16_t* cells,
    const uint16_t* prev_cells, int64_t n_prev, const uint16_t* c0, const float* dh, const uint16_t* grad_y,
    float* dcbuf, uint16_t* dpre, uint16_t* d_next, int64_t ld_next) {
  const int64_t G = 4 * H;
  using amx::load_bf16;
  for (int64_t b = 0; b < bt; ++b) {
    const uint16_t* a = gates + b * G;
    const uint16_t* cp = b < n_prev ? prev_cells + b * H : c0 + b * H;
    for (int64_t j = j0; j < j1; j += avx512::kTile) {
      const LstmGates<__m512> act{load_bf16(a + j), load_bf16(a + H + j), load_bf16(a + 2 * H + j),
                                  load_bf16(a + 3 * H + j)};
      const __m512 dm = _mm512_add_ps(_mm512_loadu_ps(dh + b * H + j), load_bf16(grad_y + b * H + j));
      LstmGates<__m512> d;
      __m512 dc_prev, m;
      lstm_cell_backward<avx512::Avx512Math>(act, load_bf16(cells + b * H + j), load_bf16(cp + j), dm,
                                             _mm512_loadu_ps(dcbuf + b * H + j), d, dc_prev, m);
      _mm512_storeu_ps(dcbuf + b * H + j, dc_prev);
      const __m512 dg[4] = {d.i, d.f, d.g, d.o};
      for (int g = 0; g < 4; ++g) {
        amx::store_bf16(dpre + b * G + g * H + j, dg[g]);
        amx::store_bf16(d_next + b * ld_next + g * H + j, dg[g]);
      }
    }
  }
}
#pragma GCC diagnostic pop
#endif  // SEQKERNELS_HAVE_AMX

}  // namespace seqkernels::cpu
