// float32 products on AMX tiles at float32's accuracy ("x3"), for the CPU LSTM loops.
//
// Intel's AMX multiplies bfloat16 tiles into float32 accumulators: TDPBF16PS does a
// [16, 32]·[32, 16] product in ~16 cycles, 512 multiply-adds a cycle against 32 for two
// AVX-512 FMA pipes. bfloat16 keeps 8 significant bits, so each float32 operand is split into
// three bfloat16 parts, x = x0 + x1 + x2 + r with |r| <= 2^-24 |x| (each part the round-to-
// nearest of what the parts before it left), and a product a·b is the six partial products
// a0b0 + a1b0 + a2b0 + a0b1 + a1b1 + a0b2; the three left out are below 2^-23 |ab| together.
// That is the error class of the GPU's three-TF32 products (docs/kernels.md), a few float32
// roundings. On the 2-core development Xeon (AMX, 2 MB L2 a core) group_product takes ~195 ns a
// chunk of 32 k x 64 columns at 16 rows (W from L2; its 24 tile products alone ~115 ns), against
// ~340 ns for the same float32 products at the two FMA pipes' peak; at 8 rows ~190 ns against
// ~170, no gain (docs/kernels.md).
//
// A bfloat16 LSTM's operands need no split: its products are one tile product per chunk and
// tile (group_product_bf16, on W packed as part 0 alone), at the end of this file.
//
// Operand layouts (Kp = K rounded up to kTileK, zero-padded):
//   A, split: [3 parts][rows][a_ld] bfloat16, a_ld = a_row_stride(K) (split_rows, or written by
//   the caller), 64-byte aligned: a tile row that straddles two cache lines costs two (a group's
//   products ran ~1.5x longer from misaligned buffers)
//   B, packed in groups of kGroupTiles column tiles of 16: [group][K chunk of 32][3 parts]
//     [tile][16 k pairs][16 columns][2] bfloat16, the VNNI layout TDPBF16PS reads (a tile row
//     holds the k pairs of 16 columns)
// Shape legend: M rows, K reduction, N columns; the LSTM's G = 4H gate columns.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 11))
#define SEQKERNELS_HAVE_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace seqkernels::cpu::amx {

constexpr int64_t kTileK = 32;       // k per tile product: 32 bfloat16, one 64-byte tile row
constexpr int64_t kTileCols = 16;    // float32 columns of an accumulator tile
constexpr int64_t kTileRows = 16;    // rows of an A / accumulator tile
constexpr int64_t kGroupTiles = 4;   // accumulator tiles per pass over A (4 of the 8 tile registers)
constexpr int64_t kSplitParts = 3;   // bfloat16 parts of a float32 operand
constexpr int64_t kTileElems = kTileK * kTileCols;  // bfloat16 in a B tile (1 KB)

inline int64_t padded_k(int64_t K) { return (K + kTileK - 1) / kTileK * kTileK; }
// Row stride of split A operands: Kp and one cache line more, so that the 16 rows of a tile fall
// into different L1 sets (at Kp = 1024, 2 KB apart, they would share two).
inline int64_t a_row_stride(int64_t K) { return padded_k(K) + kTileK; }
// bfloat16 elements of a packed B with `groups` groups over a reduction of K.
inline int64_t packed_numel(int64_t groups, int64_t K) {
  return groups * (padded_k(K) / kTileK) * kSplitParts * kGroupTiles * kTileElems;
}

// Whether this CPU and OS let the process run AMX-BF16 and the AVX-512 BF16 conversions: CPUID,
// then Linux's permission for the tile data state, which a process must request before its first
// tile instruction (arch_prctl ARCH_REQ_XCOMP_PERM; once, for every thread). Checked once.
inline bool hardware_available() {
#if defined(SEQKERNELS_HAVE_AMX)
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__builtin_cpu_supports("avx512f") || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx = (d >> 22 & 1) && (d >> 24 & 1);  // AMX-BF16, AMX-TILE
    const bool bw_vl = (b >> 30 & 1) && (b >> 31 & 1);
    if (!amx || !bw_vl || !__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a >> 5 & 1)) return false;  // AVX512-BF16
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

