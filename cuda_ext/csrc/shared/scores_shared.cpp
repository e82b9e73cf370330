// The kvstats_shared backend's scores (common_shared.h): every (query, key) pair with math::score_one, the loop
// one CUDA thread runs per key (cuda/quant_cuda.cu: scores_kernel), over the same math::ScoreParams.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "../checks/lloyd.h"
#include "../checks/qjl.h"
#include "../checks/turbo_prod.h"
#include "../score_params.h"
#include "common_shared.h"

namespace kvstats {
namespace shared {
namespace {

template <typename acc_t>
void score_all(const math::ScoreParams<acc_t>& p) {
  at::parallel_for(0, p.G * p.nq, 1, [&](int64_t begin, int64_t end) {
    for (int64_t gi = begin; gi < end; ++gi) {
      const int64_t g = gi / p.nq;
      const acc_t* qr = p.codes ? p.q + gi * p.d : nullptr;
      const acc_t* qsr = p.signs ? p.qs + gi * p.m : nullptr;
      for (int64_t j = 0; j < p.nk; ++j) p.out[gi * p.nk + j] = math::score_one(p, qr, qsr, g, j);
    }
  });
}

at::Tensor lloyd_scores(const at::Tensor& q, const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& levels,
                        int64_t bits) {
  check_lloyd_scores_input(q, packed, norm, levels, bits);
  const at::Tensor qc = q.contiguous(), pc = packed.contiguous(), lv = levels.contiguous();
  const at::Tensor nc = norm.to(qc.scalar_type()).contiguous();
  at::Tensor out = at::empty({qc.size(0), qc.size(1), pc.size(1)}, qc.options());
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "lloyd_scores_shared", [&] {
    auto p = score_params<scalar_t>(out);
    with_code_part(p, qc, pc, nc, lv, bits);
    score_all(p);
  });
  return out;
}

at::Tensor qjl_scores(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm, double scale) {
  check_qjl_scores_input(q_sketch, packed, norm);
  const at::Tensor qc = q_sketch.contiguous(), pc = packed.contiguous();
  const at::Tensor wc = qjl_weights_cpu(norm, qc.scalar_type(), scale);
  at::Tensor out = at::empty({qc.size(0), qc.size(1), pc.size(1)}, qc.options());
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "qjl_scores_shared", [&] {
    auto p = score_params<scalar_t>(out);
    with_sign_part(p, qc, pc, wc);
    score_all(p);
  });
  return out;
}

at::Tensor turbo_prod_scores(const at::Tensor& q, const at::Tensor& q_sketch, const at::Tensor& packed,
                             const at::Tensor& norm, const at::Tensor& levels, int64_t bits,
                             const at::Tensor& signs_packed, const at::Tensor& gamma, double scale) {
  check_turbo_prod_scores_input(q, q_sketch, packed, norm, levels, bits, signs_packed, gamma);
  const at::Tensor qc = q.contiguous(), pc = packed.contiguous(), lv = levels.contiguous();
  const at::Tensor qsc = q_sketch.contiguous(), spc = signs_packed.contiguous();
  const at::Tensor nc = norm.to(qc.scalar_type()).contiguous();
  const at::Tensor gc = qjl_weights_cpu(gamma, qc.scalar_type(), scale);
  at::Tensor out = at::empty({qc.size(0), qc.size(1), pc.size(1)}, qc.options());
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "turbo_prod_scores_shared", [&] {
    auto p = score_params<scalar_t>(out);
    with_code_part(p, qc, pc, nc, lv, bits);
    with_sign_part(p, qsc, spc, gc);
    score_all(p);
  });
  return out;
}

}  // namespace
}  // namespace shared

TORCH_LIBRARY_IMPL(kvstats_shared, CPU, m) {
  m.impl("lloyd_scores", &shared::lloyd_scores);
  m.impl("qjl_scores", &shared::qjl_scores);
  m.impl("turbo_prod_scores", &shared::turbo_prod_scores);
}

}  // namespace kvstats
