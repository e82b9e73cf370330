// Input checks of the ops of the sign decode from byte tables, shared by every backend (checks/common.h).
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "common.h"

namespace kvstats {

inline void check_sign_decode_input(const at::Tensor& packed, const at::Tensor& tables, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& base) {
  TORCH_CHECK_TYPE(packed.scalar_type() == at::kByte, "sign_decode: packed must be uint8, got ", packed.scalar_type());
  TORCH_CHECK_VALUE(packed.dim() == 2 && packed.size(1) >= 1, "sign_decode: packed must be [N, mb] with mb >= 1, got ",
                    packed.sizes());
  check_same_device(packed, tables, "sign_decode", "tables");
  TORCH_CHECK_TYPE(tables.scalar_type() == at::kFloat || tables.scalar_type() == at::kDouble,
                   "sign_decode: tables must be float32 or float64, got ", tables.scalar_type());
  TORCH_CHECK_VALUE(tables.dim() == 2 && tables.size(0) == packed.size(1) * 256 && tables.size(1) >= 1,
                    "sign_decode: tables must be [256 * packed.size(1), d] = [", packed.size(1) * 256, ", d], got ",
                    tables.sizes());
  check_same_device(packed, weight, "sign_decode", "weight");
  TORCH_CHECK_TYPE(is_float_dtype(weight.scalar_type()), "sign_decode: weight must be a float tensor, got ",
                   weight.scalar_type());
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == packed.size(0), "sign_decode: weight must be [",
                    packed.size(0), "], got ", weight.sizes());
  if (base.has_value()) {
    check_same_device(packed, *base, "sign_decode", "base");
    TORCH_CHECK_TYPE(base->scalar_type() == tables.scalar_type(), "sign_decode: base must be ", tables.scalar_type(),
                     ", got ", base->scalar_type());
    TORCH_CHECK_VALUE(base->dim() == 2 && base->size(0) == packed.size(0) && base->size(1) == tables.size(1),
                      "sign_decode: base must be [", packed.size(0), ", ", tables.size(1), "], got ", base->sizes());
  }
}

}  // namespace kvstats
