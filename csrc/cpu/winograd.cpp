// Winograd convolutions of the CPU ConvLSTM: the design is in winograd.h.
//
// Each call walks the output tiles one block after another (block_tiles: 16-64 tiles). A
// block's input tiles are transformed into V [n·n, tiles, I] (the channels of a point
// contiguous, so the loops over channels vectorise), n·n single-threaded GEMMs give
// M [n·n, tiles, O] = V · U (weight gradient: dU += Vᵀ · dM), and the output transform writes
// the block's pixels. Within a block the transforms are split over the threads by tile and the
// GEMMs by point, so the call holds one block's V and M, which stay in cache (the whole call's
// would stream through memory), and every result is the same bits for any thread count.
//
// Shape legend: N frames, I input channels, O output channels, H x W the frame, r the kernel,
// m the output tile, n = m + r - 1 (the template's N) the input tile, (ξ, ν) its points.
#include "winograd.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>

#include "blas.h"
#include "packed_gemm.h"
#include "seqkernels/error_format.h"

namespace seqkernels::cpu {
namespace {

using at::Tensor;

constexpr int kMaxTile = 8;          // input tile side n = m + r - 1: 6 or 8
// Tiles per block (the GEMMs' M): the most of 64, 32 and 16 whose V and M (n·n points ×
// (I + O) channels a tile) fit kBlockBytes; a block is a call's scratch, and the GEMMs want rows.
// The benchmark's first shape in inference (F(4x4, 5x5), 80 -> 256 channels): 16 tiles, 1.4 MB,
// which kept its peak below the PyTorch loop's (2.8 MB at 32 tiles did not); the second shape
// (F(4x4, 3x3), 128 -> 256): 32 tiles, 1.8 MB.
constexpr int64_t kBlockBytes = int64_t(2) << 20;
int64_t block_tiles(int points, int64_t I, int64_t O, size_t value_bytes) {
  int64_t tiles = 64;
  while (tiles > 16 && tiles * points * (I + O) * int64_t(value_bytes) > kBlockBytes) tiles /= 2;
  return tiles;
}

// The Toom-Cook matrices of F(m, r) on the points 0, 1, -1, 2, -2, 1/2, -1/2 (the first n - 1 of
// them) and ∞, Lavin and Gray's choice, in double; the tile transforms take them cast to the
// data type.
struct Matrices {
  int m = 0, r = 0, n = 0;
  double BT[kMaxTile][kMaxTile] = {};  // input transform Bᵀ [n, n]
  double G[kMaxTile][5] = {};          // kernel transform G [n, r]
  double AT[kMaxTile][kMaxTile] = {};  // output transform Aᵀ [m, n]
};

// The polynomial-evaluation matrix [n, k]: row j evaluates a polynomial of k coefficients at
// point j (the last row, the point at infinity, takes the leading coefficient).
void evaluation(int n, int k, double out[kMaxTile][kMaxTile]) {
  static constexpr double kPointsAt[kMaxTile - 1] = {0., 1., -1., 2., -2., 0.5, -0.5};
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < k; ++i) {
      out[j][i] = j == n - 1 ? (i == k - 1 ? 1. : 0.) : std::pow(kPointsAt[j], i);
    }
  }
}

