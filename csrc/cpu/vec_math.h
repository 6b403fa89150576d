// Activation functions for the CPU gate kernels, as Math policies for lstm_cell.h.
//
// libm's expf/tanhf are opaque calls that stop GCC from vectorising the gate loops, and
// the gate math of a step is as costly as its GEMM at small batch. FastFloatMath is
// branch-free arithmetic (Cephes' expf: range reduction + degree-6 polynomial, ~2 ulp)
// that the compiler turns into AVX2 code; tanh keeps full relative accuracy near zero
// through its Taylor series. float64 uses libm (accuracy first).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace seqkernels::cpu {

struct FastFloatMath {
  static inline float exp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    // n = round(x / ln 2) (truncation of a shifted value vectorises, unlike nearbyint).
    const int32_t n = static_cast<int32_t>(x * 1.44269504088896341f + (x >= 0.f ? 0.5f : -0.5f));
    const float nf = static_cast<float>(n);
    float r = x - nf * 0.693359375f;  // ln 2 split in two for an exact reduction
    r = r - nf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;
    const int32_t bits = (n + 127) << 23;  // 2^n, n in [-126, 127]
    float scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    return y * scale;
  }
  static inline float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }
  static inline float tanh(float x) {
    const float ax = x < 0.f ? -x : x;
    const float e = exp(-2.0f * ax);
    const float big = (1.0f - e) / (1.0f + e);
    const float x2 = x * x;  // below 0.1 the series beats the cancellation in 1 - e
    const float series = ax * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315))));
    const float t = ax < 0.1f ? series : big;
    return x < 0.f ? -t : t;
  }
};

struct StdMath {
  template <class V>
  static inline V sigmoid(V x) {
    return V(1) / (V(1) + std::exp(-x));
  }
  template <class V>
  static inline V tanh(V x) {
    return std::tanh(x);
  }
};

template <class acc_t>
struct CpuMath;
template <>
struct CpuMath<float> {
  using type = FastFloatMath;
};
template <>
struct CpuMath<double> {
  using type = StdMath;
};

}  // namespace seqkernels::cpu
