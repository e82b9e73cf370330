// Input checks of the ops of the orthonormal Walsh–Hadamard transform, shared by every backend (checks/common.h).
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "common.h"

namespace kvstats {

inline void check_fwht_input(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.dim() >= 1, "fwht: x must have at least one dimension, got a 0-d tensor");
  TORCH_CHECK_TYPE(is_float_dtype(x.scalar_type()), "fwht: x must be float16, bfloat16, float32 or float64, got ",
              x.scalar_type());
  const int64_t d = x.size(-1);
  TORCH_CHECK_VALUE(d >= 2 && d <= kMaxFwhtDim && (d & (d - 1)) == 0,
              "fwht: the last dimension must be a power of two in [2, ", kMaxFwhtDim, "], got ", d);
}

}  // namespace kvstats