// Derivation: the linear convolution of a length-m and a length-r polynomial is
// C[(G g) ⊙ (A x)] with A, G evaluations and C = V⁻¹ the interpolation from the n points; its
// transpose in x is the correlation y = Aᵀ[(G g) ⊙ (Cᵀ d)] that a convolution layer computes,
// so Bᵀ = (V⁻¹)ᵀ. Each row of Bᵀ is then scaled so that its last nonzero coefficient is 1, which
// leaves dyadic coefficients (5.25, 4.25, 0.5, ...: exact in any float type, so the data
// transforms add no error of their own), and G takes the inverse scale.
Matrices make_matrices(int m, int r) {
  Matrices mat;
  mat.m = m;
  mat.r = r;
  const int n = mat.n = m + r - 1;
  double V[kMaxTile][kMaxTile] = {}, A[kMaxTile][kMaxTile] = {}, Gm[kMaxTile][kMaxTile] = {};
  evaluation(n, n, V);
  evaluation(n, m, A);
  evaluation(n, r, Gm);
  // V⁻¹ by Gauss-Jordan elimination with partial pivoting.
  double aug[kMaxTile][2 * kMaxTile] = {};
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) aug[i][j] = V[i][j];
    aug[i][n + i] = 1.;
  }
  for (int col = 0; col < n; ++col) {
    int pivot = col;
    for (int i = col + 1; i < n; ++i) {
      if (std::abs(aug[i][col]) > std::abs(aug[pivot][col])) pivot = i;
    }
    for (int j = 0; j < 2 * n; ++j) std::swap(aug[col][j], aug[pivot][j]);
    const double d = aug[col][col];
    for (int j = 0; j < 2 * n; ++j) aug[col][j] /= d;
    for (int i = 0; i < n; ++i) {
      if (i == col) continue;
      const double f = aug[i][col];
      for (int j = 0; j < 2 * n; ++j) aug[i][j] -= f * aug[col][j];
    }
  }
  for (int j = 0; j < n; ++j) {
    // Row j of Bᵀ is column j of V⁻¹.
    double scale = 0.;
    for (int k = 0; k < n; ++k) {
      const double v = aug[k][n + j];
      if (std::abs(v) > 1e-12) scale = v;
    }
    for (int k = 0; k < n; ++k) {
      // Dyadic with a denominator of at most 4 for these points: rounding to 1/64 removes
      // the elimination's rounding.
      mat.BT[j][k] = std::round(aug[k][n + j] / scale * 64.) / 64.;
    }
    for (int k = 0; k < r; ++k) mat.G[j][k] = Gm[j][k] * scale;
  }
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) mat.AT[i][j] = A[j][i];
  }
  return mat;
}

// F(4x4, 3x3) on 6 x 6 tiles and F(4x4, 5x5) on 8 x 8 tiles: 2.25 and 4 multiplications per
// output and channel pair against 9 and 25. F(6x6, 3x3) on 8 x 8 tiles has 21% fewer products
// than F(4x4, 3x3) at 1.2x the float32 error, and measured no faster on the benchmark's 64 x 64
// frames (11 tiles of 6 overhang 64 pixels; AMD EPYC, 2 threads). F(4x4, 5x5)'s error is that
// of F(4x4, 3x3) (6e-6 and 8.6e-6 of the magnitude with 64 and 128 input channels).
const Matrices& matrices(int r) {
  static const Matrices f43 = make_matrices(4, 3), f45 = make_matrices(4, 5);
  return r == 3 ? f43 : f45;
}

// The matrices in the data type, for tiles of side N.
template <int N, class T>
struct TypedMatrices {
  int m, r;
  T BT[N][N], AT[N][N];
  explicit TypedMatrices(const Matrices& d) : m(d.m), r(d.r) {
    for (int i = 0; i < N; ++i) {
      for (int j = 0; j < N; ++j) {
        BT[i][j] = T(d.BT[i][j]);
        AT[i][j] = T(d.AT[i][j]);
      }
    }
  }
};

// Channels-last frames: pixel (n, y, x)'s C channels contiguous at n·sN + y·sY + x·sX.
template <class T>
struct Frames {
  T* data;
  int64_t N, H, W, C, sN, sY, sX;
  T* pixel(int64_t n, int64_t y, int64_t x) const { return data + n * sN + y * sY + x * sX; }
};

template <class T>  // T const for frames only read
Frames<T> frames_of(const Tensor& t) {  // t: [N, C, H, W] with unit channel stride
  return {t.data_ptr<std::remove_const_t<T>>(), t.size(0), t.size(2), t.size(3), t.size(1),
          t.stride(0), t.stride(2), t.stride(3)};
}

// How the frames split into m x m output tiles.
struct Tiling {
  int64_t rows, cols, per_frame, tiles, block, blocks;
  int m, pad;
  Tiling(int64_t N, int64_t H, int64_t W, int m_, int r, int64_t block_)
      : rows((H + m_ - 1) / m_), cols((W + m_ - 1) / m_), block(block_), m(m_), pad(r / 2) {
    per_frame = rows * cols;
    tiles = N * per_frame;
    blocks = (tiles + block - 1) / block;
  }
  // The frame and top-left output pixel of tile t.
  void locate(int64_t t, int64_t& n, int64_t& y0, int64_t& x0) const {
    n = t / per_frame;
    const int64_t rest = t - n * per_frame;
    y0 = (rest / cols) * m;
    x0 = (rest % cols) * m;
  }
};

