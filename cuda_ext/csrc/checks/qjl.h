// Input checks of the ops of the QJL sketch, shared by every backend (checks/common.h).
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "common.h"

namespace kvstats {

inline void check_qjl_encode_input(const at::Tensor& x, const at::Tensor& sketch) {
  TORCH_CHECK_VALUE(x.dim() == 2, "qjl_encode: x must be [N, d], got ", x.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(x.scalar_type()), "qjl_encode: x must be a float tensor, got ", x.scalar_type());
  check_same_device(x, sketch, "qjl_encode", "sketch");
  TORCH_CHECK_VALUE(sketch.dim() == 2 && sketch.size(1) == x.size(1), "qjl_encode: sketch must be [m, ", x.size(1),
              "], got ", sketch.sizes());
  TORCH_CHECK_TYPE(sketch.scalar_type() == acc_dtype_of(x), "qjl_encode: sketch must be ", acc_dtype_of(x), ", got ",
              sketch.scalar_type());
}

inline void check_qjl_scores_input(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm) {
  TORCH_CHECK_VALUE(q_sketch.dim() == 3, "qjl_scores: q_sketch must be [G, n_q, m], got ", q_sketch.sizes());
  TORCH_CHECK_TYPE(q_sketch.scalar_type() == at::kFloat || q_sketch.scalar_type() == at::kDouble,
              "qjl_scores: q_sketch must be float32 or float64, got ", q_sketch.scalar_type());
  check_packed(packed, 3, 1, q_sketch.size(2), "qjl_scores");
  check_same_device(q_sketch, packed, "qjl_scores", "packed");
  check_same_device(q_sketch, norm, "qjl_scores", "norm");
  TORCH_CHECK_VALUE(packed.size(0) == q_sketch.size(0), "qjl_scores: packed.size(0) must equal q_sketch.size(0) = ",
              q_sketch.size(0), ", got ", packed.size(0));
  TORCH_CHECK_VALUE(norm.dim() == 2 && norm.size(0) == packed.size(0) && norm.size(1) == packed.size(1),
              "qjl_scores: norm must be [G, n_k] = ", packed.sizes().slice(0, 2), ", got ", norm.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(norm.scalar_type()), "qjl_scores: norm must be a float tensor, got ", norm.scalar_type());
}

inline void check_qjl_weighted_sum_input(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm,
                                         int64_t m) {
  TORCH_CHECK_VALUE(m >= 1, "qjl_weighted_sum: m must be >= 1, got ", m);
  check_weighted_keys(w, packed, norm, norm.sizes(), 1, m, "qjl_weighted_sum", "norm");
}

}  // namespace kvstats
