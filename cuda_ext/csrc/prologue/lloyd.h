// Rotation + Lloyd–Max (lloyd, turbo_mse): the schemas, checks and prologues of lloyd_encode, lloyd_decode,
// lloyd_scores and lloyd_weighted_sum (prologue/common.h).
#pragma once

#include <tuple>

#include "../score_params.h"
#include "../weighted_params.h"
#include "common.h"

namespace kvstats {

inline void define_lloyd_ops(torch::Library& m) {
  // Rotation + Lloyd–Max: (packed cell indices of (Pi x)/|x|, |x| in norm_dtype).
  m.def("lloyd_encode(Tensor x, Tensor signs, Tensor thresholds, int bits, ScalarType norm_dtype) -> (Tensor, Tensor)");
  // x_hat = Pi^T (|x| * levels[idx]), in the accumulation dtype.
  m.def("lloyd_decode(Tensor packed, Tensor norm, Tensor signs, Tensor levels, int bits, int d) -> Tensor");
  // scores[g, i, j] = norm[g, j] * sum_t q[g, i, t] * levels[idx[g, j, t]]   (q already rotated).
  m.def("lloyd_scores(Tensor q, Tensor packed, Tensor norm, Tensor levels, int bits) -> Tensor");
  // Attention's weighted sum of reconstructions straight from the codes, w [G, n_q, n_k]:
  //   out[g, i, t] = sum_j w[g, i, j] * norm[g, j] * levels[idx[g, j, t]]   (rotated domain; Pi^T after)
  m.def("lloyd_weighted_sum(Tensor w, Tensor packed, Tensor norm, Tensor levels, int bits, int d) -> Tensor");
}

// ------------------------------------------------------------------------------------------- checks
inline void check_lloyd_encode_input(const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds,
                                     int64_t bits) {
  check_bits(bits, "lloyd_encode");
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) >= 2, "lloyd_encode: x must be [N, d] with d >= 2, got ", x.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(x.scalar_type()), "lloyd_encode: x must be a float tensor, got ", x.scalar_type());
  check_rotation_signs(x, signs, x.size(1), acc_dtype_of(x), "lloyd_encode");
  check_table(x, thresholds, (int64_t{1} << bits) - 1, "lloyd_encode", "thresholds");
}

inline void check_lloyd_decode_input(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                                     const at::Tensor& levels, int64_t bits, int64_t d) {
  check_bits(bits, "lloyd_decode");
  TORCH_CHECK_VALUE(d >= 2, "lloyd_decode: d must be >= 2, got ", d);
  check_packed(packed, 2, bits, d, "lloyd_decode");
  check_same_device(packed, norm, "lloyd_decode", "norm");
  TORCH_CHECK_VALUE(norm.dim() == 1 && norm.size(0) == packed.size(0), "lloyd_decode: norm must be [", packed.size(0),
              "], got ", norm.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(norm.scalar_type()), "lloyd_decode: norm must be a float tensor, got ", norm.scalar_type());
  TORCH_CHECK_TYPE(levels.scalar_type() == at::kFloat || levels.scalar_type() == at::kDouble,
              "lloyd_decode: levels must be float32 or float64, got ", levels.scalar_type());
  check_same_device(packed, levels, "lloyd_decode", "levels");
  TORCH_CHECK_VALUE(levels.dim() == 1 && levels.size(0) == (int64_t{1} << bits), "lloyd_decode: levels must have ",
              (int64_t{1} << bits), " entries, got ", levels.sizes());
  check_rotation_signs(packed, signs, d, levels.scalar_type(), "lloyd_decode");
}