template <class T>
void fill(T* __restrict out, int64_t C, T v) {
  for (int64_t c = 0; c < C; ++c) out[c] = v;
}

template <class T>
void axpy(T* __restrict out, const T* __restrict in, int64_t C, T a) {
  for (int64_t c = 0; c < C; ++c) out[c] += a * in[c];
}

// The second pass of a separable tile transform: out[ξ·N + ν] (`plane` apart, C channels each)
// = Σ_{a < rows} coef(ξ, a) · in[a·N + ν], skipping zero coefficients.
template <int N, class T, class Coef>
void combine_rows(Coef coef, int rows, const T* in, int64_t C, T* out, int64_t plane) {
  for (int xi = 0; xi < N; ++xi) {
    for (int nu = 0; nu < N; ++nu) {
      T* o = out + (xi * N + nu) * plane;
      fill(o, C, T(0));
      for (int a = 0; a < rows; ++a) {
        const T w = coef(xi, a);
        if (w != T(0)) axpy(o, in + (a * N + nu) * C, C, w);
      }
    }
  }
}

// v[ξν·plane + c] = (Bᵀ d B)[ξ][ν] over the N x N input patch of tile t (zero outside the
// frame), both passes skipping Bᵀ's zeros. scratch: [N·N, C].
template <int N, class T>
void input_tile(const Frames<const T>& f, const Tiling& tl, int64_t t, const TypedMatrices<N, T>& mat, T* scratch,
                T* v, int64_t plane) {
  int64_t n, y0, x0;
  tl.locate(t, n, y0, x0);
  const int64_t C = f.C;
  const T* patch[N][N];
  for (int a = 0; a < N; ++a) {
    const int64_t y = y0 - tl.pad + a;
    for (int b = 0; b < N; ++b) {
      const int64_t x = x0 - tl.pad + b;
      patch[a][b] = y >= 0 && y < f.H && x >= 0 && x < f.W ? f.pixel(n, y, x) : nullptr;
    }
  }
  for (int a = 0; a < N; ++a) {  // scratch[a][ν] = Σ_b Bᵀ[ν][b] d[a][b]
    for (int nu = 0; nu < N; ++nu) {
      T* out = scratch + (a * N + nu) * C;
      fill(out, C, T(0));
      for (int b = 0; b < N; ++b) {
        if (mat.BT[nu][b] != T(0) && patch[a][b]) axpy(out, patch[a][b], C, mat.BT[nu][b]);
      }
    }
  }
  // v[ξ][ν] = Σ_a Bᵀ[ξ][a] scratch[a][ν]
  combine_rows<N>([&](int xi, int a) { return mat.BT[xi][a]; }, N, scratch, C, v, plane);
}

// Output pixels of tile t: Y = Aᵀ M A (+ bias), from m[ξν·plane + o]; pixels beyond the frame
// are not written. scratch: [N, m, O].
template <int N, class T>
void output_tile(const T* mt, int64_t plane, const Tiling& tl, int64_t t, const TypedMatrices<N, T>& mat,
                 const T* bias, T* scratch, const Frames<T>& out) {
  int64_t n, y0, x0;
  tl.locate(t, n, y0, x0);
  const int64_t O = out.C;
  const int m = mat.m;
  for (int xi = 0; xi < N; ++xi) {  // scratch[ξ][j] = Σ_ν Aᵀ[j][ν] M[ξ][ν]
    for (int j = 0; j < m; ++j) {
      T* s = scratch + (xi * m + j) * O;
      fill(s, O, T(0));
      for (int nu = 0; nu < N; ++nu) {
        if (mat.AT[j][nu] != T(0)) axpy(s, mt + (xi * N + nu) * plane, O, mat.AT[j][nu]);
      }
    }
  }
  for (int i = 0; i < m && y0 + i < out.H; ++i) {  // Y[i][j] = Σ_ξ Aᵀ[i][ξ] scratch[ξ][j]
    for (int j = 0; j < m && x0 + j < out.W; ++j) {
      T* y = out.pixel(n, y0 + i, x0 + j);
      if (bias) {
        for (int64_t o = 0; o < O; ++o) y[o] = bias[o];
      } else {
        fill(y, O, T(0));
      }
      for (int xi = 0; xi < N; ++xi) {
        if (mat.AT[i][xi] != T(0)) axpy(y, scratch + (xi * m + j) * O, O, mat.AT[i][xi]);
      }
    }
  }
}

