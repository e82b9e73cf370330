// TurboQuant_prod (a Lloyd–Max part at b − 1 bits plus QJL signs of the residual): the schemas, checks and
// prologues of turbo_prod_encode, turbo_prod_scores and turbo_prod_decode (prologue/common.h).
#pragma once

#include <optional>
#include <tuple>

#include "../score_params.h"
#include "common.h"
#include "lloyd.h"
#include "qjl.h"
#include "sign_decode.h"

namespace kvstats {

inline void define_turbo_prod_ops(torch::Library& m) {
  // TurboQuant_prod: (packed (bits)-bit MSE indices, |x|, packed sign(S r), gamma = |r|), r the rotated residual.
  m.def(
      "turbo_prod_encode(Tensor x, Tensor signs, Tensor thresholds, Tensor levels, int bits, Tensor sketch, "
      "ScalarType norm_dtype) -> (Tensor, Tensor, Tensor, Tensor)");
  // lloyd_scores(q, ...) + qjl_scores(q_sketch, ...) in one pass over the keys.
  m.def(
      "turbo_prod_scores(Tensor q, Tensor q_sketch, Tensor packed, Tensor norm, Tensor levels, int bits, "
      "Tensor signs_packed, Tensor gamma, float scale) -> Tensor");
  // TurboQuant_prod decode in one pass: sign_decode(signs_packed, tables, weight, lloyd_decode(packed, ...)),
  // tables of S·Pi, so that the sum is Pi^T(|x|·levels[idx] + weight·S^T b).
  m.def(
      "turbo_prod_decode(Tensor packed, Tensor norm, Tensor signs, Tensor levels, int bits, int d, "
      "Tensor signs_packed, Tensor tables, Tensor weight) -> Tensor");
}

// ------------------------------------------------------------------------------------------- checks
inline void check_turbo_prod_encode_input(const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds,
                                          const at::Tensor& levels, int64_t bits, const at::Tensor& sketch) {
  check_lloyd_encode_input(x, signs, thresholds, bits);
  check_qjl_encode_input(x, sketch);
  TORCH_CHECK_VALUE(levels.dim() == 1 && levels.size(0) == (int64_t{1} << bits),
                    "turbo_prod_encode: levels must be 1-D of length ", int64_t{1} << bits, ", got ", levels.sizes());
  TORCH_CHECK_TYPE(levels.scalar_type() == thresholds.scalar_type(), "turbo_prod_encode: levels must be ",
                   thresholds.scalar_type(), ", got ", levels.scalar_type());
}

inline void check_turbo_prod_scores_input(const at::Tensor& q, const at::Tensor& q_sketch, const at::Tensor& packed,
                                          const at::Tensor& norm, const at::Tensor& levels, int64_t bits,
                                          const at::Tensor& signs_packed, const at::Tensor& gamma) {
  check_lloyd_scores_input(q, packed, norm, levels, bits);
  check_qjl_scores_input(q_sketch, signs_packed, gamma);
  TORCH_CHECK_VALUE(q_sketch.size(0) == q.size(0) && q_sketch.size(1) == q.size(1) && signs_packed.size(1) == packed.size(1),
              "turbo_prod_scores: q_sketch [G, n_q, m] and signs_packed [G, n_k, m/8] must match q and packed");
  TORCH_CHECK_TYPE(q_sketch.scalar_type() == q.scalar_type(), "turbo_prod_scores: q_sketch must have q's dtype");
}

inline void check_turbo_prod_decode_input(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                                          const at::Tensor& levels, int64_t bits, int64_t d, const at::Tensor& signs_packed,
                                          const at::Tensor& tables, const at::Tensor& weight) {
  check_lloyd_decode_input(packed, norm, signs, levels, bits, d);
  check_sign_decode_input(signs_packed, tables, weight, std::nullopt);
  check_same_device(packed, signs_packed, "turbo_prod_decode", "signs_packed");
  TORCH_CHECK_VALUE(signs_packed.size(0) == packed.size(0), "turbo_prod_decode: signs_packed must have ",
                    packed.size(0), " rows (as packed), got ", signs_packed.size(0));
  TORCH_CHECK_TYPE(tables.scalar_type() == levels.scalar_type(), "turbo_prod_decode: tables must be ",
                   levels.scalar_type(), " (as levels), got ", tables.scalar_type());
  TORCH_CHECK_VALUE(tables.size(1) == d, "turbo_prod_decode: tables must have d = ", d, " columns, got ",
                    tables.size(1));
}

// ----------------------------------------------------------------------------------------- prologues
// lloyd_encode's arguments and outputs (LloydEncodeArgs) plus levels [2^bits] and sketch [m, d] contiguous in
// the accumulation dtype; out besides packed and norm: sign_packed [n, mb] uint8 (the signs of S r) and gamma
// [n] = ‖r‖, both scalars returned in `stored`.
struct TurboProdEncodeArgs {
  at::Tensor x, signs, thresholds, levels, sketch, packed, norm, sign_packed, gamma;
  int64_t n = 0, d = 0, bits = 0, nb = 0, m = 0, mb = 0;
  at::ScalarType stored = at::kFloat;

