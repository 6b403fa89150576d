// Activation functions for the CPU gate kernels, as Math policies for lstm_cell.h.
//
// libm's expf/tanhf are opaque calls that stop GCC from vectorising the gate loops, and
// the gate math of a step is as costly as its GEMM at small batch. FastFloatMath is
// branch-free arithmetic (Cephes' expf: range reduction + degree-6 polynomial, ~2 ulp)
// that the compiler turns into AVX2 code (with -fno-trapping-math, as torch is built, so
// that both sides of a select may be evaluated; max rel. error: exp 8e-8, tanh 3e-7); tanh keeps full relative accuracy near zero
// through its Taylor series. float64 uses libm (accuracy first).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace seqkernels::cpu {

// The constants of FastFloatMath, shared with its 16-lane port (Avx512Math,
// lstm_persistent.h).
namespace fast_math {
constexpr float kExpMin = -87.0f, kExpMax = 88.0f;
// n = round(x / ln 2): adding 1.5 * 2^23 leaves n in the low mantissa bits, branch-free.
constexpr float kShifter = 12582912.0f;
constexpr int32_t kShifterBits = 0x4B400000;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln 2 split in two for an exact reduction
// exp(r) = 1 + r + r²·p(r) on the reduced range, p of degree 5 (Cephes' expf).
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
// tanh below kTanhSeriesBelow: x·(1 + x²·(c0 + x²·(c1 + x²·c2))), where the series beats the
// cancellation in 1 - e.
constexpr float kTanhSeriesBelow = 0.1f;
constexpr float kTanhSeries[3] = {-1.0f / 3, 2.0f / 15, -17.0f / 315};
}  // namespace fast_math

struct FastFloatMath {
  static inline float exp(float x) {
    using namespace fast_math;
    x = x < kExpMin ? kExpMin : x;
    x = x > kExpMax ? kExpMax : x;
    const float shifted = x * kLog2e + kShifter;
    const float n = shifted - kShifter;
    float r = x - n * kLn2Hi;
    r = r - n * kLn2Lo;
    float p = kExpPoly[0];
    p = p * r + kExpPoly[1];
    p = p * r + kExpPoly[2];
    p = p * r + kExpPoly[3];
    p = p * r + kExpPoly[4];
    p = p * r + kExpPoly[5];
    const float y = p * r * r + r + 1.0f;
    int32_t shifted_bits;
    std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
    const int32_t scale_bits = (shifted_bits - kShifterBits + 127) << 23;  // 2^n, n in [-126, 127]
    float scale;
    std::memcpy(&scale, &scale_bits, sizeof(scale));
    return y * scale;
  }
  static inline float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }
  static inline float tanh(float x) {
    using namespace fast_math;
    const float ax = std::fabs(x);
    const float e = exp(-2.0f * ax);
    const float big = (1.0f - e) / (1.0f + e);
    const float x2 = x * x;
    const float series = ax * (1.0f + x2 * (kTanhSeries[0] + x2 * (kTanhSeries[1] + x2 * kTanhSeries[2])));
    return std::copysign(ax < kTanhSeriesBelow ? series : big, x);
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
