// The circulant ("wave") ConvRNN on the CPU: convrnn_forward / convrnn_backward (schemas
// in csrc/registration.cpp, input checks in csrc/convrnn_checks.cpp).
//
// Shape legend: B batch, T steps, C channels, N ring size, K kernel width; L = K/2 and
// R = K-1-L are the left and right padding, Np = N + K - 1 the padded ring.
//
// Both directions are one primitive, a padded cross-correlation of a [C, N] state:
//   out[o, n] += sum_i sum_k W[o, i, k] * pad(in)[i, n + k]
// Forward: W = weight, pad(h) with L values on the left (circular wrap or zeros), and
//   h_t = act(x_t + bias + conv(h_{t-1})), one fused pass per step: each register tile of
//   outputs starts from x + bias, accumulates all C * K taps, and is activated and stored
//   (state and y) before the next tile (forward_tile).
// Backward: the adjoint of conv is the same correlation with W^T[i, o, k] = W[o, i, K-1-k]
//   and the padding sides swapped (R on the left). In reverse time,
//   g_t = (grad_y_t + carry) * act'(y_t) is grad_x_t, carry <- conv^T(g_t), and the weight
//   and bias gradients accumulate sum_n g_t[o, n] * pad(h_{t-1})[i, n + k] per sequence.
//
// Each sequence (b) runs its whole time loop on one thread: at::parallel_for splits the
// batch. The state lives in a per-chunk scratch buffer in float (double for float64), so
// half types are rounded only where they are stored (y, grad_x). Per-sequence weight and
// bias gradients are summed over b in a fixed order after the loop: the result does not
// depend on the number of threads. Nothing inside a time loop allocates or dispatches.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_checks.h"
#include "seqkernels/convrnn_checks.h"
#include "vec_math.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace seqkernels::cpu {
namespace {

using at::Tensor;

// Ask Linux for transparent huge pages on the 2 MiB-aligned interior of a large, freshly
// allocated output before it is first written (what torch's THP_MEM_ALLOC_ENABLE=1 does for
// every large CPU allocation). A [B, T, C, N] output of tens of MB otherwise costs one page
// fault per 4 KiB on first touch, as much time as the whole forward pass; with THP in its
// default "madvise" mode the hint cuts that to one fault per 2 MiB. A hint only: errors are
// ignored and nothing changes where THP is off or on other systems.
void advise_huge_pages(const Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const size_t bytes = t.nbytes();
  if (bytes < 4 * kHuge) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t lo = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hi = (begin + bytes) & ~(kHuge - 1);
  if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

// Sequences per parallel chunk: a chunk gets at least ~2^18 multiply-adds of work, so tiny
// problems do not pay the thread start-up for nothing.
int64_t batch_grain(const ConvRnnSizes& s) {
  const int64_t per_seq = std::max<int64_t>(1, s.T * s.C * s.C * s.K * s.N);
  return std::max<int64_t>(1, (int64_t(1) << 18) / per_seq);
}

// Fill the K-1 padding entries of each of the C rows of a padded ring buffer [C, Np] whose
// interior [lpad, lpad + N) holds the state: wrap around the ring, or zeros.
template <class acc_t>
inline void fill_pads(acc_t* buf, int64_t C, int64_t N, int64_t Np, int64_t lpad, bool circular) {
  const int64_t rpad = Np - N - lpad;
  for (int64_t c = 0; c < C; ++c) {
    acc_t* row = buf + c * Np;
    for (int64_t j = 0; j < lpad; ++j) row[j] = circular ? row[lpad + N - lpad + j] : acc_t(0);
    for (int64_t j = 0; j < rpad; ++j) row[lpad + N + j] = circular ? row[lpad + j] : acc_t(0);
  }
}

// A 32-byte SIMD vector of acc_t (GCC/Clang vector extension: AVX2 registers here, two
// SSE/NEON registers elsewhere); loads and stores are unaligned memcpy's.
template <class acc_t>
struct Simd;
template <>
struct Simd<float> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct Simd<double> {
  typedef double type __attribute__((vector_size(32)));
};

// out_o[n0 + j] += sum_i sum_k w_o[i, k] * in[i, n0 + j + k] for j < R * lanes: a register
// tile of R vectors, accumulated over all C * K taps before it is stored once.
// acc[r] += sum_i sum_k w_o[i, k] * in[i, n0 + k + r * lanes ..]: the ring correlation of
// R vectors of outputs, shared by the forward tile and correlate_tile.
//   w_o: [C, K] weights of one output channel; in: [C, Np] padded state, Np = N + K - 1
template <int R, class acc_t, class V>
inline void accumulate_taps(V (&acc)[R], const acc_t* __restrict__ w_o, const acc_t* __restrict__ in, int64_t n0,
                            int64_t C, int64_t K, int64_t Np) {
  constexpr int kLanes = sizeof(V) / sizeof(acc_t);
  for (int64_t i = 0; i < C; ++i) {
    const acc_t* __restrict__ in_i = in + i * Np + n0;
    for (int64_t k = 0; k < K; ++k) {
      const acc_t wk = w_o[i * K + k];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        V v;
        std::memcpy(&v, in_i + k + r * kLanes, sizeof(V));
        acc[r] += wk * v;
      }
    }
  }
}

template <int R, class acc_t>
inline void correlate_tile(const acc_t* __restrict__ w_o, const acc_t* __restrict__ in, acc_t* __restrict__ out_o,
                           int64_t n0, int64_t C, int64_t K, int64_t Np) {
  using V = typename Simd<acc_t>::type;
  constexpr int kLanes = sizeof(V) / sizeof(acc_t);
  V acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) std::memcpy(&acc[r], out_o + n0 + r * kLanes, sizeof(V));
  accumulate_taps<R>(acc, w_o, in, n0, C, K, Np);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) std::memcpy(out_o + n0 + r * kLanes, &acc[r], sizeof(V));
}

