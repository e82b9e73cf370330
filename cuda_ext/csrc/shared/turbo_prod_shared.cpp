// The kvstats_shared backend's TurboQuant_prod ops (common_shared.h): encode one row per serial lane with the
// residual (math::encode_params_row) and its sketch per chunk of rows, scores one (query, key) pair at a time,
// decode one row at a time (math::decode_lloyd_row, then math::sign_decode_row in place), as the CUDA kernels
// (cuda/turbo_prod_cuda.cu).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <vector>

#include "../prologue/turbo_prod.h"
#include "../score_params.h"
#include "common_shared.h"

namespace kvstats {
namespace shared {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> turbo_prod_encode(
    const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds, const at::Tensor& levels,
    int64_t bits, const at::Tensor& sketch, at::ScalarType norm_dtype) {
  const TurboProdEncodeArgs a = turbo_prod_encode_prologue(x, signs, thresholds, levels, bits, sketch, norm_dtype);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "turbo_prod_encode_shared", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    // The residual of one chunk at a time, kept scaled by 2^-e per row (its sign bits are those of r).
    at::Tensor residual = at::empty({std::min(a.n, kChunkRows), a.d}, a.thresholds.options());
    for (int64_t c0 = 0; c0 < a.n; c0 += kChunkRows) {
      auto p = a.params<scalar_t, acc_t>(c0, std::min(kChunkRows, a.n - c0));
      p.residual = residual.mutable_data_ptr<acc_t>();
      encode_rows(p);
      a.sign_packed.narrow(0, c0, p.n).copy_(sketch_signs(residual.narrow(0, 0, p.n), a.sketch));
    }
  });
  return a.result();
}

at::Tensor turbo_prod_scores(const at::Tensor& q, const at::Tensor& q_sketch, const at::Tensor& packed,
                             const at::Tensor& norm, const at::Tensor& levels, int64_t bits,
                             const at::Tensor& signs_packed, const at::Tensor& gamma, double scale) {
  const TurboProdScoresArgs a = turbo_prod_scores_prologue(q, q_sketch, packed, norm, levels, bits, signs_packed,
                                                           gamma, scale, &qjl_weights_cpu);
  AT_DISPATCH_FLOATING_TYPES(a.q.scalar_type(), "turbo_prod_scores_shared", [&] { score_all(a.params<scalar_t>()); });
  return a.out;
}

at::Tensor turbo_prod_decode(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                             const at::Tensor& levels, int64_t bits, int64_t d, const at::Tensor& signs_packed,
                             const at::Tensor& tables, const at::Tensor& weight) {
  const TurboProdDecodeArgs a =
      turbo_prod_decode_prologue(packed, norm, signs, levels, bits, d, signs_packed, tables, weight);
  const int64_t mb = a.mb;
  AT_DISPATCH_FLOATING_TYPES(a.levels.scalar_type(), "turbo_prod_decode_shared", [&] {
    const math::Rotation rot = a.rotation();
    const uint8_t* pp = a.packed.const_data_ptr<uint8_t>();
    const scalar_t* np = a.norm.const_data_ptr<scalar_t>();
    const scalar_t* lp = a.levels.const_data_ptr<scalar_t>();
    const uint8_t* spp = a.signs_packed.const_data_ptr<uint8_t>();
    const scalar_t* tp = a.tables.const_data_ptr<scalar_t>();
    const scalar_t* wp = a.weight.const_data_ptr<scalar_t>();
    scalar_t* op = a.out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, a.n, row_grain(d), [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> buf(d);
      // Per row, as one CUDA block: the MSE part into the output row, then the sign part added in place.
      for (int64_t r = begin; r < end; ++r) {
        decode_rows(pp, np, lp, bits, d, rot, op, r, r + 1, buf.data());
        math::sign_decode_row(spp + r * mb, mb, tp, d, wp[r], op + r * d, op + r * d, Lane{});
      }
    });
  });
  return a.out;
}

}  // namespace
}  // namespace shared

TORCH_LIBRARY_IMPL(kvstats_shared, CPU, m) {
  m.impl("turbo_prod_encode", &shared::turbo_prod_encode);
  m.impl("turbo_prod_scores", &shared::turbo_prod_scores);
  m.impl("turbo_prod_decode", &shared::turbo_prod_decode);
}

}  // namespace kvstats
