// Input checks of the ops of KIVI-style min-max, shared by every backend (checks/common.h).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <utility>

#include "common.h"

namespace kvstats {

inline void check_minmax_encode_input(const at::Tensor& x, int64_t group, int64_t bits) {
  check_bits(bits, "minmax_encode");
  TORCH_CHECK_VALUE(x.dim() == 2, "minmax_encode: x must be [N, d], got ", x.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(x.scalar_type()), "minmax_encode: x must be a float tensor, got ", x.scalar_type());
  TORCH_CHECK_VALUE(group >= 1 && x.size(1) % group == 0, "minmax_encode: group must divide d = ", x.size(1), ", got ",
              group);
}

inline void check_minmax_decode_input(const at::Tensor& packed, const at::Tensor& lo, const at::Tensor& scale,
                                      int64_t group, int64_t bits, int64_t d) {
  check_bits(bits, "minmax_decode");
  TORCH_CHECK_VALUE(group >= 1 && d % group == 0, "minmax_decode: group must divide d = ", d, ", got ", group);
  check_packed(packed, 2, bits, d, "minmax_decode");
  for (const at::Tensor* t : {&lo, &scale}) {
    check_same_device(packed, *t, "minmax_decode", "lo/scale");
    TORCH_CHECK_VALUE(t->dim() == 2 && t->size(0) == packed.size(0) && t->size(1) == d / group,
                "minmax_decode: lo and scale must be [", packed.size(0), ", ", d / group, "], got ", t->sizes());
    TORCH_CHECK_TYPE(is_float_dtype(t->scalar_type()), "minmax_decode: lo and scale must be float tensors, got ", t->scalar_type());
  }
}

inline void check_minmax_weighted_sum_input(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& lo,
                                            const at::Tensor& scale, int64_t group, int64_t bits, int64_t d) {
  const char* op = "minmax_weighted_sum";
  check_bits(bits, op);
  TORCH_CHECK_VALUE(group >= 1 && d % group == 0, op, ": group must divide d = ", d, ", got ", group);
  // The fake checks lo[..., 0] as the per-key tensor: lo's sizes without the last axis when it has three.
  check_weighted_keys(w, packed, lo, lo.dim() == 3 ? lo.sizes().slice(0, 2) : lo.sizes(), bits, d, op, "lo");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"lo", &lo}, {"scale", &scale}}) {
    check_same_device(w, *t, op, name);
    TORCH_CHECK_VALUE(t->dim() == 3 && t->size(0) == packed.size(0) && t->size(1) == packed.size(1) &&
                          t->size(2) == d / group,
                      op, ": ", name, " must be [G, n_k, d/group] = [", packed.size(0), ", ", packed.size(1), ", ",
                      d / group, "], got ", t->sizes());
    TORCH_CHECK_TYPE(is_float_dtype(t->scalar_type()), op, ": ", name, " must be a float tensor, got ",
                     t->scalar_type());
  }
}

}  // namespace kvstats