// The scalar tail: one output.
template <class acc_t>
inline void correlate_one(const acc_t* __restrict__ w_o, const acc_t* __restrict__ in, acc_t* __restrict__ out_o,
                          int64_t n, int64_t C, int64_t K, int64_t Np) {
  acc_t acc = out_o[n];
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t k = 0; k < K; ++k) acc += w_o[i * K + k] * in[i * Np + n + k];
  }
  out_o[n] = acc;
}

// out[o, n] += sum_i sum_k w[o, i, k] * in[i, n + k] for o < C, n < N.
//   w: [C, C, K]; in: [C, Np] padded rows; out: [C, N] with row stride ldo
template <class acc_t>
inline void ring_correlate(const acc_t* __restrict__ w, const acc_t* __restrict__ in, acc_t* __restrict__ out,
                           int64_t C, int64_t N, int64_t K, int64_t Np, int64_t ldo) {
  constexpr int kLanes = sizeof(typename Simd<acc_t>::type) / sizeof(acc_t);
  constexpr int kWide = 4;  // vectors per tile in the main loop
  for (int64_t o = 0; o < C; ++o) {
    const acc_t* __restrict__ w_o = w + o * C * K;
    acc_t* __restrict__ out_o = out + o * ldo;
    int64_t n0 = 0;
    for (; n0 + kWide * kLanes <= N; n0 += kWide * kLanes) correlate_tile<kWide>(w_o, in, out_o, n0, C, K, Np);
    for (; n0 + kLanes <= N; n0 += kLanes) correlate_tile<1>(w_o, in, out_o, n0, C, K, Np);
    for (; n0 < N; ++n0) correlate_one(w_o, in, out_o, n0, C, K, Np);
  }
}

// lanes += a[n] * b[n] over the whole vectors of [0, n) (lane-wise, in a fixed order);
// returns the scalar sum of the tail. lanes is a SIMD vector kept across calls, reduced
// once at the end: deterministic, and no horizontal sum per call.
template <class acc_t>
inline acc_t dot_accumulate(const acc_t* __restrict__ a, const acc_t* __restrict__ b, int64_t n,
                            typename Simd<acc_t>::type& lanes) {
  using V = typename Simd<acc_t>::type;
  constexpr int kLanes = sizeof(V) / sizeof(acc_t);
  V acc0 = lanes, acc1 = {};
  int64_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) {
    V a0, a1, b0, b1;
    std::memcpy(&a0, a + j, sizeof(V));
    std::memcpy(&b0, b + j, sizeof(V));
    std::memcpy(&a1, a + j + kLanes, sizeof(V));
    std::memcpy(&b1, b + j + kLanes, sizeof(V));
    acc0 += a0 * b0;
    acc1 += a1 * b1;
  }
  for (; j + kLanes <= n; j += kLanes) {
    V a0, b0;
    std::memcpy(&a0, a + j, sizeof(V));
    std::memcpy(&b0, b + j, sizeof(V));
    acc0 += a0 * b0;
  }
  lanes = acc0 + acc1;
  acc_t tail = 0;
  for (; j < n; ++j) tail += a[j] * b[j];
  return tail;
}

