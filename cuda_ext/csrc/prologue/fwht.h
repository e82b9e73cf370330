// The orthonormal Walsh–Hadamard transform: its schema, checks and prologue (prologue/common.h).
#pragma once

#include "common.h"

namespace kvstats {

inline void define_fwht_ops(torch::Library& m) {
  // Orthonormal Walsh–Hadamard transform along the last axis: y = x · H_d / sqrt(d).
  m.def("fwht(Tensor x) -> Tensor");
}

inline void check_fwht_input(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.dim() >= 1, "fwht: x must have at least one dimension, got a 0-d tensor");
  TORCH_CHECK_TYPE(is_float_dtype(x.scalar_type()), "fwht: x must be float16, bfloat16, float32 or float64, got ",
              x.scalar_type());
  const int64_t d = x.size(-1);
  TORCH_CHECK_VALUE(d >= 2 && d <= kMaxFwhtDim && (d & (d - 1)) == 0,
              "fwht: the last dimension must be a power of two in [2, ", kMaxFwhtDim, "], got ", d);
}

// x contiguous, read as rows [rows, d]; y its transform, x's shape and dtype.
struct FwhtArgs {
  at::Tensor x, y;
  int64_t d = 0, rows = 0;
};

inline FwhtArgs fwht_prologue(const at::Tensor& x) {
  check_fwht_input(x);
  FwhtArgs a;
  a.x = x.contiguous();
  a.y = at::empty_like(a.x, at::MemoryFormat::Contiguous);
  a.d = a.x.size(-1);
  a.rows = a.x.numel() / a.d;
  return a;
}

}  // namespace kvstats
