// Argument checks shared by the operators' validation code (csrc/*_checks.cpp). Each raises
// RuntimeError through TORCH_CHECK with the operator's name, before any data is touched.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "seqkernels/error_format.h"

namespace seqkernels {

inline bool is_floating_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// t is defined, on ref's device, of ref's dtype, exactly `shape` (no broadcasting) and, unless
// the kernel reads any layout (`contiguous` false), contiguous.
inline void check_tensor_like(const char* op, const at::Tensor& ref, const char* ref_name, const at::Tensor& t,
                              const char* name, at::IntArrayRef shape, bool contiguous = true) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " is on ", t.device(), " but ", ref_name, " is on ",
              ref.device());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " has dtype ", t.scalar_type(), " but ", ref_name,
              " has dtype ", ref.scalar_type());
  TORCH_CHECK(t.sizes() == shape, op, ": ", name, " must have shape ", seqkernels::shape(shape), ", got ",
              seqkernels::shape(t.sizes()));
  TORCH_CHECK(!contiguous || t.is_contiguous(), op, ": ", name, " must be contiguous");
}

}  // namespace seqkernels