// lanes += a[n] over the whole vectors of [0, n); returns the scalar sum of the tail.
template <class acc_t>
inline acc_t sum_accumulate(const acc_t* __restrict__ a, int64_t n, typename Simd<acc_t>::type& lanes) {
  using V = typename Simd<acc_t>::type;
  constexpr int kLanes = sizeof(V) / sizeof(acc_t);
  V acc = lanes;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    V a0;
    std::memcpy(&a0, a + j, sizeof(V));
    acc += a0;
  }
  lanes = acc;
  acc_t tail = 0;
  for (; j < n; ++j) tail += a[j];
  return tail;
}

template <class acc_t>
inline acc_t horizontal_sum(const typename Simd<acc_t>::type& v) {
  constexpr int kLanes = sizeof(v) / sizeof(acc_t);
  acc_t s = 0;
  for (int l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

template <class acc_t, bool kRelu>
inline acc_t activate(acc_t v) {
  if constexpr (kRelu) {
    return v < acc_t(0) ? acc_t(0) : v;  // NaN propagates, as in torch.relu
  } else {
    return CpuMath<acc_t>::type::tanh(v);
  }
}

// act'(pre) from y = act(pre): 1 - y^2 (tanh) or y > 0 (relu).
template <class acc_t, bool kRelu>
inline acc_t activate_grad(acc_t y) {
  if constexpr (kRelu) {
    return y > acc_t(0) ? acc_t(1) : acc_t(0);
  } else {
    return acc_t(1) - y * y;
  }
}

// One forward tile of a step: outputs n0 .. n0 + R * lanes of channel o, fused:
//   pre = x_t[o, n] + bias[o] + sum_i sum_k w[o, i, k] * cur[i, n + k]   (register tile)
//   h = act(pre) -> next_o[n] (the next state, float) and y_o[n] (the output, scalar_t)
//   w_o: [C, K] row o of the weight; cur: [C, Np] padded state h_{t-1}
template <int R, bool kRelu, class scalar_t, class acc_t>
inline void forward_tile(const acc_t* __restrict__ w_o, const acc_t* __restrict__ cur, const scalar_t* __restrict__ x_o,
                         acc_t bias_o, acc_t* __restrict__ next_o, scalar_t* __restrict__ y_o, int64_t n0, int64_t C,
                         int64_t K, int64_t Np) {
  using V = typename Simd<acc_t>::type;
  constexpr int kLanes = sizeof(V) / sizeof(acc_t);
  constexpr int kWidth = R * kLanes;
  acc_t buf[kWidth];
  for (int j = 0; j < kWidth; ++j) buf[j] = static_cast<acc_t>(x_o[n0 + j]) + bias_o;
  V acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) std::memcpy(&acc[r], buf + r * kLanes, sizeof(V));
  accumulate_taps<R>(acc, w_o, cur, n0, C, K, Np);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) std::memcpy(buf + r * kLanes, &acc[r], sizeof(V));
  for (int j = 0; j < kWidth; ++j) {
    const acc_t h = activate<acc_t, kRelu>(buf[j]);
    next_o[n0 + j] = h;
    y_o[n0 + j] = static_cast<scalar_t>(h);
  }
}

