// Input checks of the ops of TurboQuant_prod, shared by every backend (checks/common.h).
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "common.h"
#include "lloyd.h"
#include "qjl.h"
#include "sign_decode.h"

namespace kvstats {

inline void check_turbo_prod_encode_input(const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds,
                                          const at::Tensor& levels, int64_t bits, const at::Tensor& sketch) {
  check_lloyd_encode_input(x, signs, thresholds, bits);
  check_qjl_encode_input(x, sketch);
  TORCH_CHECK_VALUE(levels.dim() == 1 && levels.size(0) == (int64_t{1} << bits),
                    "turbo_prod_encode: levels must be 1-D of length ", int64_t{1} << bits, ", got ", levels.sizes());
  TORCH_CHECK_TYPE(levels.scalar_type() == thresholds.scalar_type(), "turbo_prod_encode: levels must be ",
                   thresholds.scalar_type(), ", got ", levels.scalar_type());
}

inline void check_turbo_prod_scores_input(const at::Tensor& q, const at::Tensor& q_sketch, const at::Tensor& packed,
                                          const at::Tensor& norm, const at::Tensor& levels, int64_t bits,
                                          const at::Tensor& signs_packed, const at::Tensor& gamma) {
  check_lloyd_scores_input(q, packed, norm, levels, bits);
  check_qjl_scores_input(q_sketch, signs_packed, gamma);
  TORCH_CHECK_VALUE(q_sketch.size(0) == q.size(0) && q_sketch.size(1) == q.size(1) && signs_packed.size(1) == packed.size(1),
              "turbo_prod_scores: q_sketch [G, n_q, m] and signs_packed [G, n_k, m/8] must match q and packed");
  TORCH_CHECK_TYPE(q_sketch.scalar_type() == q.scalar_type(), "turbo_prod_scores: q_sketch must have q's dtype");
}

inline void check_turbo_prod_decode_input(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                                          const at::Tensor& levels, int64_t bits, int64_t d, const at::Tensor& signs_packed,
                                          const at::Tensor& tables, const at::Tensor& weight) {
  check_lloyd_decode_input(packed, norm, signs, levels, bits, d);
  check_sign_decode_input(signs_packed, tables, weight, std::nullopt);
  check_same_device(packed, signs_packed, "turbo_prod_decode", "signs_packed");
  TORCH_CHECK_VALUE(signs_packed.size(0) == packed.size(0), "turbo_prod_decode: signs_packed must have ",
                    packed.size(0), " rows (as packed), got ", signs_packed.size(0));
  TORCH_CHECK_TYPE(tables.scalar_type() == levels.scalar_type(), "turbo_prod_decode: tables must be ",
                   levels.scalar_type(), " (as levels), got ", tables.scalar_type());
  TORCH_CHECK_VALUE(tables.size(1) == d, "turbo_prod_decode: tables must have d = ", d, " columns, got ",
                    tables.size(1));
}

}  // namespace kvstats