#if defined(SEQKERNELS_HAVE_AMX)
#define SEQKERNELS_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

SEQKERNELS_AMX_TARGET inline __mmask16 lanes16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? static_cast<__mmask16>(0) : static_cast<__mmask16>((1u << n) - 1);
}

// 16 bfloat16 (the low halves of 32-bit lanes) back to float32: exact.
SEQKERNELS_AMX_TARGET inline __m512 widen(__m256i b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}
// 16 bfloat16 from / to memory as float32 (the store rounds to nearest even, as
// static_cast<c10::BFloat16>).
SEQKERNELS_AMX_TARGET inline __m512 load_bf16(const uint16_t* p) {
  return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
SEQKERNELS_AMX_TARGET inline void store_bf16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
}

// x = p0 + p1 + p2 (+ below 2^-24 |x|), each part the round-to-nearest bfloat16 of what the
// parts before it left; a finite x whose rounding overflows (|x| above bfloat16's largest finite
// value) starts from its truncation instead. A non-finite x is p2 alone (p0 = p1 = 0): part 2
// of an operand only meets part 0 of the other (group_product), so an inf gives ±inf as in a
// float32 product, never inf - inf = NaN from the other parts' signs (or inf · 0 from a zero
// part). Only an inf times an inf differs: inf · 0 = NaN where float32 gives ±inf.
SEQKERNELS_AMX_TARGET inline void split3(__m512 x, __m256i& p0, __m256i& p1, __m256i& p2) {
  const __m512 inf = _mm512_set1_ps(INFINITY);
  const __mmask16 finite = _mm512_cmp_ps_mask(_mm512_abs_ps(x), inf, _CMP_LT_OQ);
  __m256i b0 = (__m256i)_mm512_cvtneps_pbh(x);
  const __mmask16 overflow = finite & _mm512_cmp_ps_mask(_mm512_abs_ps(widen(b0)), inf, _CMP_EQ_OQ);
  if (overflow) {
    const __m256i truncated = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16));
    b0 = _mm256_mask_blend_epi16(overflow, b0, truncated);
  }
  const __m512 r1 = _mm512_maskz_sub_ps(finite, x, widen(b0));
  const __m256i b1 = (__m256i)_mm512_cvtneps_pbh(r1);
  const __m512 r2 = _mm512_sub_ps(r1, widen(b1));
  p0 = _mm256_maskz_mov_epi16(finite, b0);
  p1 = b1;
  p2 = _mm256_mask_blend_epi16(finite, b0, (__m256i)_mm512_cvtneps_pbh(r2));
}

// Rows [0, rows) of a ([rows, K], row stride lda) split into out [3][rows][a_row_stride(K)]
// (part stride rows * a_row_stride(K)), the columns from K on zero.
SEQKERNELS_AMX_TARGET inline void split_rows(const float* a, int64_t lda, int64_t rows, int64_t K, uint16_t* out) {
  const int64_t ld = a_row_stride(K), part = rows * ld;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < ld; k += 16) {
      const __m512 x = _mm512_maskz_loadu_ps(lanes16(K - k), a + r * lda + k);
      __m256i p0, p1, p2;
      split3(x, p0, p1, p2);
      uint16_t* dst = out + r * ld + k;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), p0);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + part), p1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * part), p2);
    }
  }
}

// Columns [j, j + n) (n <= 16) of rows [0, rows) of h ([rows, H] float32, row stride ldh) split
// into the A parts of the next step's product, out [3][.][ld] (part stride `part`) at column j
// (the units past n left as they are: zero from the buffer's initialisation).
SEQKERNELS_AMX_TARGET inline void split_columns(const float* h, int64_t ldh, int64_t rows, int64_t j, int64_t n,
                                                int64_t ld, int64_t part, uint16_t* out) {
  const __mmask16 mask = lanes16(n);
  for (int64_t r = 0; r < rows; ++r) {
    __m256i p0, p1, p2;
    split3(_mm512_maskz_loadu_ps(mask, h + r * ldh + j), p0, p1, p2);
    uint16_t* dst = out + r * ld + j;
    _mm256_mask_storeu_epi16(dst, mask, p0);
    _mm256_mask_storeu_epi16(dst + part, mask, p1);
    _mm256_mask_storeu_epi16(dst + 2 * part, mask, p2);
  }
}