// Forward over sequences [b0, b1).
//   x [B, T, C, N]; w [C, C, K] (acc_t); bias [C] (acc_t) or null; h0 [B, C, N]
//   y [B, T, C, N] out; h_T [B, C, N] out
template <class scalar_t, bool kRelu>
void forward_sequences(const ConvRnnSizes& s, int64_t b0, int64_t b1, const scalar_t* x,
                       const at::opmath_type<scalar_t>* w, const at::opmath_type<scalar_t>* bias, const scalar_t* h0,
                       scalar_t* y, scalar_t* h_T) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t T = s.T, C = s.C, N = s.N, K = s.K, L = K / 2, Np = N + K - 1, CN = C * N;
  constexpr int kLanes = sizeof(typename Simd<acc_t>::type) / sizeof(acc_t);
  constexpr int kWide = 4;  // vectors per tile in the main loop
  std::vector<acc_t> scratch(2 * C * Np, acc_t(0));  // h_{t-1} and h_t, padded
  acc_t* cur = scratch.data();
  acc_t* next = cur + C * Np;
  for (int64_t b = b0; b < b1; ++b) {
    const scalar_t* h0_b = h0 + b * CN;
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t n = 0; n < N; ++n) cur[c * Np + L + n] = static_cast<acc_t>(h0_b[c * N + n]);
    }
    fill_pads(cur, C, N, Np, L, s.circular);
    for (int64_t t = 0; t < T; ++t) {
      const scalar_t* x_t = x + (b * T + t) * CN;
      scalar_t* y_t = y + (b * T + t) * CN;
      for (int64_t o = 0; o < C; ++o) {
        const acc_t* w_o = w + o * C * K;
        const scalar_t* x_o = x_t + o * N;
        scalar_t* y_o = y_t + o * N;
        acc_t* next_o = next + o * Np + L;  // interior of the next state's row o
        const acc_t bias_o = bias ? bias[o] : acc_t(0);
        int64_t n0 = 0;
        for (; n0 + kWide * kLanes <= N; n0 += kWide * kLanes) {
          forward_tile<kWide, kRelu>(w_o, cur, x_o, bias_o, next_o, y_o, n0, C, K, Np);
        }
        for (; n0 + kLanes <= N; n0 += kLanes) {
          forward_tile<1, kRelu>(w_o, cur, x_o, bias_o, next_o, y_o, n0, C, K, Np);
        }
        for (; n0 < N; ++n0) {  // the scalar tail
          acc_t pre = static_cast<acc_t>(x_o[n0]) + bias_o;
          for (int64_t i = 0; i < C; ++i) {
            for (int64_t k = 0; k < K; ++k) pre += w_o[i * K + k] * cur[i * Np + n0 + k];
          }
          const acc_t h = activate<acc_t, kRelu>(pre);
          next_o[n0] = h;
          y_o[n0] = static_cast<scalar_t>(h);
        }
      }
      fill_pads(next, C, N, Np, L, s.circular);
      std::swap(cur, next);
    }
    scalar_t* hT_b = h_T + b * CN;
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t n = 0; n < N; ++n) hT_b[c * N + n] = static_cast<scalar_t>(cur[c * Np + L + n]);
    }
  }
}

