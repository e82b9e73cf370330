// What every backend's kernels share besides the math: how a stored scalar is rounded, the rotation as the
// row programs take it, the parameters of a Lloyd–Max encode, and the input checks (checks/*.h), which every
// kernel runs before touching memory.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "checks/common.h"
#include "quant_math.h"

namespace kvstats {

// How a stored scalar of dtype `t` is rounded (quant_math.h).
math::Stored stored_of(at::ScalarType t);

// The randomized-Hadamard rotation of signs [P, B] (P passes of B signs) as the row programs take it.
math::Rotation rotation_of(const at::Tensor& signs);

// The plain-encode fields of math::LloydEncodeParams for rows [row0, row0 + rows) (rows < 0: to the end) of
// the contiguous x [n, d], writing into packed [n, ceil(d·bits/8)] and norm [n] (x's accumulation dtype);
// the TurboQuant_prod fields are left to the caller. One filling for the CPU and CUDA encodes.
template <typename scalar_t, typename acc_t>
math::LloydEncodeParams<scalar_t, acc_t> lloyd_encode_params(const at::Tensor& x, const at::Tensor& signs,
                                                             const at::Tensor& thresholds, int64_t bits,
                                                             const at::Tensor& packed, const at::Tensor& norm,
                                                             int64_t row0 = 0, int64_t rows = -1) {
  math::LloydEncodeParams<scalar_t, acc_t> p;
  p.d = x.size(1);
  p.n = rows < 0 ? x.size(0) - row0 : rows;
  p.bits = bits;
  p.x = x.const_data_ptr<scalar_t>() + row0 * p.d;
  p.rotation = rotation_of(signs);
  p.thresholds = thresholds.const_data_ptr<acc_t>();
  p.packed = packed.mutable_data_ptr<uint8_t>() + row0 * packed.size(1);
  p.norm = norm.mutable_data_ptr<acc_t>() + row0;
  return p;
}


}  // namespace kvstats
