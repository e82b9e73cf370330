// The QJL sketch: the schemas, checks and prologues of qjl_encode, qjl_scores and qjl_weighted_sum
// (prologue/common.h).
#pragma once

#include <tuple>

#include "../score_params.h"
#include "../weighted_params.h"
#include "common.h"

namespace kvstats {

inline void define_qjl_ops(torch::Library& m) {
  // QJL: (packed sign(S x), |x| in norm_dtype).
  m.def("qjl_encode(Tensor x, Tensor sketch, ScalarType norm_dtype) -> (Tensor, Tensor)");
  // scores[g, i, j] = scale * norm[g, j] * <q_sketch[g, i], b[g, j]>, b = +-1 signs.
  m.def("qjl_scores(Tensor q_sketch, Tensor packed, Tensor norm, float scale) -> Tensor");
  // Attention's weighted sum straight from the signs, w [G, n_q, n_k]:
  //   out[g, i, p] = scale * sum_j w[g, i, j] * norm[g, j] * (+-1)[g, j, p]   (S^T after)
  m.def("qjl_weighted_sum(Tensor w, Tensor packed, Tensor norm, float scale, int m) -> Tensor");
}

// ------------------------------------------------------------------------------------------- checks
inline void check_qjl_encode_input(const at::Tensor& x, const at::Tensor& sketch) {
  TORCH_CHECK_VALUE(x.dim() == 2, "qjl_encode: x must be [N, d], got ", x.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(x.scalar_type()), "qjl_encode: x must be a float tensor, got ", x.scalar_type());
  check_same_device(x, sketch, "qjl_encode", "sketch");
  TORCH_CHECK_VALUE(sketch.dim() == 2 && sketch.size(1) == x.size(1), "qjl_encode: sketch must be [m, ", x.size(1),
              "], got ", sketch.sizes());
  TORCH_CHECK_TYPE(sketch.scalar_type() == acc_dtype_of(x), "qjl_encode: sketch must be ", acc_dtype_of(x), ", got ",
              sketch.scalar_type());
}

inline void check_qjl_scores_input(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm) {
  TORCH_CHECK_VALUE(q_sketch.dim() == 3, "qjl_scores: q_sketch must be [G, n_q, m], got ", q_sketch.sizes());
  TORCH_CHECK_TYPE(q_sketch.scalar_type() == at::kFloat || q_sketch.scalar_type() == at::kDouble,
              "qjl_scores: q_sketch must be float32 or float64, got ", q_sketch.scalar_type());
  check_packed(packed, 3, 1, q_sketch.size(2), "qjl_scores");
  check_same_device(q_sketch, packed, "qjl_scores", "packed");
  check_same_device(q_sketch, norm, "qjl_scores", "norm");
  TORCH_CHECK_VALUE(packed.size(0) == q_sketch.size(0), "qjl_scores: packed.size(0) must equal q_sketch.size(0) = ",
              q_sketch.size(0), ", got ", packed.size(0));
  TORCH_CHECK_VALUE(norm.dim() == 2 && norm.size(0) == packed.size(0) && norm.size(1) == packed.size(1),
              "qjl_scores: norm must be [G, n_k] = ", packed.sizes().slice(0, 2), ", got ", norm.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(norm.scalar_type()), "qjl_scores: norm must be a float tensor, got ", norm.scalar_type());
}

inline void check_qjl_weighted_sum_input(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm,
                                         int64_t m) {
  TORCH_CHECK_VALUE(m >= 1, "qjl_weighted_sum: m must be >= 1, got ", m);
  check_weighted_keys(w, packed, norm, norm.sizes(), 1, m, "qjl_weighted_sum", "norm");
}

// ----------------------------------------------------------------------------------------- prologues
// The per-key weights of a sign part, w = scale · norm (math::qjl_key_weight) in `dtype`: each backend passes
// its own map of it to the prologues (qjl_weights_cpu in score_params.h, cuda::qjl_weights).
using KeyWeightsFn = at::Tensor (*)(const at::Tensor& norm, at::ScalarType dtype, double scale);

// x [n, d] as given (the kernels read it in the sketch's dtype: x_in_sketch_dtype(), or by blocks of rows),
// sketch [m, d] contiguous; out: packed [n, mb] uint8 (the signs of S x) and norm [n] in the sketch's dtype,
// the op's result with the norm in `stored`.
struct QjlEncodeArgs {
  at::Tensor x, sketch, packed, norm;
  int64_t n = 0, d = 0, m = 0, mb = 0;
  at::ScalarType stored = at::kFloat;

  at::Tensor x_in_sketch_dtype() const { return contiguous_in(x, sketch.scalar_type()); }
  std::tuple<at::Tensor, at::Tensor> result() const { return {packed, norm.to(stored)}; }
};

inline QjlEncodeArgs qjl_encode_prologue(const at::Tensor& x, const at::Tensor& sketch, at::ScalarType norm_dtype) {
  check_qjl_encode_input(x, sketch);
  QjlEncodeArgs a;
  a.stored = storage_dtype(x, norm_dtype);
  a.x = x;
  a.sketch = sketch.contiguous();
  a.n = x.size(0);
  a.d = x.size(1);
  a.m = a.sketch.size(0);
  a.mb = packed_bytes(a.m, 1);
  a.packed = at::empty({a.n, a.mb}, x.options().dtype(at::kByte));
  a.norm = at::empty({a.n}, a.sketch.options());
  return a;
}

// q_sketch [G, n_q, m] and packed [G, n_k, mb] contiguous, key_w [G, n_k] the per-key weights in q_sketch's
// dtype; out [G, n_q, n_k].
struct QjlScoresArgs {
  at::Tensor q_sketch, packed, key_w, out;

  template <typename acc_t>
  math::ScoreParams<acc_t> params() const {
    auto p = score_params<acc_t>(out);
    with_sign_part(p, q_sketch, packed, key_w);
    return p;
  }
};

inline QjlScoresArgs qjl_scores_prologue(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm,
                                         double scale, KeyWeightsFn key_weights) {
  check_qjl_scores_input(q_sketch, packed, norm);
  QjlScoresArgs a;
  a.q_sketch = q_sketch.contiguous();
  a.packed = packed.contiguous();
  a.key_w = key_weights(norm, a.q_sketch.scalar_type(), scale);
  a.out = at::empty({a.q_sketch.size(0), a.q_sketch.size(1), a.packed.size(1)}, a.q_sketch.options());
  return a;
}

// w [G, n_q, n_k] and packed [G, n_k, mb] contiguous, key_w [G, n_k] the per-key weights in w's dtype;
// out [G, n_q, m].
struct QjlWeightedSumArgs {
  at::Tensor w, packed, key_w, out;
  int64_t m = 0;

  template <typename acc_t>
  math::WeightedSumParams<acc_t> params() const {
    return weighted_level_params<acc_t>(w, packed, key_w, at::Tensor(), 1, out);
  }
};

inline QjlWeightedSumArgs qjl_weighted_sum_prologue(const at::Tensor& w, const at::Tensor& packed,
                                                    const at::Tensor& norm, double scale, int64_t m,
                                                    KeyWeightsFn key_weights) {
  check_qjl_weighted_sum_input(w, packed, norm, m);
  QjlWeightedSumArgs a;
  a.w = w.contiguous();
  a.packed = packed.contiguous();
  a.key_w = key_weights(norm, a.w.scalar_type(), scale);
  a.m = m;
  a.out = at::empty({a.w.size(0), a.w.size(1), m}, a.w.options());
  return a;
}

}  // namespace kvstats