// Backward over sequences [b0, b1).
//   grad_y [B, T, C, N]; grad_h_T [B, C, N]; wT [C, C, K] (acc_t, transposed and flipped);
//   h0 [B, C, N]; y [B, T, C, N]
//   grad_x [B, T, C, N] out; grad_h0 [B, C, N] out;
//   dw_seq [B, C, C, K] and db_seq [B, C] (acc_t) out: each sequence's weight/bias gradient
template <class scalar_t, bool kRelu>
void backward_sequences(const ConvRnnSizes& s, int64_t b0, int64_t b1, const scalar_t* grad_y, const scalar_t* grad_h_T,
                        const at::opmath_type<scalar_t>* wT, const scalar_t* h0, const scalar_t* y, scalar_t* grad_x,
                        scalar_t* grad_h0, at::opmath_type<scalar_t>* dw_seq, at::opmath_type<scalar_t>* db_seq) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t T = s.T, C = s.C, N = s.N, K = s.K, L = K / 2, R = K - 1 - L, Np = N + K - 1, CN = C * N;
  const int64_t CCK = C * C * K;
  using V = typename Simd<acc_t>::type;
  std::vector<acc_t> scratch(2 * C * Np + CN, acc_t(0));
  std::vector<V> dw_lanes(CCK);  // per-lane partial sums of the sequence's weight gradient
  std::vector<V> db_lanes(C);    // and of its bias gradient
  acc_t* gpad = scratch.data();      // [C, Np]: g_t with R on the left (the adjoint's padding)
  acc_t* hpad = gpad + C * Np;       // [C, Np]: h_{t-1} with L on the left (the forward's)
  acc_t* carry = hpad + C * Np;      // [C, N]: dL/dh_t through the recurrence
  for (int64_t b = b0; b < b1; ++b) {
    acc_t* dw = dw_seq + b * CCK;
    acc_t* db = db_seq + b * C;
    std::fill(dw, dw + CCK, acc_t(0));
    std::fill(dw_lanes.begin(), dw_lanes.end(), V{});
    std::fill(db_lanes.begin(), db_lanes.end(), V{});
    std::fill(db, db + C, acc_t(0));
    const scalar_t* ghT = grad_h_T + b * CN;
    for (int64_t j = 0; j < CN; ++j) carry[j] = static_cast<acc_t>(ghT[j]);
    for (int64_t t = T - 1; t >= 0; --t) {
      const int64_t row = (b * T + t) * CN;
      const scalar_t* gy_t = grad_y + row;
      const scalar_t* y_t = y + row;
      scalar_t* gx_t = grad_x + row;
      for (int64_t c = 0; c < C; ++c) {
        acc_t* g = gpad + c * Np + R;
        for (int64_t n = 0; n < N; ++n) {
          const int64_t j = c * N + n;
          const acc_t v = (static_cast<acc_t>(gy_t[j]) + carry[j]) *
                          activate_grad<acc_t, kRelu>(static_cast<acc_t>(y_t[j]));
          g[n] = v;
          gx_t[j] = static_cast<scalar_t>(v);
        }
        db[c] += sum_accumulate(g, N, db_lanes[c]);
      }
      fill_pads(gpad, C, N, Np, R, s.circular);
      // h_{t-1}: y_{t-1}, or h0 at the first step.
      const scalar_t* hprev = t > 0 ? y + row - CN : h0 + b * CN;
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t n = 0; n < N; ++n) hpad[c * Np + L + n] = static_cast<acc_t>(hprev[c * N + n]);
      }
      fill_pads(hpad, C, N, Np, L, s.circular);
      for (int64_t o = 0; o < C; ++o) {
        const acc_t* g_o = gpad + o * Np + R;
        for (int64_t i = 0; i < C; ++i) {
          for (int64_t k = 0; k < K; ++k) {
            const int64_t j = (o * C + i) * K + k;
            dw[j] += dot_accumulate(g_o, hpad + i * Np + k, N, dw_lanes[j]);
          }
        }
      }
      std::fill(carry, carry + CN, acc_t(0));
      ring_correlate(wT, gpad, carry, C, N, K, Np, N);
    }
    for (int64_t j = 0; j < CCK; ++j) dw[j] += horizontal_sum<acc_t>(dw_lanes[j]);
    for (int64_t c = 0; c < C; ++c) db[c] += horizontal_sum<acc_t>(db_lanes[c]);
    scalar_t* gh0 = grad_h0 + b * CN;
    for (int64_t j = 0; j < CN; ++j) gh0[j] = static_cast<scalar_t>(carry[j]);
  }
}

at::ScalarType acc_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