inline void check_lloyd_scores_input(const at::Tensor& q, const at::Tensor& packed, const at::Tensor& norm,
                                     const at::Tensor& levels, int64_t bits) {
  check_bits(bits, "lloyd_scores");
  TORCH_CHECK_VALUE(q.dim() == 3, "lloyd_scores: q must be [G, n_q, d], got ", q.sizes());
  TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "lloyd_scores: q must be float32 or float64, got ", q.scalar_type());
  check_packed(packed, 3, bits, q.size(2), "lloyd_scores");
  check_same_device(q, packed, "lloyd_scores", "packed");
  check_same_device(q, norm, "lloyd_scores", "norm");
  TORCH_CHECK_VALUE(packed.size(0) == q.size(0), "lloyd_scores: packed.size(0) must equal q.size(0) = ", q.size(0),
              ", got ", packed.size(0));
  TORCH_CHECK_VALUE(norm.dim() == 2 && norm.size(0) == packed.size(0) && norm.size(1) == packed.size(1),
              "lloyd_scores: norm must be [G, n_k] = ", packed.sizes().slice(0, 2), ", got ", norm.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(norm.scalar_type()), "lloyd_scores: norm must be a float tensor, got ", norm.scalar_type());
  check_table(q, levels, int64_t{1} << bits, "lloyd_scores", "levels");
}

inline void check_lloyd_weighted_sum_input(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm,
                                           const at::Tensor& levels, int64_t bits, int64_t d) {
  check_bits(bits, "lloyd_weighted_sum");
  TORCH_CHECK_VALUE(d >= 2, "lloyd_weighted_sum: d must be >= 2, got ", d);
  check_weighted_keys(w, packed, norm, norm.sizes(), bits, d, "lloyd_weighted_sum", "norm");
  check_table(w, levels, int64_t{1} << bits, "lloyd_weighted_sum", "levels");
}

// ----------------------------------------------------------------------------------------- prologues
// The plain-encode fields of math::LloydEncodeParams for rows [row0, row0 + rows) (rows < 0: to the end) of the
// contiguous x [n, d], writing into packed [n, ceil(d·bits/8)] and norm [n] (x's accumulation dtype); the
// TurboQuant_prod fields are left to TurboProdEncodeArgs.
template <typename scalar_t, typename acc_t>
math::LloydEncodeParams<scalar_t, acc_t> lloyd_encode_params(const at::Tensor& x, const at::Tensor& signs,
                                                             const at::Tensor& thresholds, int64_t bits,
                                                             const at::Tensor& packed, const at::Tensor& norm,
                                                             int64_t row0, int64_t rows) {
  math::LloydEncodeParams<scalar_t, acc_t> p;
  p.d = x.size(1);
  p.n = rows < 0 ? x.size(0) - row0 : rows;
  p.bits = bits;
  p.x = x.const_data_ptr<scalar_t>() + row0 * p.d;
  p.rotation = rotation_of(signs);
  p.thresholds = thresholds.const_data_ptr<acc_t>();
  p.packed = packed.mutable_data_ptr<uint8_t>() + row0 * packed.size(1);
  p.norm = norm.mutable_data_ptr<acc_t>() + row0;
  return p;
}

// x [n, d], signs [P, B] and thresholds [2^bits − 1] contiguous (the tables in x's accumulation dtype); out:
// packed [n, nb] uint8 and norm [n] in the accumulation dtype, the op's result with the norm in `stored`.
struct LloydEncodeArgs {
  at::Tensor x, signs, thresholds, packed, norm;
  int64_t n = 0, d = 0, bits = 0, nb = 0;
  at::ScalarType stored = at::kFloat;

  template <typename scalar_t, typename acc_t>
  math::LloydEncodeParams<scalar_t, acc_t> params(int64_t row0 = 0, int64_t rows = -1) const {
    return lloyd_encode_params<scalar_t, acc_t>(x, signs, thresholds, bits, packed, norm, row0, rows);
  }
  std::tuple<at::Tensor, at::Tensor> result() const { return {packed, norm.to(stored)}; }
};

