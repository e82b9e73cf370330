// The kvstats_shared backend's min-max ops (common_shared.h): encode one group at a time (math::minmax_group)
// then packing, decode one element at a time (math::minmax_value), weighted sums one output element at a time,
// as the CUDA kernels (cuda/minmax_cuda.cu).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "../prologue/minmax.h"
#include "common_shared.h"

namespace kvstats {
namespace shared {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> minmax_encode(const at::Tensor& x, int64_t group, int64_t bits,
                                                             at::ScalarType side_dtype) {
  const MinMaxEncodeArgs a = minmax_encode_prologue(x, group, bits, side_dtype);
  const int64_t d = a.d, ng = a.ng;
  const at::Tensor codes = at::empty({a.n, d}, a.x.options().dtype(at::kByte));  // a byte per code, then packed
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "minmax_encode_shared", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = a.x.const_data_ptr<scalar_t>();
    uint8_t* cp = codes.mutable_data_ptr<uint8_t>();
    acc_t* lp = a.lo.mutable_data_ptr<acc_t>();
    acc_t* sp = a.step.mutable_data_ptr<acc_t>();
    const math::Stored stored = stored_of(a.side);
    // One group at a time, as the CUDA kernel's one thread per group; then the codes are packed.
    at::parallel_for(0, a.n * ng, row_grain(group), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t offset = (t / ng) * d + (t % ng) * group;
        const auto p = math::minmax_group<scalar_t, acc_t>(xp + offset, group, bits, stored, cp + offset);
        lp[t] = p.lo;
        sp[t] = p.step;
      }
    });
  });
  pack_codes(codes, bits, a.packed);
  return a.result();
}

at::Tensor minmax_decode(const at::Tensor& packed, const at::Tensor& lo, const at::Tensor& scale, int64_t group,
                         int64_t bits, int64_t d) {
  const MinMaxDecodeArgs a = minmax_decode_prologue(packed, lo, scale, group, bits, d);
  const int64_t nb = a.nb, ng = a.ng;
  AT_DISPATCH_FLOATING_TYPES(a.lo.scalar_type(), "minmax_decode_shared", [&] {
    const uint8_t* pp = a.packed.const_data_ptr<uint8_t>();
    const scalar_t* lp = a.lo.const_data_ptr<scalar_t>();
    const scalar_t* sp = a.step.const_data_ptr<scalar_t>();
    scalar_t* op = a.out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, a.n, row_grain(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        for (int64_t j = 0; j < d; ++j) {
          const int64_t gi = r * ng + j / group;
          op[r * d + j] = math::minmax_value(lp[gi], sp[gi], unpack_code(pp + r * nb, nb, bits, j));
        }
    });
  });
  return a.out;
}

at::Tensor minmax_weighted_sum(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& lo,
                               const at::Tensor& scale, int64_t group, int64_t bits, int64_t d) {
  const MinMaxWeightedSumArgs a = minmax_weighted_sum_prologue(w, packed, lo, scale, group, bits, d);
  AT_DISPATCH_FLOATING_TYPES(a.w.scalar_type(), "minmax_weighted_sum_shared", [&] {
    weighted_all(a.params<scalar_t>());
  });
  return a.out;
}

}  // namespace
}  // namespace shared

TORCH_LIBRARY_IMPL(kvstats_shared, CPU, m) {
  m.impl("minmax_encode", &shared::minmax_encode);
  m.impl("minmax_decode", &shared::minmax_decode);
  m.impl("minmax_weighted_sum", &shared::minmax_weighted_sum);
}

}  // namespace kvstats