std::tuple<Tensor, Tensor> convrnn_forward_cpu(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                                               const Tensor& h0, int64_t padding_mode, int64_t nonlinearity) {
  const ConvRnnSizes s = check_convrnn_forward(x, weight, bias, h0, padding_mode, nonlinearity);
  check_cpu(x, "seqkernels.convrnn");
  const auto acc = acc_dtype(x.scalar_type());
  Tensor y = at::empty({s.B, s.T, s.C, s.N}, x.options());
  advise_huge_pages(y);
  Tensor h_T = at::empty({s.B, s.C, s.N}, x.options());
  Tensor w_acc = weight.to(acc).contiguous();
  Tensor b_acc = s.has_bias ? bias->to(acc).contiguous() : Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "seqkernels_convrnn_forward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* x_p = x.const_data_ptr<scalar_t>();
    const acc_t* w_p = w_acc.const_data_ptr<acc_t>();
    const acc_t* b_p = s.has_bias ? b_acc.const_data_ptr<acc_t>() : nullptr;
    const scalar_t* h0_p = h0.const_data_ptr<scalar_t>();
    scalar_t* y_p = y.data_ptr<scalar_t>();
    scalar_t* hT_p = h_T.data_ptr<scalar_t>();
    at::parallel_for(0, s.B, batch_grain(s), [&](int64_t b0, int64_t b1) {
      if (s.relu) {
        forward_sequences<scalar_t, true>(s, b0, b1, x_p, w_p, b_p, h0_p, y_p, hT_p);
      } else {
        forward_sequences<scalar_t, false>(s, b0, b1, x_p, w_p, b_p, h0_p, y_p, hT_p);
      }
    });
  });
  return {y, h_T};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> convrnn_backward_cpu(const Tensor& grad_y, const Tensor& grad_h_T,
                                                                const Tensor& weight, const Tensor& h0, const Tensor& y,
                                                                int64_t padding_mode, int64_t nonlinearity,
                                                                bool has_bias) {
  const ConvRnnSizes s = check_convrnn_backward(grad_y, grad_h_T, weight, h0, y, padding_mode, nonlinearity, has_bias);
  check_cpu(y, "seqkernels.convrnn");
  const auto dtype = y.scalar_type();
  const auto acc = acc_dtype(dtype);
  const auto opts = y.options();
  Tensor grad_x = at::empty({s.B, s.T, s.C, s.N}, opts);
  advise_huge_pages(grad_x);
  Tensor grad_h0 = at::empty({s.B, s.C, s.N}, opts);
  // W^T[i, o, k] = W[o, i, K-1-k]: the adjoint correlation's weight.
  Tensor wT = weight.to(acc).flip({2}).transpose(0, 1).contiguous();
  Tensor dw_seq = at::empty({s.B, s.C, s.C, s.K}, opts.dtype(acc));
  Tensor db_seq = at::empty({s.B, s.C}, opts.dtype(acc));
  // The incoming gradients may have any layout (an expanded one from a sum): the loop reads dense rows.
  const c10::MaybeOwned<Tensor> grad_y_dense = grad_y.expect_contiguous();
  const c10::MaybeOwned<Tensor> grad_h_T_dense = grad_h_T.expect_contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "seqkernels_convrnn_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* gy_p = grad_y_dense->const_data_ptr<scalar_t>();
    const scalar_t* ghT_p = grad_h_T_dense->const_data_ptr<scalar_t>();
    const acc_t* wT_p = wT.const_data_ptr<acc_t>();
    const scalar_t* h0_p = h0.const_data_ptr<scalar_t>();
    const scalar_t* y_p = y.const_data_ptr<scalar_t>();
    scalar_t* gx_p = grad_x.data_ptr<scalar_t>();
    scalar_t* gh0_p = grad_h0.data_ptr<scalar_t>();
    acc_t* dw_p = dw_seq.data_ptr<acc_t>();
    acc_t* db_p = db_seq.data_ptr<acc_t>();
    at::parallel_for(0, s.B, batch_grain(s), [&](int64_t b0, int64_t b1) {
      if (s.relu) {
        backward_sequences<scalar_t, true>(s, b0, b1, gy_p, ghT_p, wT_p, h0_p, y_p, gx_p, gh0_p, dw_p, db_p);
      } else {
        backward_sequences<scalar_t, false>(s, b0, b1, gy_p, ghT_p, wT_p, h0_p, y_p, gx_p, gh0_p, dw_p, db_p);
      }
    });
  });
  // Sum the per-sequence gradients over b in a fixed order (b = 0, 1, ...): deterministic,
  // whatever the number of threads.
  auto reduce_b = [&](const Tensor& per_seq) {
    const int64_t width = per_seq.numel() / s.B;
    Tensor total = at::zeros({width}, opts.dtype(acc));
    AT_DISPATCH_FLOATING_TYPES(acc, "seqkernels_convrnn_reduce_cpu", [&] {
      const scalar_t* src = per_seq.const_data_ptr<scalar_t>();
      scalar_t* dst = total.data_ptr<scalar_t>();
      for (int64_t b = 0; b < s.B; ++b) {
        for (int64_t j = 0; j < width; ++j) dst[j] += src[b * width + j];
      }
    });
    return total.to(dtype);
  };
  Tensor grad_weight = reduce_b(dw_seq).view({s.C, s.C, s.K});
  Tensor grad_bias = has_bias ? reduce_b(db_seq) : at::empty({0}, opts);
  return {grad_x, grad_weight, grad_bias, grad_h0};
}

}  // namespace

TORCH_LIBRARY_IMPL(seqkernels, CPU, m) {
  m.impl("convrnn_forward", &convrnn_forward_cpu);
  m.impl("convrnn_backward", &convrnn_backward_cpu);
}

}  // namespace seqkernels::cpu
