// Persistent small-batch LSTM loops for the CPU (float32, no projection).
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

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

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

constexpr int64_t kUnitTile = 8;              // hidden units per packed tile (one register per gate)
constexpr int64_t kPersistentMaxBatch = 32;   // measured (2-core EPYC, H 256/512): faster than the BLAS loop up to B = 32, slower at 64
constexpr int64_t kChunkK = 128;              // k per L1-resident chunk of a W tile (16 KB)
constexpr int kSpinsBeforeSteal = 2048;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#endif
}

// Runs step_fn(part, s) for every part in [0, parts) and every s in [0, steps), all parts
// of step s before any of step s + 1. Threads start on their own part (cache affinity);
// a thread that finds a part of the current step unclaimed after spinning runs it itself,
// so the loop completes with any number of threads, including one (nested parallelism).
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

// Hidden units [j0, j1) owned by a part: whole tiles, split as evenly as possible.
struct UnitRange {
  int64_t j0, j1;
};
inline UnitRange part_units(int64_t part, int64_t parts, int64_t H) {
  const int64_t tiles = (H + kUnitTile - 1) / kUnitTile;
  const int64_t u0 = part * tiles / parts, u1 = (part + 1) * tiles / parts;
  return {std::min(H, u0 * kUnitTile), std::min(H, u1 * kUnitTile)};
}

// w_hh [G, H] -> packed [tiles, H(k), 4 gates, 8 units]: the forward kernel then streams
// one contiguous 128-byte row of four gate vectors per k. Units past H are zero.
inline void pack_w_hh(const float* w_hh, int64_t H, float* packed) {
  const int64_t tiles = (H + kUnitTile - 1) / kUnitTile;
  at::parallel_for(0, tiles, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      float* dst = packed + u * H * 4 * kUnitTile;
      for (int64_t k = 0; k < H; ++k) {
        for (int64_t g = 0; g < 4; ++g) {
          for (int64_t l = 0; l < kUnitTile; ++l) {
            const int64_t j = u * kUnitTile + l;
            dst[(k * 4 + g) * kUnitTile + l] = j < H ? w_hh[(g * H + j) * H + k] : 0.f;
          }
        }
      }
    }
  });
}

// pre[r, g*H + j0 .. +nj] += h[r, k0:k1]·W_hh[g*H + j0 .. +nj, k0:k1]ᵀ for R rows and one
// tile (callers split k into chunks so that a chunk of the tile stays in L1 while every
// row pair streams over it).
//   pre: [R, G] row stride G; h: [R, H] row stride H; w_tile: packed [H, 4, 8]
// An FMA has a latency of ~4 cycles and two issue per cycle, so a core needs >= 8
// independent accumulators: R rows × 4 gates × S interleaved k-streams (S = 2 for a
// single row) keeps both FMA pipes busy.
template <int R, int S>
inline void tile_recurrent(int64_t H, int64_t j0, int64_t nj, int64_t k0, int64_t k1, const float* h,
                           const float* w_tile, float* pre) {
  const int64_t G = 4 * H;
  const bool full = nj == kUnitTile;  // only the last tile of an H that is no multiple of 8 is partial
  v8f acc[S][R][4];
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < 4; ++g) {
      const float* src = pre + r * G + g * H + j0;
      if (full) {
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
        const v8f hk = splat8(h[r * H + k + st]);
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
      const v8f hk = splat8(h[r * H + k]);
      for (int g = 0; g < 4; ++g) acc[0][r][g] += hk * load8(w + 8 * g);
    }
  }
  for (int st = 1; st < S; ++st)
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < 4; ++g) acc[0][r][g] += acc[st][r][g];
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < 4; ++g) {
      float* dst = pre + r * G + g * H + j0;
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

// dh[r, k0 .. k0 + 8*KV) = dpre[r, :]·W_hh[:, k0 .. k0 + 8*KV) for R rows.
//   dpre: [R, G] row stride G; w_hh: [G, H]; dh: [R, H] row stride H
template <int R, int KV>
inline void block_recurrent_grad(int64_t H, int64_t k0, const float* dpre, const float* w_hh, float* dh) {
  const int64_t G = 4 * H;
  v8f acc[R][KV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < KV; ++v) acc[r][v] = v8f{};
  for (int64_t g = 0; g < G; ++g) {
    v8f w[KV];
    for (int v = 0; v < KV; ++v) w[v] = load8(w_hh + g * H + k0 + 8 * v);
    for (int r = 0; r < R; ++r) {
      const v8f d = splat8(dpre[r * G + g]);
      for (int v = 0; v < KV; ++v) acc[r][v] += d * w[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < KV; ++v) store8(dh + r * H + k0 + 8 * v, acc[r][v]);
}

// dh[:bt, k] = dpre[:bt, :]·W_hh[:, k] for the units k in [k0, k1).
inline void recurrent_grad_units(int64_t bt, int64_t H, int64_t k0, int64_t k1, const float* dpre,
                                 const float* w_hh, float* dh) {
  const int64_t G = 4 * H;
  int64_t b = 0;
  for (; b + 4 <= bt; b += 4) {
    int64_t k = k0;
    for (; k + 16 <= k1; k += 16) block_recurrent_grad<4, 2>(H, k, dpre + b * G, w_hh, dh + b * H);
    for (; k + 8 <= k1; k += 8) block_recurrent_grad<4, 1>(H, k, dpre + b * G, w_hh, dh + b * H);
    for (int64_t r = b; r < b + 4; ++r)
      for (int64_t kk = k; kk < k1; ++kk) {
        float s = 0.f;
        for (int64_t g = 0; g < G; ++g) s += dpre[r * G + g] * w_hh[g * H + kk];
        dh[r * H + kk] = s;
      }
  }
  for (; b < bt; ++b) {
    int64_t k = k0;
    for (; k + 32 <= k1; k += 32) block_recurrent_grad<1, 4>(H, k, dpre + b * G, w_hh, dh + b * H);
    for (; k + 8 <= k1; k += 8) block_recurrent_grad<1, 1>(H, k, dpre + b * G, w_hh, dh + b * H);
    for (int64_t kk = k; kk < k1; ++kk) {
      float s = 0.f;
      for (int64_t g = 0; g < G; ++g) s += dpre[b * G + g] * w_hh[g * H + kk];
      dh[b * H + kk] = s;
    }
  }
}

}  // namespace seqkernels::cpu
