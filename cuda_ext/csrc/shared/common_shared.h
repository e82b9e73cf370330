// The kvstats_shared backend: the GPU's code on the CPU. Every op runs the row programs of quant_math.h with
// one serial lane (math::SerialLanes) where its CUDA kernel runs them with a thread block (or one thread per
// byte, key or group), the rows spread over the CPU's threads, and lays out its outputs and intermediates as
// the CUDA kernel does (cuda/quant_cuda.cu). It is slower than the fast CPU kernels (cpu/) and exists so that
// the CPU suite runs the lines the GPU executes: kvstats.ops.shared_path() routes the CPU ops here.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "../bitpack.h"
#include "../quant_math.h"

namespace kvstats {
namespace shared {

using Lane = math::SerialLanes;

// Rows per task: about 2K values, so that small batches stay on one thread.
inline int64_t row_grain(int64_t d) { return std::max<int64_t>(1, 2048 / std::max<int64_t>(d, 1)); }

// Packed sign bits of the rows of proj [n, m] (math::sign_bit, one byte at a time as the CUDA kernel).
template <typename acc_t>
at::Tensor pack_signs(const at::Tensor& proj) {
  const int64_t n = proj.size(0), m = proj.size(1), mb = packed_bytes(m, 1);
  at::Tensor out = at::empty({n, mb}, proj.options().dtype(at::kByte));
  const acc_t* pp = proj.const_data_ptr<acc_t>();
  uint8_t* op = out.mutable_data_ptr<uint8_t>();
  at::parallel_for(0, n, row_grain(m), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const acc_t* row = pp + r * m;
      auto sign_at = [&](int64_t i) { return math::sign_bit(row[i]); };
      math::pack_row(sign_at, m, 1, op + r * mb, Lane{});
    }
  });
  return out;
}

}  // namespace shared
}  // namespace kvstats