inline LloydEncodeArgs lloyd_encode_prologue(const at::Tensor& x, const at::Tensor& signs,
                                             const at::Tensor& thresholds, int64_t bits, at::ScalarType norm_dtype) {
  check_lloyd_encode_input(x, signs, thresholds, bits);
  LloydEncodeArgs a;
  a.stored = storage_dtype(x, norm_dtype);
  a.x = x.contiguous();
  a.signs = signs.contiguous();
  a.thresholds = thresholds.contiguous();
  a.n = a.x.size(0);
  a.d = a.x.size(1);
  a.bits = bits;
  a.nb = packed_bytes(a.d, bits);
  a.packed = at::empty({a.n, a.nb}, a.x.options().dtype(at::kByte));
  a.norm = at::empty({a.n}, a.x.options().dtype(a.thresholds.scalar_type()));
  return a;
}

// packed [n, nb] uint8, signs and levels [2^bits] contiguous, norm [n] in levels' dtype; out [n, d] in levels'
// dtype.
struct LloydDecodeArgs {
  at::Tensor packed, norm, signs, levels, out;
  int64_t n = 0, d = 0, bits = 0;

  math::Rotation rotation() const { return rotation_of(signs); }
};

inline LloydDecodeArgs lloyd_decode_prologue(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                                             const at::Tensor& levels, int64_t bits, int64_t d) {
  check_lloyd_decode_input(packed, norm, signs, levels, bits, d);
  LloydDecodeArgs a;
  a.packed = packed.contiguous();
  a.signs = signs.contiguous();
  a.levels = levels.contiguous();
  a.norm = contiguous_in(norm, a.levels.scalar_type());
  a.n = a.packed.size(0);
  a.d = d;
  a.bits = bits;
  a.out = at::empty({a.n, d}, a.levels.options());
  return a;
}

// q [G, n_q, d], packed [G, n_k, nb] and levels contiguous, norm [G, n_k] in q's dtype; out [G, n_q, n_k].
struct LloydScoresArgs {
  at::Tensor q, packed, norm, levels, out;
  int64_t bits = 0;

  template <typename acc_t>
  math::ScoreParams<acc_t> params() const {
    auto p = score_params<acc_t>(out);
    with_code_part(p, q, packed, norm, levels, bits);
    return p;
  }
};

inline LloydScoresArgs lloyd_scores_prologue(const at::Tensor& q, const at::Tensor& packed, const at::Tensor& norm,
                                             const at::Tensor& levels, int64_t bits) {
  check_lloyd_scores_input(q, packed, norm, levels, bits);
  LloydScoresArgs a;
  a.q = q.contiguous();
  a.packed = packed.contiguous();
  a.levels = levels.contiguous();
  a.norm = contiguous_in(norm, a.q.scalar_type());
  a.bits = bits;
  a.out = at::empty({a.q.size(0), a.q.size(1), a.packed.size(1)}, a.q.options());
  return a;
}

// w [G, n_q, n_k], packed [G, n_k, nb] and levels contiguous, norm [G, n_k] in w's dtype; out [G, n_q, d].
struct LloydWeightedSumArgs {
  at::Tensor w, packed, norm, levels, out;
  int64_t bits = 0, d = 0;

  template <typename acc_t>
  math::WeightedSumParams<acc_t> params() const {
    return weighted_level_params<acc_t>(w, packed, norm, levels, bits, out);
  }
};

inline LloydWeightedSumArgs lloyd_weighted_sum_prologue(const at::Tensor& w, const at::Tensor& packed,
                                                        const at::Tensor& norm, const at::Tensor& levels, int64_t bits,
                                                        int64_t d) {
  check_lloyd_weighted_sum_input(w, packed, norm, levels, bits, d);
  LloydWeightedSumArgs a;
  a.w = w.contiguous();
  a.packed = packed.contiguous();
  a.levels = levels.contiguous();
  a.norm = contiguous_in(norm, a.w.scalar_type());
  a.bits = bits;
  a.d = d;
  a.out = at::empty({a.w.size(0), a.w.size(1), d}, a.w.options());
  return a;
}

}  // namespace kvstats