// B packed from a matrix whose columns are contiguous rows of memory (w[n * ldw + k]: W_ih /
// W_hh for the LSTM's forward, gate column n = g * H + j): group u, tile t holds the columns
// column(u, t, 0..16), zero where that is < 0 (units past H). A tile's 16 columns x 32 k are
// split and transposed through a [16][16] block of 32-bit k pairs.
template <class Column>
SEQKERNELS_AMX_TARGET void pack_rows_major(const float* w, int64_t ldw, int64_t K, int64_t groups, const Column& column,
                                           uint16_t* packed) {
  const int64_t Kp = padded_k(K), chunks = Kp / kTileK;
  at::parallel_for(0, groups * kGroupTiles, 1, [&](int64_t i0, int64_t i1) SEQKERNELS_AMX_TARGET {
    alignas(64) uint32_t block[kSplitParts][16][16];  // [part][column][k pair]
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t u = i / kGroupTiles, t = i % kGroupTiles;
      for (int64_t c = 0; c < chunks; ++c) {
        for (int64_t n = 0; n < 16; ++n) {
          const int64_t col = column(u, t, n);
          for (int64_t h = 0; h < 2; ++h) {  // k halves of 16
            const int64_t k = c * kTileK + 16 * h;
            const __m512 x = col < 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(lanes16(K - k), w + col * ldw + k);
            __m256i p[3];
            split3(x, p[0], p[1], p[2]);
            for (int q = 0; q < 3; ++q) _mm256_storeu_si256(reinterpret_cast<__m256i*>(&block[q][n][8 * h]), p[q]);
          }
        }
        uint16_t* dst = packed + ((u * chunks + c) * kSplitParts * kGroupTiles + t) * kTileElems;
        for (int q = 0; q < 3; ++q) {
          uint32_t* tile = reinterpret_cast<uint32_t*>(dst + q * kGroupTiles * kTileElems);  // [k pair][column]
          for (int kk = 0; kk < 16; ++kk)
            for (int n = 0; n < 16; ++n) tile[kk * 16 + n] = block[q][n][kk];
        }
      }
    }
  });
}

// B packed from a matrix whose rows of memory run along the columns (w[k * ldw + n]: W_hh for
// the LSTM's dh = dG·W_hh, K = G, n a unit): group u holds columns [64 u, 64 u + 64), columns
// from N on zero. Two k rows' parts interleave into a tile row of 16 k pairs.
SEQKERNELS_AMX_TARGET inline void pack_cols_major(const float* w, int64_t ldw, int64_t K, int64_t N, uint16_t* packed) {
  const int64_t Kp = padded_k(K), chunks = Kp / kTileK;
  const int64_t groups = (N + kGroupTiles * kTileCols - 1) / (kGroupTiles * kTileCols);
  at::parallel_for(0, groups * chunks, 1, [&](int64_t i0, int64_t i1) SEQKERNELS_AMX_TARGET {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t u = i / chunks, c = i % chunks;
      uint16_t* dst = packed + i * kSplitParts * kGroupTiles * kTileElems;
      for (int64_t t = 0; t < kGroupTiles; ++t) {
        const int64_t n0 = (u * kGroupTiles + t) * kTileCols;
        const __mmask16 mask = lanes16(N - n0);
        for (int64_t kk = 0; kk < 16; ++kk) {
          __m256i p[2][3];
          for (int e = 0; e < 2; ++e) {
            const int64_t k = c * kTileK + 2 * kk + e;
            const __m512 x = k < K ? _mm512_maskz_loadu_ps(mask, w + k * ldw + n0) : _mm512_setzero_ps();
            split3(x, p[e][0], p[e][1], p[e][2]);
          }
          for (int q = 0; q < 3; ++q) {
            const __m512i pairs = _mm512_or_si512(_mm512_cvtepu16_epi32(p[0][q]),
                                                  _mm512_slli_epi32(_mm512_cvtepu16_epi32(p[1][q]), 16));
            _mm512_storeu_si512(dst + (q * kGroupTiles + t) * kTileElems + kk * 32, pairs);
          }
        }
      }
    }
  });
}

