// Numbers and shapes for error messages, formatted without std::ostream.
//
// Why: in the extension as built on our H200 machine (torch 2.11, GCC 13.3, 2026-11-21),
// streaming an integer into the ostringstream that TORCH_CHECK builds its message in
// segfaults inside libstdc++'s numeric insertion (std::ostream::_M_insert<long>, called
// through a copy of it inside _C.so), while streaming strings works; CPU builds here are
// unaffected and the root cause is not found yet. Checks therefore hand TORCH_CHECK
// strings: std::to_string uses neither a stream nor a locale.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace seqkernels {

inline std::string num(int64_t value) { return std::to_string(value); }

// "[2, 3, 4]", as torch prints sizes.
inline std::string shape(c10::IntArrayRef dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(dims[i]);
  }
  return out + "]";
}

}  // namespace seqkernels
