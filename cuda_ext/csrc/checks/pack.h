// Input checks of the ops of dense bit packing, shared by every backend (checks/common.h).
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "common.h"

namespace kvstats {

inline void check_pack_input(const at::Tensor& codes, int64_t bits) {
  check_bits(bits, "pack_bits");
  TORCH_CHECK_VALUE(codes.dim() == 2, "pack_bits: codes must be [N, d], got ", codes.sizes());
  TORCH_CHECK_TYPE(codes.scalar_type() == at::kByte, "pack_bits: codes must be uint8, got ", codes.scalar_type());
}

inline void check_unpack_input(const at::Tensor& packed, int64_t bits, int64_t d) {
  check_bits(bits, "unpack_bits");
  TORCH_CHECK_VALUE(d >= 1, "unpack_bits: d must be positive, got ", d);
  check_packed(packed, 2, bits, d, "unpack_bits");
}

}  // namespace kvstats
