// The kvstats_shared backend's QJL ops (common_shared.h): encode by one matrix product and sign packing per
// chunk of rows and the norms one row per serial lane (math::load_scaled), scores one (query, key) pair and
// weighted sums one output element at a time, as the CUDA kernels (cuda/qjl_cuda.cu).
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <vector>

#include "../prologue/qjl.h"
#include "../score_params.h"
#include "common_shared.h"

namespace kvstats {
namespace shared {
namespace {

// norm[r] = ‖x_r‖ per row without overflow (math::load_scaled), x [n, d] in norm's dtype.
void row_norms(const at::Tensor& x, const at::Tensor& norm) {
  const int64_t n = x.size(0), d = x.size(1);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "row_norms_shared", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* np = norm.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, row_grain(d), [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> buf(d);
      for (int64_t r = begin; r < end; ++r) np[r] = math::load_scaled(xp + r * d, d, buf.data(), Lane{}).norm();
    });
  });
}

std::tuple<at::Tensor, at::Tensor> qjl_encode(const at::Tensor& x, const at::Tensor& sketch,
                                              at::ScalarType norm_dtype) {
  const QjlEncodeArgs a = qjl_encode_prologue(x, sketch, norm_dtype);
  const at::Tensor xa = a.x_in_sketch_dtype();
  for (int64_t c0 = 0; c0 < a.n; c0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, a.n - c0);
    a.packed.narrow(0, c0, rows).copy_(sketch_signs(xa.narrow(0, c0, rows), a.sketch));
  }
  row_norms(xa, a.norm);
  return a.result();
}

at::Tensor qjl_scores(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm, double scale) {
  const QjlScoresArgs a = qjl_scores_prologue(q_sketch, packed, norm, scale, &qjl_weights_cpu);
  AT_DISPATCH_FLOATING_TYPES(a.q_sketch.scalar_type(), "qjl_scores_shared", [&] { score_all(a.params<scalar_t>()); });
  return a.out;
}

at::Tensor qjl_weighted_sum(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm, double scale,
                            int64_t m) {
  const QjlWeightedSumArgs a = qjl_weighted_sum_prologue(w, packed, norm, scale, m, &qjl_weights_cpu);
  AT_DISPATCH_FLOATING_TYPES(a.w.scalar_type(), "qjl_weighted_sum_shared", [&] {
    weighted_all(a.params<scalar_t>());
  });
  return a.out;
}

}  // namespace
}  // namespace shared

TORCH_LIBRARY_IMPL(kvstats_shared, CPU, m) {
  m.impl("qjl_encode", &shared::qjl_encode);
  m.impl("qjl_scores", &shared::qjl_scores);
  m.impl("qjl_weighted_sum", &shared::qjl_weighted_sum);
}

}  // namespace kvstats
