// math::ScoreParams from tensors, for the backends that score with math::score_one (one (query, key) pair
// at a time: the CUDA kernel, one thread per key, and the shared CPU backend), and the per-key weights of a
// sign part computed on the CPU.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include "quant_math.h"

namespace kvstats {

// ScoreParams over out [G, nq, nk] with no part yet; with_code_part adds the code part (lloyd, turbo_mse, the
// MSE part of turbo_prod: queries q [G, nq, d], codes [G, nk, nb], per-key weight, levels), with_sign_part
// the sign part (qjl, the QJL part of turbo_prod: projected queries [G, nq, m], packed signs, per-key weight).
template <typename scalar_t>
math::ScoreParams<scalar_t> score_params(const at::Tensor& out) {
  math::ScoreParams<scalar_t> p;
  p.G = out.size(0);
  p.nq = out.size(1);
  p.nk = out.size(2);
  p.out = out.mutable_data_ptr<scalar_t>();
  return p;
}

template <typename scalar_t>
void with_code_part(math::ScoreParams<scalar_t>& p, const at::Tensor& q, const at::Tensor& codes,
                    const at::Tensor& weight, const at::Tensor& levels, int64_t bits) {
  p.q = q.const_data_ptr<scalar_t>();
  p.codes = codes.const_data_ptr<uint8_t>();
  p.mse_w = weight.const_data_ptr<scalar_t>();
  p.levels = levels.const_data_ptr<scalar_t>();
  p.bits = bits;
  p.d = q.size(2);
}

template <typename scalar_t>
void with_sign_part(math::ScoreParams<scalar_t>& p, const at::Tensor& q_sketch, const at::Tensor& signs,
                    const at::Tensor& weight) {
  p.qs = q_sketch.const_data_ptr<scalar_t>();
  p.signs = signs.const_data_ptr<uint8_t>();
  p.qjl_w = weight.const_data_ptr<scalar_t>();
  p.m = q_sketch.size(2);
}

// w = scale · norm per key (math::qjl_key_weight) in dtype, on the CPU.
inline at::Tensor qjl_weights_cpu(const at::Tensor& norm, at::ScalarType dtype, double scale) {
  const at::Tensor nc = norm.to(dtype).contiguous();
  at::Tensor w = at::empty_like(nc);
  AT_DISPATCH_FLOATING_TYPES(dtype, "qjl_weights", [&] {
    const scalar_t* np = nc.const_data_ptr<scalar_t>();
    scalar_t* wp = w.mutable_data_ptr<scalar_t>();
    for (int64_t i = 0; i < nc.numel(); ++i) wp[i] = math::qjl_key_weight(np[i], static_cast<scalar_t>(scale));
  });
  return w;
}

}  // namespace kvstats