// The tile instructions as inline assembly of our own: GCC 12's intrinsics declare neither that
// tileloadd reads memory nor more than 8 bytes of ldtilecfg's 64-byte operand, so the compiler
// may drop or sink the stores they depend on (it dropped the tile configuration's rows: SIGILL).
#define SEQKERNELS_TILE_LOAD(tile, base, stride) \
  asm volatile("tileloadd (%0,%1,1), %%tmm" #tile ::"r"(base), "r"(static_cast<long>(stride)) : "memory")
#define SEQKERNELS_TILE_STORE(tile, base, stride) \
  asm volatile("tilestored %%tmm" #tile ", (%0,%1,1)" ::"r"(base), "r"(static_cast<long>(stride)) : "memory")
#define SEQKERNELS_TILE_ZERO(tile) asm volatile("tilezero %%tmm" #tile ::)
// acc += a·b: a [rows, 32] bfloat16, b [16 k pairs, 16 columns, 2], acc [rows, 16] float32.
#define SEQKERNELS_TILE_DPBF16PS(acc, a, b) asm volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #acc ::)

// The tile configuration: accumulators 0-3 and A parts 4-6 of `rows` rows, the B tile 7 of 16
// k pairs; every row 64 bytes.
// With b_tiles = 2 (group_product_bf16): A tiles 4-5 and B tiles 6-7.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");
inline void configure(int64_t rows, int b_tiles = 1) {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = static_cast<uint8_t>(i >= 8 - b_tiles ? 16 : rows);
  }
  asm volatile("ldtilecfg %0" ::"m"(cfg));
}
// Hands the tile state back (TILERELEASE): a thread holding none does not make the OS save and
// restore 8 KB of tile data on every switch.
inline void release() { asm volatile("tilerelease" ::); }
// The tile configuration of a run of row blocks: configured again only when a block's row count
// changes (a last, shorter block), released at the end of the run.
class TileRows {
 public:
  explicit TileRows(int b_tiles = 1) : b_tiles_(b_tiles) {}
  TileRows(const TileRows&) = delete;
  TileRows& operator=(const TileRows&) = delete;
  ~TileRows() {
    if (rows_ != 0) release();
  }
  void use(int64_t rows) {
    if (rows != rows_) {
      configure(rows, b_tiles_);
      rows_ = rows;
    }
  }

 private:
  int b_tiles_;
  int64_t rows_ = 0;
};

// Where a group's accumulators start and end: tile t from c_in + t * gate (row stride in_ld
// floats; in_ld = 0 repeats one row, e.g. a bias) or zero (c_in null), stored to c_out + t * gate
// (row stride out_ld floats). Starting from the destination itself (the step's input projection
// already in pre) leaves no epilogue: the tiles load and store pre directly.
struct Accumulators {
  const float* c_in;
  int64_t in_ld;
  float* c_out;
  int64_t out_ld, gate;
};

// Accumulator tiles 0-3 from acc.c_in (or zero), and back to acc.c_out.
inline void start_accumulators(const Accumulators& acc) {
  if (acc.c_in != nullptr) {
    const int64_t in_bytes = acc.in_ld * 4;
    SEQKERNELS_TILE_LOAD(0, acc.c_in, in_bytes);
    SEQKERNELS_TILE_LOAD(1, acc.c_in + acc.gate, in_bytes);
    SEQKERNELS_TILE_LOAD(2, acc.c_in + 2 * acc.gate, in_bytes);
    SEQKERNELS_TILE_LOAD(3, acc.c_in + 3 * acc.gate, in_bytes);
  } else {
    SEQKERNELS_TILE_ZERO(0);
    SEQKERNELS_TILE_ZERO(1);
    SEQKERNELS_TILE_ZERO(2);
    SEQKERNELS_TILE_ZERO(3);
  }
}
inline void store_accumulators(const Accumulators& acc) {
  const int64_t out_bytes = acc.out_ld * 4;
  SEQKERNELS_TILE_STORE(0, acc.c_out, out_bytes);
  SEQKERNELS_TILE_STORE(1, acc.c_out + acc.gate, out_bytes);
  SEQKERNELS_TILE_STORE(2, acc.c_out + 2 * acc.gate, out_bytes);
  SEQKERNELS_TILE_STORE(3, acc.c_out + 3 * acc.gate, out_bytes);
}

// c_out tile t = c_in tile t + A[r, :]·B[:, tile t of the group] for t < 4 and the rows of the
// configured A tiles (configure(rows)): the six partial products per chunk of 32 k.
//   a: the A parts at row 0 (part stride a_part, row stride a_ld, Kp columns); b_group: a packed
//   group
inline void group_product(const uint16_t* a, int64_t a_part, int64_t a_ld, int64_t Kp, const uint16_t* b_group,
                          const Accumulators& acc) {
  const int64_t lda = a_ld * 2, chunks = Kp / kTileK;
  start_accumulators(acc);
  // The A parts of a chunk are loaded while the chunk before it finishes: its products run by B
  // part, so that A part 2 is free after the first 12, part 1 after the next 8 (a tile that is
  // reloaded must first be read by every product before it).
  SEQKERNELS_TILE_LOAD(6, a + 2 * a_part, lda);
  SEQKERNELS_TILE_LOAD(5, a + a_part, lda);
  SEQKERNELS_TILE_LOAD(4, a, lda);
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const uint16_t* b = b_group + ch * kSplitParts * kGroupTiles * kTileElems;
    const uint16_t* next = a + std::min(ch + 1, chunks - 1) * kTileK;
#define SEQKERNELS_AMX_PART0(t)                                        \
  SEQKERNELS_TILE_LOAD(7, b + (0 * kGroupTiles + t) * kTileElems, 64); \
  SEQKERNELS_TILE_DPBF16PS(t, 6, 7);                                  \
  SEQKERNELS_TILE_DPBF16PS(t, 5, 7);                                  \
  SEQKERNELS_TILE_DPBF16PS(t, 4, 7);
#define SEQKERNELS_AMX_PART1(t)                                        \
  SEQKERNELS_TILE_LOAD(7, b + (1 * kGroupTiles + t) * kTileElems, 64); \
  SEQKERNELS_TILE_DPBF16PS(t, 5, 7);                                  \
  SEQKERNELS_TILE_DPBF16PS(t, 4, 7);
#define SEQKERNELS_AMX_PART2(t)                                        \
  SEQKERNELS_TILE_LOAD(7, b + (2 * kGroupTiles + t) * kTileElems, 64); \
  SEQKERNELS_TILE_DPBF16PS(t, 4, 7);
    SEQKERNELS_AMX_PART0(0)
    SEQKERNELS_AMX_PART0(1)
    SEQKERNELS_AMX_PART0(2)
    SEQKERNELS_AMX_PART0(3)
    if (ch + 1 < chunks) SEQKERNELS_TILE_LOAD(6, next + 2 * a_part, lda);
    SEQKERNELS_AMX_PART1(0)
    SEQKERNELS_AMX_PART1(1)
    SEQKERNELS_AMX_PART1(2)
    SEQKERNELS_AMX_PART1(3)
    if (ch + 1 < chunks) SEQKERNELS_TILE_LOAD(5, next + a_part, lda);
    SEQKERNELS_AMX_PART2(0)
    SEQKERNELS_AMX_PART2(1)
    SEQKERNELS_AMX_PART2(2)
    SEQKERNELS_AMX_PART2(3)
    if (ch + 1 < chunks) SEQKERNELS_TILE_LOAD(4, next, lda);
#undef SEQKERNELS_AMX_PART0
#undef SEQKERNELS_AMX_PART1
#undef SEQKERNELS_AMX_PART2
  }
  store_accumulators(acc);
}