  // The encode parameters of rows [row0, row0 + rows) with the residual's fields but its buffer
  // (p.residual, per chunk of rows, is the backend's).
  template <typename scalar_t, typename acc_t>
  math::LloydEncodeParams<scalar_t, acc_t> params(int64_t row0 = 0, int64_t rows = -1) const {
    auto p = lloyd_encode_params<scalar_t, acc_t>(x, signs, thresholds, bits, packed, norm, row0, rows);
    p.levels = levels.const_data_ptr<acc_t>();
    p.norm_stored = stored_of(stored);
    p.gamma = gamma.mutable_data_ptr<acc_t>() + row0;
    return p;
  }
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> result() const {
    return {packed, norm.to(stored), sign_packed, gamma.to(stored)};
  }
};

inline TurboProdEncodeArgs turbo_prod_encode_prologue(const at::Tensor& x, const at::Tensor& signs,
                                                      const at::Tensor& thresholds, const at::Tensor& levels,
                                                      int64_t bits, const at::Tensor& sketch,
                                                      at::ScalarType norm_dtype) {
  check_turbo_prod_encode_input(x, signs, thresholds, levels, bits, sketch);
  TurboProdEncodeArgs a;
  a.x = x.contiguous();
  a.signs = signs.contiguous();
  a.thresholds = thresholds.contiguous();
  a.levels = levels.contiguous();
  a.sketch = sketch.contiguous();
  a.n = a.x.size(0);
  a.d = a.x.size(1);
  a.bits = bits;
  a.nb = packed_bytes(a.d, bits);
  a.m = a.sketch.size(0);
  a.mb = packed_bytes(a.m, 1);
  a.stored = storage_dtype(x, norm_dtype);
  a.packed = at::empty({a.n, a.nb}, a.x.options().dtype(at::kByte));
  a.sign_packed = at::empty({a.n, a.mb}, a.x.options().dtype(at::kByte));
  a.norm = at::empty({a.n}, a.x.options().dtype(a.thresholds.scalar_type()));
  a.gamma = at::empty({a.n}, a.x.options().dtype(a.thresholds.scalar_type()));
  return a;
}

// lloyd_scores' arguments (q, packed, norm in q's dtype, levels) and qjl_scores' (q_sketch, signs_packed, and
// gamma_w = the per-key weights scale · γ in q's dtype), contiguous; out [G, n_q, n_k].
struct TurboProdScoresArgs {
  at::Tensor q, q_sketch, packed, norm, levels, signs_packed, gamma_w, out;
  int64_t bits = 0;

  template <typename acc_t>
  math::ScoreParams<acc_t> params() const {
    auto p = score_params<acc_t>(out);
    with_code_part(p, q, packed, norm, levels, bits);
    with_sign_part(p, q_sketch, signs_packed, gamma_w);
    return p;
  }
};

inline TurboProdScoresArgs turbo_prod_scores_prologue(const at::Tensor& q, const at::Tensor& q_sketch,
                                                      const at::Tensor& packed, const at::Tensor& norm,
                                                      const at::Tensor& levels, int64_t bits,
                                                      const at::Tensor& signs_packed, const at::Tensor& gamma,
                                                      double scale, KeyWeightsFn key_weights) {
  check_turbo_prod_scores_input(q, q_sketch, packed, norm, levels, bits, signs_packed, gamma);
  TurboProdScoresArgs a;
  a.q = q.contiguous();
  a.packed = packed.contiguous();
  a.levels = levels.contiguous();
  a.q_sketch = q_sketch.contiguous();
  a.signs_packed = signs_packed.contiguous();
  a.norm = contiguous_in(norm, a.q.scalar_type());
  a.gamma_w = key_weights(gamma, a.q.scalar_type(), scale);
  a.bits = bits;
  a.out = at::empty({a.q.size(0), a.q.size(1), a.packed.size(1)}, a.q.options());
  return a;
}

// lloyd_decode's arguments (LloydDecodeArgs) and sign_decode's (signs_packed [n, mb], tables [256·mb, d]
// contiguous, weight [n] in the tables' dtype); out [n, d] in levels' dtype.
struct TurboProdDecodeArgs {
  at::Tensor packed, norm, signs, levels, signs_packed, tables, weight, out;
  int64_t n = 0, d = 0, bits = 0, mb = 0;

  math::Rotation rotation() const { return rotation_of(signs); }
};

inline TurboProdDecodeArgs turbo_prod_decode_prologue(const at::Tensor& packed, const at::Tensor& norm,
                                                      const at::Tensor& signs, const at::Tensor& levels, int64_t bits,
                                                      int64_t d, const at::Tensor& signs_packed,
                                                      const at::Tensor& tables, const at::Tensor& weight) {
  check_turbo_prod_decode_input(packed, norm, signs, levels, bits, d, signs_packed, tables, weight);
  TurboProdDecodeArgs a;
  a.packed = packed.contiguous();
  a.signs = signs.contiguous();
  a.levels = levels.contiguous();
  a.norm = contiguous_in(norm, a.levels.scalar_type());
  a.signs_packed = signs_packed.contiguous();
  a.tables = tables.contiguous();
  a.weight = contiguous_in(weight, a.tables.scalar_type());
  a.n = a.packed.size(0);
  a.d = d;
  a.bits = bits;
  a.mb = a.signs_packed.size(1);
  a.out = at::empty({a.n, d}, a.levels.options());
  return a;
}

}  // namespace kvstats
