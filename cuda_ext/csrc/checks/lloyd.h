// Input checks of the ops of rotation + Lloyd–Max (lloyd, turbo_mse), shared by every backend (checks/common.h).
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "common.h"

namespace kvstats {

inline void check_lloyd_encode_input(const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds,
                                     int64_t bits) {
  check_bits(bits, "lloyd_encode");
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) >= 2, "lloyd_encode: x must be [N, d] with d >= 2, got ", x.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(x.scalar_type()), "lloyd_encode: x must be a float tensor, got ", x.scalar_type());
  check_rotation_signs(x, signs, x.size(1), acc_dtype_of(x), "lloyd_encode");
  check_table(x, thresholds, (int64_t{1} << bits) - 1, "lloyd_encode", "thresholds");
}

inline void check_lloyd_decode_input(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                                     const at::Tensor& levels, int64_t bits, int64_t d) {
  check_bits(bits, "lloyd_decode");
  TORCH_CHECK_VALUE(d >= 2, "lloyd_decode: d must be >= 2, got ", d);
  check_packed(packed, 2, bits, d, "lloyd_decode");
  check_same_device(packed, norm, "lloyd_decode", "norm");
  TORCH_CHECK_VALUE(norm.dim() == 1 && norm.size(0) == packed.size(0), "lloyd_decode: norm must be [", packed.size(0),
              "], got ", norm.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(norm.scalar_type()), "lloyd_decode: norm must be a float tensor, got ", norm.scalar_type());
  TORCH_CHECK_TYPE(levels.scalar_type() == at::kFloat || levels.scalar_type() == at::kDouble,
              "lloyd_decode: levels must be float32 or float64, got ", levels.scalar_type());
  check_same_device(packed, levels, "lloyd_decode", "levels");
  TORCH_CHECK_VALUE(levels.dim() == 1 && levels.size(0) == (int64_t{1} << bits), "lloyd_decode: levels must have ",
              (int64_t{1} << bits), " entries, got ", levels.sizes());
  check_rotation_signs(packed, signs, d, levels.scalar_type(), "lloyd_decode");
}

inline void check_lloyd_scores_input(const at::Tensor& q, const at::Tensor& packed, const at::Tensor& norm,
                                     const at::Tensor& levels, int64_t bits) {
  check_bits(bits, "lloyd_scores");
  TORCH_CHECK_VALUE(q.dim() == 3, "lloyd_scores: q must be [G, n_q, d], got ", q.sizes());
  TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "lloyd_scores: q must be float32 or float64, got ", q.scalar_type());
  check_packed(packed, 3, bits, q.size(2), "lloyd_scores");
  check_same_device(q, packed, "lloyd_scores", "packed");
  check_same_device(q, norm, "lloyd_scores", "norm");
  TORCH_CHECK_VALUE(packed.size(0) == q.size(0), "lloyd_scores: packed.size(0) must equal q.size(0) = ", q.size(0),
              ", got ", packed.size(0));
  TORCH_CHECK_VALUE(norm.dim() == 2 && norm.size(0) == packed.size(0) && norm.size(1) == packed.size(1),
              "lloyd_scores: norm must be [G, n_k] = ", packed.sizes().slice(0, 2), ", got ", norm.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(norm.scalar_type()), "lloyd_scores: norm must be a float tensor, got ", norm.scalar_type());
  check_table(q, levels, int64_t{1} << bits, "lloyd_scores", "levels");
}

inline void check_lloyd_weighted_sum_input(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm,
                                           const at::Tensor& levels, int64_t bits, int64_t d) {
  check_bits(bits, "lloyd_weighted_sum");
  TORCH_CHECK_VALUE(d >= 2, "lloyd_weighted_sum: d must be >= 2, got ", d);
  check_weighted_keys(w, packed, norm, norm.sizes(), bits, d, "lloyd_weighted_sum", "norm");
  check_table(w, levels, int64_t{1} << bits, "lloyd_weighted_sum", "levels");
}

}  // namespace kvstats