// dm[ξν·plane + o] = (A dY Aᵀ)[ξ][ν] over tile t's m x m output gradient (zero beyond the
// frame): the output transform's transpose. scratch: [m, N, O].
template <int N, class T>
void output_grad_tile(const Frames<const T>& dy, const Tiling& tl, int64_t t, const TypedMatrices<N, T>& mat,
                      T* scratch, T* dm, int64_t plane) {
  int64_t n, y0, x0;
  tl.locate(t, n, y0, x0);
  const int64_t O = dy.C;
  const int m = mat.m;
  for (int i = 0; i < m; ++i) {  // scratch[i][ν] = Σ_j Aᵀ[j][ν] dY[i][j]
    const bool row_in = y0 + i < dy.H;
    for (int nu = 0; nu < N; ++nu) {
      T* s = scratch + (i * N + nu) * O;
      fill(s, O, T(0));
      if (!row_in) continue;
      for (int j = 0; j < m && x0 + j < dy.W; ++j) {
        if (mat.AT[j][nu] != T(0)) axpy(s, dy.pixel(n, y0 + i, x0 + j), O, mat.AT[j][nu]);
      }
    }
  }
  // dm[ξ][ν] = Σ_i Aᵀ[i][ξ] scratch[i][ν]
  combine_rows<N>([&](int xi, int i) { return mat.AT[i][xi]; }, m, scratch, O, dm, plane);
}

// Uninitialised scratch of n values (the transforms write before they read).
template <class T>
std::unique_ptr<T[]> scratch_of(int64_t n) {
  return std::unique_ptr<T[]>(new T[static_cast<size_t>(n)]);
}

// The tile transforms' scratch of one call: one share per thread, allocated once rather than in
// every parallel region of every block.
template <class T>
class ThreadScratch {
 public:
  explicit ThreadScratch(int64_t per_thread)
      : per_thread_(per_thread), data_(scratch_of<T>(per_thread * at::get_num_threads())) {}
  T* mine() const { return data_.get() + at::get_thread_num() * per_thread_; }

 private:
  int64_t per_thread_;
  std::unique_ptr<T[]> data_;
};

// One call's working memory: one block's V [n·n, block, I] and M (or dM) [n·n, block, O], and
// the threads' transform scratch.
template <class T>
struct BlockBuffers {
  std::unique_ptr<T[]> v, m;
  ThreadScratch<T> scratch;
  BlockBuffers(int points, int64_t block, int64_t I, int64_t O)
      : v(scratch_of<T>(points * block * I)), m(scratch_of<T>(points * block * O)),
        scratch(points * std::max(I, O)) {}
};

// The transformed kernel's points as the GEMMs take them: float32 (where packed_gemm.h's kernel
// is built) each point's [I, O] packed into panels of 16 columns, made once per loop and read
// by every step; float64 goes to the BLAS as [I, O].
template <class T>
constexpr bool kPackedPoints = std::is_same_v<T, float> && SEQKERNELS_PACKED_GEMM;

template <class T>
int64_t point_size(int64_t I, int64_t O) {
  return kPackedPoints<T> ? packed_gemm::panels_size(I, O) : I * O;
}

// M [count, O] = V [count, I] · U, one point's GEMM, U in transform_kernel's layout (packed
// exactly where kPackedPoints says so).
template <class T>
void point_gemm(int64_t count, int64_t O, int64_t I, const T* v, const T* u, T* m) {
#if SEQKERNELS_PACKED_GEMM
  if constexpr (kPackedPoints<T>) {
    packed_gemm::gemm(count, O, I, v, I, u, m, O);
    return;
  }
#endif
  gemm(Trans::No, Trans::No, count, O, I, v, I, u, O, T(0), m, O);
}

