// Checks every CPU kernel makes before touching memory.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace seqkernels::cpu {

// x is on the CPU, and this CPU runs the instructions the extension was built for
// (x86-64 builds target AVX2 + FMA: see setup.py).
inline void check_cpu(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.device().is_cpu(), op, ": CPU kernel called with a tensor on ", x.device());
#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))
  TORCH_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
              "seqkernels was built for x86-64 with AVX2 and FMA, which this CPU lacks");
#endif
}

}  // namespace seqkernels::cpu
