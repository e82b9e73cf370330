// math::WeightedSumParams from tensors, for the backends that sum with math::weighted_sum_one (the CUDA kernel,
// one thread per output element, and the shared CPU backend). The caller passes contiguous tensors in the
// accumulation dtype (w's): the per-key weights (‖x‖, or scale·‖k‖ for QJL) or lo and step, and levels.
#pragma once

#include <ATen/ATen.h>

#include "quant_math.h"

namespace kvstats {

// out [G, nq, d] for w [G, nq, nk] and codes [G, nk, ceil(d·bits/8)]; no key part yet.
template <typename scalar_t>
math::WeightedSumParams<scalar_t> weighted_params(math::WeightedKind kind, const at::Tensor& w,
                                                  const at::Tensor& codes, int64_t bits, const at::Tensor& out) {
  math::WeightedSumParams<scalar_t> p;
  p.kind = kind;
  p.G = w.size(0);
  p.nq = w.size(1);
  p.nk = w.size(2);
  p.d = out.size(2);
  p.bits = bits;
  p.w = w.const_data_ptr<scalar_t>();
  p.codes = codes.const_data_ptr<uint8_t>();
  p.out = out.mutable_data_ptr<scalar_t>();
  return p;
}

// Lloyd codes (levels given) or QJL signs (levels undefined): the per-key weight key_w [G, nk].
template <typename scalar_t>
math::WeightedSumParams<scalar_t> weighted_level_params(const at::Tensor& w, const at::Tensor& codes,
                                                        const at::Tensor& key_w, const at::Tensor& levels,
                                                        int64_t bits, const at::Tensor& out) {
  auto p = weighted_params<scalar_t>(levels.defined() ? math::WeightedKind::kLevels : math::WeightedKind::kSigns, w,
                                     codes, bits, out);
  p.key_w = key_w.const_data_ptr<scalar_t>();
  if (levels.defined()) p.levels = levels.const_data_ptr<scalar_t>();
  return p;
}

// Min-max codes: lo and step [G, nk, d/group].
template <typename scalar_t>
math::WeightedSumParams<scalar_t> weighted_minmax_params(const at::Tensor& w, const at::Tensor& codes,
                                                         const at::Tensor& lo, const at::Tensor& step, int64_t group,
                                                         int64_t bits, const at::Tensor& out) {
  auto p = weighted_params<scalar_t>(math::WeightedKind::kMinMax, w, codes, bits, out);
  p.lo = lo.const_data_ptr<scalar_t>();
  p.step = step.const_data_ptr<scalar_t>();
  p.group = group;
  return p;
}

}  // namespace kvstats