// U = G w Gᵀ for every (o, i), in double before the cast, with w(o, i, a, b) read through
// `weight_at` (the forward's kernel or the input gradient's rotated one): [n·n, point_size(I, O)].
template <class T, class KernelAt>
Tensor transform_kernel(int64_t I, int64_t O, int r, const at::TensorOptions& opts, KernelAt weight_at) {
  const Matrices& mat = matrices(r);
  const int n = mat.n;
  Tensor u = at::empty({n * n, I, O}, opts);
  T* ud = u.data_ptr<T>();
  at::parallel_for(0, O, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t i = 0; i < I; ++i) {
        double gw[kMaxTile][5];  // G w
        for (int xi = 0; xi < n; ++xi) {
          for (int b = 0; b < r; ++b) {
            double s = 0.;
            for (int a = 0; a < r; ++a) s += mat.G[xi][a] * weight_at(o, i, a, b);
            gw[xi][b] = s;
          }
        }
        for (int xi = 0; xi < n; ++xi) {
          for (int nu = 0; nu < n; ++nu) {
            double s = 0.;
            for (int b = 0; b < r; ++b) s += gw[xi][b] * mat.G[nu][b];
            ud[(xi * n + nu) * I * O + i * O + o] = T(s);
          }
        }
      }
    }
  });
  if constexpr (!kPackedPoints<T>) {
    return u;
  } else {
    Tensor packed = at::empty({n * n, point_size<T>(I, O)}, opts);
    at::parallel_for(0, n * n, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        packed_gemm::pack_panels(ud + k * I * O, O, I, O, packed.data_ptr<T>() + k * point_size<T>(I, O));
      }
    });
    return packed;
  }
}

// out = w * in (+ bias) with U = G w Gᵀ (transform_kernel's layout).
template <int N, class T>
void convolve_tiles(const Frames<const T>& in, const Tensor& u, const T* bias, int r, const Frames<T>& out) {
  constexpr int kPoints = N * N;
  const TypedMatrices<N, T> mat(matrices(r));
  const int64_t I = in.C, O = out.C;
  const Tiling tl(in.N, in.H, in.W, mat.m, r, block_tiles(kPoints, I, O, sizeof(T)));
  const int64_t block = tl.block;
  const T* ud = u.data_ptr<T>();
  // One block at a time, its transforms split over the threads by tile and its GEMMs by point
  // (as the weight gradient): one block's V and M in memory rather than one per thread.
  const BlockBuffers<T> buf(kPoints, block, I, O);
  T* const v = buf.v.get();
  T* const mt = buf.m.get();
  const int64_t u_point = point_size<T>(I, O);
  for (int64_t blk = 0; blk < tl.blocks; ++blk) {
    const int64_t t0 = blk * block, count = std::min(block, tl.tiles - t0);
    at::parallel_for(0, count, 1, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        input_tile(in, tl, t0 + j, mat, buf.scratch.mine(), v + j * I, block * I);
      }
    });
    at::parallel_for(0, kPoints, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        point_gemm(count, O, I, v + k * block * I, ud + k * u_point, mt + k * block * O);
      }
    });
    at::parallel_for(0, count, 1, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        output_tile(mt + j * O, block * O, tl, t0 + j, mat, bias, buf.scratch.mine(), out);
      }
    });
  }
}

template <class T>
void convolve(const Frames<const T>& in, const Tensor& u, const T* bias, int r, const Frames<T>& out) {
  if (matrices(r).n == 6) convolve_tiles<6>(in, u, bias, r, out);
  else convolve_tiles<8>(in, u, bias, r, out);
}

