// The kvstats_shared backend's rotation + Lloyd–Max ops (common_shared.h): encode and decode one row per serial
// lane (math::encode_params_row, math::decode_lloyd_row), scores one (query, key) pair and weighted sums one
// output element at a time, as the CUDA kernels (cuda/lloyd_cuda.cu).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <vector>

#include "../prologue/lloyd.h"
#include "common_shared.h"

namespace kvstats {
namespace shared {
namespace {

std::tuple<at::Tensor, at::Tensor> lloyd_encode(const at::Tensor& x, const at::Tensor& signs,
                                                const at::Tensor& thresholds, int64_t bits, at::ScalarType norm_dtype) {
  const LloydEncodeArgs a = lloyd_encode_prologue(x, signs, thresholds, bits, norm_dtype);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "lloyd_encode_shared", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    encode_rows(a.params<scalar_t, acc_t>());
  });
  return a.result();
}

at::Tensor lloyd_decode(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                        const at::Tensor& levels, int64_t bits, int64_t d) {
  const LloydDecodeArgs a = lloyd_decode_prologue(packed, norm, signs, levels, bits, d);
  AT_DISPATCH_FLOATING_TYPES(a.levels.scalar_type(), "lloyd_decode_shared", [&] {
    const math::Rotation rot = a.rotation();
    at::parallel_for(0, a.n, row_grain(d), [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> buf(d);
      decode_rows(a.packed.const_data_ptr<uint8_t>(), a.norm.const_data_ptr<scalar_t>(),
                  a.levels.const_data_ptr<scalar_t>(), bits, d, rot, a.out.mutable_data_ptr<scalar_t>(), begin, end,
                  buf.data());
    });
  });
  return a.out;
}

at::Tensor lloyd_scores(const at::Tensor& q, const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& levels,
                        int64_t bits) {
  const LloydScoresArgs a = lloyd_scores_prologue(q, packed, norm, levels, bits);
  AT_DISPATCH_FLOATING_TYPES(a.q.scalar_type(), "lloyd_scores_shared", [&] { score_all(a.params<scalar_t>()); });
  return a.out;
}

at::Tensor lloyd_weighted_sum(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm,
                              const at::Tensor& levels, int64_t bits, int64_t d) {
  const LloydWeightedSumArgs a = lloyd_weighted_sum_prologue(w, packed, norm, levels, bits, d);
  AT_DISPATCH_FLOATING_TYPES(a.w.scalar_type(), "lloyd_weighted_sum_shared", [&] {
    weighted_all(a.params<scalar_t>());
  });
  return a.out;
}

}  // namespace
}  // namespace shared

TORCH_LIBRARY_IMPL(kvstats_shared, CPU, m) {
  m.impl("lloyd_encode", &shared::lloyd_encode);
  m.impl("lloyd_decode", &shared::lloyd_decode);
  m.impl("lloyd_scores", &shared::lloyd_scores);
  m.impl("lloyd_weighted_sum", &shared::lloyd_weighted_sum);
}

}  // namespace kvstats
