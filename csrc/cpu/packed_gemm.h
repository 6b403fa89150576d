// A float32 GEMM for a right operand that is known ahead and reused: C[M, N] = A[M, K] · B[K, N]
// (row-major), with B packed once into panels of 16 columns (csrc/cpu/winograd.cpp: the
// transformed kernel, the same for every call of a ConvLSTM loop's step convolution).
//
// Why not the BLAS: Winograd's GEMMs are small (M = 16-64 tiles, K and N = 64-256 channels) and
// MKL packs B again in every call. perf of a ConvLSTM inference call (B = 4, 64 x 64 frames,
// 128 -> 256 channels, 32-tile blocks; AMD EPYC, AVX2): MKL's kernel 21% of the samples and its
// packing of B (sgemm_scopy_down16) 14%, with C's zeroing (sgemm_mscale) 2.5% more.
//
// The micro-kernel is the AVX2 analogue of a 6 x 16 SGEMM kernel: 6 rows x 2 vectors = 12
// accumulators; per k two vectors of B (L1: a panel of kDepth x 16 floats is 16 KB) and six
// broadcasts of A, packed per 6-row block so that they come from one pointer at fixed offsets.
// Each row of C sums over k in order, in one pass per kDepth, so the result does not depend on
// how the caller splits its work over threads.
//
// Shape legend: M rows of A and C, K the inner dimension, N columns of B and C.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SEQKERNELS_PACKED_GEMM 1
#else
#define SEQKERNELS_PACKED_GEMM 0
#endif

namespace seqkernels::cpu::packed_gemm {

constexpr int64_t kPanel = 16;   // columns of B per panel: two AVX2 vectors
constexpr int64_t kRows = 6;     // rows of A per micro-tile
constexpr int64_t kDepth = 256;  // k per pass: a panel's kDepth x 16 floats (16 KB) stay in L1

// Floats of B [K, N] packed: ceil(N / 16) panels of [K, 16], the last one's missing columns zero.
inline int64_t panels_size(int64_t K, int64_t N) { return (N + kPanel - 1) / kPanel * kPanel * K; }

// Packs B (row stride ldb) into out[panels_size(K, N)]: panel p, row k, column j at
// (p·K + k)·16 + j.
inline void pack_panels(const float* b, int64_t ldb, int64_t K, int64_t N, float* out) {
  for (int64_t p = 0; p * kPanel < N; ++p) {
    for (int64_t k = 0; k < K; ++k) {
      float* o = out + (p * K + k) * kPanel;
      for (int64_t j = 0; j < kPanel; ++j) {
        const int64_t col = p * kPanel + j;
        o[j] = col < N ? b[k * ldb + col] : 0.f;
      }
    }
  }
}

#if SEQKERNELS_PACKED_GEMM

namespace detail {

// C[R, cols] (row stride ldc) = (accumulate ? C : 0) + a · b over kc steps: a is R rows of A
// (row stride lda), b is [kc, 16] (a panel); cols < 16 stores through masks.
template <int R>
inline void micro_tile(int64_t kc, const float* __restrict a, int64_t lda, const float* __restrict b, float* c,
                       int64_t ldc, int64_t cols, bool accumulate) {
  const float* row[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) row[r] = a + r * lda;
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b + k * kPanel), b1 = _mm256_load_ps(b + k * kPanel + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 ar = _mm256_broadcast_ss(row[r] + k);
      acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
  if (cols == kPanel) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      float* row = c + r * ldc;
      if (accumulate) {
        acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_loadu_ps(row));
        acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_loadu_ps(row + 8));
      }
      _mm256_storeu_ps(row, acc[r][0]);
      _mm256_storeu_ps(row + 8, acc[r][1]);
    }
    return;
  }
  // Lane j of a half is on where j + its offset < cols.
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(cols)), lanes);
  const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(cols) - 8), lanes);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    float* row = c + r * ldc;
    if (accumulate) {
      acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_maskload_ps(row, m0));
      acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_maskload_ps(row + 8, m1));
    }
    _mm256_maskstore_ps(row, m0, acc[r][0]);
    _mm256_maskstore_ps(row + 8, m1, acc[r][1]);
  }
}

}  // namespace detail

// C[M, N] (row stride ldc) = A[M, K] (row stride lda) · B, with B packed by pack_panels(.., K, N,
// ..).
inline void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b_packed, float* c,
                 int64_t ldc) {
  for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
    const int64_t kc = std::min(kDepth, K - k0);
    const bool accumulate = k0 > 0;
    // Panels outer (one panel's kc x 16 floats stay in L1), row blocks inner.
    for (int64_t p = 0; p * kPanel < N; ++p) {
      const int64_t cols = std::min(kPanel, N - p * kPanel);
      const float* bp = b_packed + (p * K + k0) * kPanel;
      for (int64_t r0 = 0; r0 < M; r0 += kRows) {
        const float* ap = a + r0 * lda + k0;
        float* cp = c + r0 * ldc + p * kPanel;
        switch (std::min(kRows, M - r0)) {
          case 6: detail::micro_tile<6>(kc, ap, lda, bp, cp, ldc, cols, accumulate); break;
          case 5: detail::micro_tile<5>(kc, ap, lda, bp, cp, ldc, cols, accumulate); break;
          case 4: detail::micro_tile<4>(kc, ap, lda, bp, cp, ldc, cols, accumulate); break;
          case 3: detail::micro_tile<3>(kc, ap, lda, bp, cp, ldc, cols, accumulate); break;
          case 2: detail::micro_tile<2>(kc, ap, lda, bp, cp, ldc, cols, accumulate); break;
          default: detail::micro_tile<1>(kc, ap, lda, bp, cp, ldc, cols, accumulate); break;
        }
      }
    }
  }
}

#endif  // SEQKERNELS_PACKED_GEMM

}  // namespace seqkernels::cpu::packed_gemm