// dU [N·N, I, O] = Σ_tiles (Bᵀ d B)ᵀ · (A dY Aᵀ), then dw = Gᵀ dU G into grad [O, I, r, r] (double
// sums).
template <int N, class T>
void weight_gradient_tiles(const Frames<const T>& in, const Frames<const T>& dy, int r, T* grad) {
  constexpr int kPoints = N * N;
  const TypedMatrices<N, T> mat(matrices(r));
  const int64_t I = in.C, O = dy.C;
  const Tiling tl(in.N, in.H, in.W, mat.m, r, block_tiles(kPoints, I, O, sizeof(T)));
  const int64_t block = tl.block;
  // One accumulator dU [N·N, I, O]. The blocks run one after another: a block's tile
  // transforms are split over the threads by tile, its N·N GEMMs by point, so each point's sum
  // takes the blocks in order and the gradients are the same bits for any thread count. A split
  // of the blocks over the threads would hold one accumulator and one block's V and dM per
  // thread (4 MB and 2.6 MB each for w_hh at the benchmark's first shape).
  Tensor du = at::zeros({kPoints, I, O}, at::CPU(c10::CppTypeToScalarType<T>::value));
  T* dud = du.data_ptr<T>();
  const BlockBuffers<T> buf(kPoints, block, I, O);
  T* const v = buf.v.get();
  T* const dm = buf.m.get();
  for (int64_t blk = 0; blk < tl.blocks; ++blk) {
    const int64_t t0 = blk * block, count = std::min(block, tl.tiles - t0);
    at::parallel_for(0, count, 1, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        input_tile(in, tl, t0 + j, mat, buf.scratch.mine(), v + j * I, block * I);
        output_grad_tile(dy, tl, t0 + j, mat, buf.scratch.mine(), dm + j * O, block * O);
      }
    });
    at::parallel_for(0, kPoints, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        gemm(Trans::Yes, Trans::No, I, O, count, v + k * block * I, I, dm + k * block * O, O,
             T(1), dud + k * I * O, O);
      }
    });
  }
  const Matrices& dmat = matrices(r);
  at::parallel_for(0, O, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t i = 0; i < I; ++i) {
        double u[N][N];
        for (int k = 0; k < kPoints; ++k) u[k / N][k % N] = dud[k * I * O + i * O + o];
        for (int a = 0; a < r; ++a) {  // dw[a][b] = Σ_ξν G[ξ][a] dU[ξ][ν] G[ν][b]
          double gu[N];
          for (int nu = 0; nu < N; ++nu) {
            double s = 0.;
            for (int xi = 0; xi < N; ++xi) s += dmat.G[xi][a] * u[xi][nu];
            gu[nu] = s;
          }
          for (int b = 0; b < r; ++b) {
            double s = 0.;
            for (int nu = 0; nu < N; ++nu) s += gu[nu] * dmat.G[nu][b];
            grad[((o * I + i) * r + a) * r + b] = T(s);
          }
        }
      }
    }
  });
}

template <class T>
void weight_gradient(const Frames<const T>& in, const Frames<const T>& dy, int r, T* grad) {
  if (matrices(r).n == 6) weight_gradient_tiles<6>(in, dy, r, grad);
  else weight_gradient_tiles<8>(in, dy, r, grad);
}

// [N, C, H, W] with unit channel stride, else a channels-last copy.
Tensor channels_contiguous(const Tensor& t) {
  return t.stride(1) == 1 ? t : t.contiguous(at::MemoryFormat::ChannelsLast);
}

// A [N, C, H, W] result in channels-last memory.
Tensor empty_nhwc(int64_t N, int64_t C, int64_t H, int64_t W, const at::TensorOptions& opts) {
  return at::empty({N, H, W, C}, opts).permute({0, 3, 1, 2});
}

void check_activation(const Tensor& t, int64_t channels, const char* what) {
  TORCH_CHECK(t.dim() == 4 && t.size(1) == channels && t.size(2) > 0 && t.size(3) > 0,
              "seqkernels.convlstm (Winograd): ", what, " must be [N, ", num(channels), ", H, W], got ",
              shape(t.sizes()));
}

}  // namespace

ConvAlgo conv_algo_from_env() {
  const char* env = std::getenv("SEQKERNELS_CONV_ALGO");
  const std::string algo = env ? env : "auto";
  if (algo == "auto") return ConvAlgo::kAuto;
  if (algo == "winograd") return ConvAlgo::kWinograd;
  if (algo == "direct") return ConvAlgo::kDirect;
  TORCH_CHECK(false, "SEQKERNELS_CONV_ALGO must be auto, winograd or direct, got '", algo, "'");
}

bool WinogradConv::supports(const Tensor& weight) {
  const auto dtype = weight.scalar_type();
  return (dtype == at::kFloat || dtype == at::kDouble) && weight.dim() == 4 && weight.size(2) == weight.size(3) &&
         (weight.size(2) == 3 || weight.size(2) == 5);
}

bool WinogradConv::chosen(const Tensor& weight, int64_t pixels) {
  const ConvAlgo algo = conv_algo_from_env();
  if (algo == ConvAlgo::kDirect || !supports(weight)) return false;
  if (algo == ConvAlgo::kWinograd) return true;
  // auto: where the GEMMs are wide enough to run near the BLAS's peak (measured on this
  // project's 2-core AVX2 host: docs/kernels.md, "ConvLSTM on the CPU: Winograd").
  return weight.size(0) >= 64 && weight.size(1) >= 16 && pixels >= 64;
}