// ---------------------------------------------------------------------------------------
// bfloat16 operands: one part. A bfloat16 LSTM's operands are bfloat16 already, so each chunk
// is one tile product per accumulator instead of six, over B tiles of half the bytes.
//   A: [rows][a_ld] bfloat16 (a_ld = a_row_stride(K), zero past K), as for the split parts
//   B, packed in groups of kGroupTiles column tiles: [group][K chunk of 32][tile][16 k pairs]
//     [16 columns][2] bfloat16 (the split layout's part 0 alone)

// bfloat16 elements of a one-part packed B with `groups` groups over a reduction of K.
inline int64_t packed_numel_bf16(int64_t groups, int64_t K) {
  return groups * (padded_k(K) / kTileK) * kGroupTiles * kTileElems;
}

// out[p] = lane p of every in[n] (a 16 x 16 transpose of 32-bit lanes): in[n] holds column n's
// 16 k pairs, out[p] k pair p of the 16 columns, a tile row.
SEQKERNELS_AMX_TARGET inline void transpose16x16_epi32(const __m512i (&in)[16], __m512i (&out)[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // b[4i + j], 128-bit lane L: rows 4i..4i+3 of lane 4L + j
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i e0 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0x44), e1 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0xEE);
    const __m512i f0 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0x44), f1 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0xEE);
    out[j] = _mm512_shuffle_i32x4(e0, f0, 0x88);
    out[4 + j] = _mm512_shuffle_i32x4(e0, f0, 0xDD);
    out[8 + j] = _mm512_shuffle_i32x4(e1, f1, 0x88);
    out[12 + j] = _mm512_shuffle_i32x4(e1, f1, 0xDD);
  }
}

