// The kvstats_shared backend's weighted sums (common_shared.h): every output element with
// math::weighted_sum_one, the loop one CUDA thread runs per element (cuda/quant_cuda.cu: weighted_sum_kernel),
// over the same math::WeightedSumParams.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "../checks/lloyd.h"
#include "../checks/minmax.h"
#include "../checks/qjl.h"
#include "../score_params.h"
#include "../weighted_params.h"
#include "common_shared.h"

namespace kvstats {
namespace shared {
namespace {

template <typename acc_t>
void weighted_all(const math::WeightedSumParams<acc_t>& p) {
  at::parallel_for(0, p.G * p.nq, 1, [&](int64_t begin, int64_t end) {
    for (int64_t gi = begin; gi < end; ++gi)
      for (int64_t t = 0; t < p.d; ++t) p.out[gi * p.d + t] = math::weighted_sum_one(p, p.levels, gi / p.nq, gi % p.nq, t);
  });
}

at::Tensor lloyd_weighted_sum(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm,
                              const at::Tensor& levels, int64_t bits, int64_t d) {
  check_lloyd_weighted_sum_input(w, packed, norm, levels, bits, d);
  const at::Tensor wc = w.contiguous(), pc = packed.contiguous(), lv = levels.contiguous();
  const at::Tensor nc = norm.to(wc.scalar_type()).contiguous();
  at::Tensor out = at::empty({wc.size(0), wc.size(1), d}, wc.options());
  AT_DISPATCH_FLOATING_TYPES(wc.scalar_type(), "lloyd_weighted_sum_shared", [&] {
    weighted_all(weighted_level_params<scalar_t>(wc, pc, nc, lv, bits, out));
  });
  return out;
}

at::Tensor qjl_weighted_sum(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm, double scale,
                            int64_t m) {
  check_qjl_weighted_sum_input(w, packed, norm, m);
  const at::Tensor wc = w.contiguous(), pc = packed.contiguous();
  const at::Tensor kw = qjl_weights_cpu(norm, wc.scalar_type(), scale);
  at::Tensor out = at::empty({wc.size(0), wc.size(1), m}, wc.options());
  AT_DISPATCH_FLOATING_TYPES(wc.scalar_type(), "qjl_weighted_sum_shared", [&] {
    weighted_all(weighted_level_params<scalar_t>(wc, pc, kw, at::Tensor(), 1, out));
  });
  return out;
}

at::Tensor minmax_weighted_sum(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& lo,
                               const at::Tensor& scale, int64_t group, int64_t bits, int64_t d) {
  check_minmax_weighted_sum_input(w, packed, lo, scale, group, bits, d);
  const at::Tensor wc = w.contiguous(), pc = packed.contiguous();
  const at::Tensor lc = lo.to(wc.scalar_type()).contiguous(), sc = scale.to(wc.scalar_type()).contiguous();
  at::Tensor out = at::empty({wc.size(0), wc.size(1), d}, wc.options());
  AT_DISPATCH_FLOATING_TYPES(wc.scalar_type(), "minmax_weighted_sum_shared", [&] {
    weighted_all(weighted_minmax_params<scalar_t>(wc, pc, lc, sc, group, bits, out));
  });
  return out;
}

}  // namespace
}  // namespace shared

TORCH_LIBRARY_IMPL(kvstats_shared, CPU, m) {
  m.impl("lloyd_weighted_sum", &shared::lloyd_weighted_sum);
  m.impl("qjl_weighted_sum", &shared::qjl_weighted_sum);
  m.impl("minmax_weighted_sum", &shared::minmax_weighted_sum);
}

}  // namespace kvstats
