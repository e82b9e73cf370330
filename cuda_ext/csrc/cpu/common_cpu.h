// Small helpers shared by the CPU kernels.
#pragma once

#include <ATen/ATen.h>

namespace kvstats {
namespace cpu {

// v rounded to the precision of `dtype` (how a stored norm / offset / scale is kept), back in acc_t.
template <typename acc_t>
inline acc_t round_to(acc_t v, at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return static_cast<acc_t>(static_cast<float>(static_cast<at::Half>(static_cast<float>(v))));
    case at::kBFloat16:
      return static_cast<acc_t>(static_cast<float>(static_cast<at::BFloat16>(static_cast<float>(v))));
    case at::kFloat: return static_cast<acc_t>(static_cast<float>(v));
    default: return v;
  }
}

// Rows per chunk when an op needs a scratch buffer per row (bounds the extra memory).
constexpr int64_t kChunkRows = 8192;

}  // namespace cpu
}  // namespace kvstats