// B packed from a bfloat16 matrix whose columns are contiguous rows of memory (w[n * ldw + k],
// as pack_rows_major): group u, tile t holds the columns column(u, t, 0..16), zero where that
// is < 0 and for k >= K. A tile is 16 columns' 64-byte runs of k, transposed as k pairs.
template <class Column>
SEQKERNELS_AMX_TARGET void pack_rows_major_bf16(const uint16_t* w, int64_t ldw, int64_t K, int64_t groups,
                                                const Column& column, uint16_t* packed) {
  const int64_t chunks = padded_k(K) / kTileK;
  at::parallel_for(0, groups * kGroupTiles, 1, [&](int64_t i0, int64_t i1) SEQKERNELS_AMX_TARGET {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t u = i / kGroupTiles, t = i % kGroupTiles;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t left = K - c * kTileK;
        const __mmask32 ks = left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << left) - 1);
        __m512i cols[16], rows[16];
        for (int64_t n = 0; n < kTileCols; ++n) {
          const int64_t col = column(u, t, n);
          cols[n] = col < 0 ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi16(ks, w + col * ldw + c * kTileK);
        }
        transpose16x16_epi32(cols, rows);
        uint16_t* tile = packed + ((u * chunks + c) * kGroupTiles + t) * kTileElems;  // [k pair][column][2]
        for (int p = 0; p < 16; ++p) _mm512_storeu_si512(tile + p * 2 * kTileCols, rows[p]);
      }
    }
  });
}

