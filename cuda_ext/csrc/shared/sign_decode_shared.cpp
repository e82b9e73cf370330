// The kvstats_shared backend's sign decode (common_shared.h): math::sign_decode_row with one serial lane per
// row, as the CUDA kernel with one thread block per row (cuda/sign_decode_cuda.cu).
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "../prologue/sign_decode.h"
#include "common_shared.h"

namespace kvstats {
namespace shared {
namespace {

at::Tensor sign_decode(const at::Tensor& packed, const at::Tensor& tables, const at::Tensor& weight,
                       const std::optional<at::Tensor>& base) {
  const SignDecodeArgs a = sign_decode_prologue(packed, tables, weight, base);
  const int64_t mb = a.mb, d = a.d;
  AT_DISPATCH_FLOATING_TYPES(a.tables.scalar_type(), "sign_decode_shared", [&] {
    const uint8_t* pp = a.packed.const_data_ptr<uint8_t>();
    const scalar_t* tp = a.tables.const_data_ptr<scalar_t>();
    const scalar_t* wp = a.weight.const_data_ptr<scalar_t>();
    const scalar_t* bp = a.base.defined() ? a.base.const_data_ptr<scalar_t>() : nullptr;
    scalar_t* op = a.out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, a.n, row_grain(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        math::sign_decode_row(pp + r * mb, mb, tp, d, wp[r], bp == nullptr ? nullptr : bp + r * d, op + r * d, Lane{});
    });
  });
  return a.out;
}

}  // namespace
}  // namespace shared

TORCH_LIBRARY_IMPL(kvstats_shared, CPU, m) { m.impl("sign_decode", &shared::sign_decode); }

}  // namespace kvstats