WinogradConv::WinogradConv(const Tensor& weight, bool for_forward)
    : O_(weight.size(0)), I_(weight.size(1)), r_(static_cast<int>(weight.size(2))), dtype_(weight.scalar_type()),
      for_forward_(for_forward) {
  TORCH_CHECK(supports(weight),
              "seqkernels.convlstm (Winograd): needs a float32 or float64 weight with a square 3 x 3 or 5 x 5 kernel, "
              "got ", shape(weight.sizes()), " ", c10::toString(weight.scalar_type()));
  const Tensor w = weight.contiguous();
  const int64_t I = I_, r = r_;
  AT_DISPATCH_FLOATING_TYPES(dtype_, "winograd_kernel", [&] {
    const scalar_t* wd = w.data_ptr<scalar_t>();
    if (for_forward_) {
      u_ = transform_kernel<scalar_t>(I_, O_, r_, w.options(), [&](int64_t o, int64_t i, int a, int b) {
        return double(wd[((o * I + i) * r + a) * r + b]);
      });
    } else {  // w'[i][o][a][b] = w[o][i][r-1-a][r-1-b]: a convolution from O to I channels
      u_ = transform_kernel<scalar_t>(O_, I_, r_, w.options(), [&](int64_t i, int64_t o, int a, int b) {
        return double(wd[((o * I + i) * r + (r - 1 - a)) * r + (r - 1 - b)]);
      });
    }
  });
}

Tensor WinogradConv::forward(const Tensor& input, const std::optional<Tensor>& bias) const {
  TORCH_CHECK(for_forward_, "seqkernels.convlstm (Winograd): forward call of a convolution made for gradients");
  check_activation(input, I_, "the input");
  TORCH_CHECK(input.scalar_type() == dtype_, "seqkernels.convlstm (Winograd): input and weight dtypes differ");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->dim() == 1 && bias->size(0) == O_ && bias->scalar_type() == dtype_),
              "seqkernels.convlstm (Winograd): the bias must be [", num(O_), "] in the weight's dtype");
  const Tensor in = channels_contiguous(input);
  const Tensor bias_c = has_bias ? bias->contiguous() : Tensor();
  Tensor out = empty_nhwc(in.size(0), O_, in.size(2), in.size(3), in.options());
  AT_DISPATCH_FLOATING_TYPES(dtype_, "winograd_forward", [&] {
    convolve<scalar_t>(frames_of<const scalar_t>(in), u_, has_bias ? bias_c.data_ptr<scalar_t>() : nullptr, r_,
                       frames_of<scalar_t>(out));
  });
  return out;
}

Tensor WinogradConv::input_grad(const Tensor& grad_out) const {
  TORCH_CHECK(!for_forward_, "seqkernels.convlstm (Winograd): gradient call of a convolution made for forward");
  check_activation(grad_out, O_, "the output gradient");
  TORCH_CHECK(grad_out.scalar_type() == dtype_,
              "seqkernels.convlstm (Winograd): output gradient and weight dtypes differ");
  const Tensor dy = channels_contiguous(grad_out);
  Tensor dx = empty_nhwc(dy.size(0), I_, dy.size(2), dy.size(3), dy.options());
  AT_DISPATCH_FLOATING_TYPES(dtype_, "winograd_input_grad", [&] {
    convolve<scalar_t>(frames_of<const scalar_t>(dy), u_, nullptr, r_, frames_of<scalar_t>(dx));
  });
  return dx;
}

Tensor WinogradConv::weight_grad(const Tensor& grad_out, const Tensor& input) const {
  check_activation(input, I_, "the input");
  check_activation(grad_out, O_, "the output gradient");
  TORCH_CHECK(input.size(0) == grad_out.size(0) && input.size(2) == grad_out.size(2) &&
                  input.size(3) == grad_out.size(3),
              "seqkernels.convlstm (Winograd): input ", shape(input.sizes()), " and output gradient ",
              shape(grad_out.sizes()), " differ in frames or size");
  TORCH_CHECK(input.scalar_type() == dtype_ && grad_out.scalar_type() == dtype_,
              "seqkernels.convlstm (Winograd): input, output gradient and weight dtypes differ");
  const Tensor in = channels_contiguous(input), dy = channels_contiguous(grad_out);
  Tensor grad = at::empty({O_, I_, r_, r_}, in.options());
  AT_DISPATCH_FLOATING_TYPES(dtype_, "winograd_weight_grad", [&] {
    weight_gradient<scalar_t>(frames_of<const scalar_t>(in), frames_of<const scalar_t>(dy), r_,
                              grad.data_ptr<scalar_t>());
  });
  return grad;
}

}  // namespace seqkernels::cpu