// B packed from a bfloat16 matrix whose rows of memory run along the columns (w[k * ldw + n], as
// pack_cols_major): group u holds columns [64 u, 64 u + 64), zero from column N and for k >= K.
// Two k rows interleave into a tile row of 16 k pairs.
SEQKERNELS_AMX_TARGET inline void pack_cols_major_bf16(const uint16_t* w, int64_t ldw, int64_t K, int64_t N,
                                                       uint16_t* packed) {
  const int64_t chunks = padded_k(K) / kTileK;
  const int64_t groups = (N + kGroupTiles * kTileCols - 1) / (kGroupTiles * kTileCols);
  at::parallel_for(0, groups * chunks, 1, [&](int64_t i0, int64_t i1) SEQKERNELS_AMX_TARGET {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t u = i / chunks, c = i % chunks;
      uint16_t* dst = packed + i * kGroupTiles * kTileElems;
      for (int64_t t = 0; t < kGroupTiles; ++t) {
        const int64_t n0 = (u * kGroupTiles + t) * kTileCols;
        const __mmask16 mask = lanes16(N - n0);
        for (int64_t kk = 0; kk < kTileK / 2; ++kk) {
          const int64_t k = c * kTileK + 2 * kk;
          auto row = [&](int64_t r) SEQKERNELS_AMX_TARGET {
            return r < K ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, w + r * ldw + n0)) : _mm512_setzero_si512();
          };
          const __m512i pairs = _mm512_or_si512(row(k), _mm512_slli_epi32(row(k + 1), 16));
          _mm512_storeu_si512(dst + t * kTileElems + kk * 2 * kTileCols, pairs);
        }
      }
    }
  });
}

// Columns [0, n) of rows [0, rows) of a bfloat16 matrix (row stride lda) copied to out (row
// stride ld): into an A operand, whose columns that no copy writes are zero from its allocation.
inline void copy_rows_bf16(const uint16_t* a, int64_t lda, int64_t rows, int64_t n, uint16_t* out, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * ld, a + r * lda, sizeof(uint16_t) * n);
}

// c_out tile t = c_in tile t + A[r, :]·B[:, tile t of the group] for t < 4 and the rows of the
// configured A tiles (configure(rows, 2)): one tile product per tile and chunk. A chunk's two
// A tiles alternate (4, 5) so that the next chunk's A loads while this one's products run, and
// so do its B tiles (6, 7): a B tile is reloaded only after the product before last read it.
//   a: A at row 0 (row stride a_ld, Kp columns); b_group: a one-part packed group
inline void group_product_bf16(const uint16_t* a, int64_t a_ld, int64_t Kp, const uint16_t* b_group,
                               const Accumulators& acc) {
  const int64_t lda = a_ld * 2, chunks = Kp / kTileK;
  start_accumulators(acc);
  SEQKERNELS_TILE_LOAD(4, a, lda);
#define SEQKERNELS_AMX_BF16_CHUNK(A, A_NEXT)                                    \
  {                                                                             \
    const uint16_t* b = b_group + ch * kGroupTiles * kTileElems;               \
    SEQKERNELS_TILE_LOAD(6, b, 64);                                             \
    SEQKERNELS_TILE_LOAD(7, b + kTileElems, 64);                                \
    if (ch + 1 < chunks) SEQKERNELS_TILE_LOAD(A_NEXT, a + (ch + 1) * kTileK, lda); \
    SEQKERNELS_TILE_DPBF16PS(0, A, 6);                                          \
    SEQKERNELS_TILE_LOAD(6, b + 2 * kTileElems, 64);                            \
    SEQKERNELS_TILE_DPBF16PS(1, A, 7);                                          \
    SEQKERNELS_TILE_LOAD(7, b + 3 * kTileElems, 64);                            \
    SEQKERNELS_TILE_DPBF16PS(2, A, 6);                                          \
    SEQKERNELS_TILE_DPBF16PS(3, A, 7);                                          \
  }
  for (int64_t ch = 0; ch < chunks; ++ch) {
    if ((ch & 1) == 0) {
      SEQKERNELS_AMX_BF16_CHUNK(4, 5)
    } else {
      SEQKERNELS_AMX_BF16_CHUNK(5, 4)
    }
  }
#undef SEQKERNELS_AMX_BF16_CHUNK
  store_accumulators(acc);
}

#pragma GCC diagnostic pop
#endif  // SEQKERNELS_HAVE_AMX

}  // namespace seqkernels::cpu::amx
