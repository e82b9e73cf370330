// decode_attention (decode_attention.h): the composition, for both namespaces; each backend registers it in
// its own file (cpu/, shared/, cuda/).
#include "decode_attention.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "prologue/common.h"

namespace kvstats {
namespace {

constexpr const char* kOp = "decode_attention";

template <typename Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* ns, const char* name) {
  const std::string full = std::string(ns) + "::" + name;
  return c10::Dispatcher::singleton().findSchemaOrThrow(full.c_str(), "").typed<Sig>();
}

using T = const at::Tensor&;

// The library ops a step calls, looked up once per namespace.
struct StepOps {
  c10::TypedOperatorHandle<at::Tensor(T)> fwht;
  c10::TypedOperatorHandle<at::Tensor(T, T, T, T, int64_t)> lloyd_scores;
  c10::TypedOperatorHandle<at::Tensor(T, T, T, double)> qjl_scores;
  c10::TypedOperatorHandle<at::Tensor(T, T, T, T, T, int64_t, T, T, double)> turbo_prod_scores;
  c10::TypedOperatorHandle<at::Tensor(T, T, T, T, int64_t, int64_t)> lloyd_weighted_sum;
  c10::TypedOperatorHandle<at::Tensor(T, T, T, double, int64_t)> qjl_weighted_sum;

  explicit StepOps(const char* ns)
      : fwht(find_op<at::Tensor(T)>(ns, "fwht")),
        lloyd_scores(find_op<at::Tensor(T, T, T, T, int64_t)>(ns, "lloyd_scores")),
        qjl_scores(find_op<at::Tensor(T, T, T, double)>(ns, "qjl_scores")),
        turbo_prod_scores(find_op<at::Tensor(T, T, T, T, T, int64_t, T, T, double)>(ns, "turbo_prod_scores")),
        lloyd_weighted_sum(find_op<at::Tensor(T, T, T, T, int64_t, int64_t)>(ns, "lloyd_weighted_sum")),
        qjl_weighted_sum(find_op<at::Tensor(T, T, T, double, int64_t)>(ns, "qjl_weighted_sum")) {}
};

template <OpNamespace NS>
const StepOps& step_ops() {
  static const StepOps ops(NS == OpNamespace::kFast ? "kvstats" : "kvstats_shared");
  return ops;
}

// One side's codes (the K or V quantizer's): an optional rotation, a Lloyd part and/or a sign part.
struct Part {
  const char* side;  // "k" or "v": the arguments' prefix in messages
  const std::optional<at::Tensor>& rotation;
  const std::optional<at::Tensor>& packed;
  const std::optional<at::Tensor>& norm;
  const std::optional<at::Tensor>& levels;
  int64_t bits;
  const std::optional<at::Tensor>& sketch;
  const std::optional<at::Tensor>& signs;
  const std::optional<at::Tensor>& sign_norm;
  double sign_scale;

  bool lloyd() const { return packed.has_value(); }
  bool sign() const { return sketch.has_value(); }
  int64_t keys() const { return lloyd() ? packed->size(1) : signs->size(1); }
};

void check_part(const Part& p, const at::Tensor& q, int64_t n_code) {
  const int64_t groups = q.size(0), d = q.size(2);
  const std::string s = p.side;
  TORCH_CHECK_VALUE(p.packed.has_value() == p.norm.has_value() && p.packed.has_value() == p.levels.has_value(), kOp,
                    ": ", s, "_packed, ", s, "_norm and ", s, "_levels must be given together (a Lloyd part), got ",
                    p.packed.has_value(), ", ", p.norm.has_value(), ", ", p.levels.has_value());
  TORCH_CHECK_VALUE(p.sketch.has_value() == p.signs.has_value() && p.sketch.has_value() == p.sign_norm.has_value(),
                    kOp, ": ", s, "_sketch, ", s, "_signs and ", s, "_sign_norm must be given together (a sign part), "
                    "got ", p.sketch.has_value(), ", ", p.signs.has_value(), ", ", p.sign_norm.has_value());
  TORCH_CHECK_VALUE(p.lloyd() || p.sign(), kOp, ": n_code = ", n_code, " keys need the ", s,
                    " codes: a Lloyd part, a sign part or both");
  if (p.rotation.has_value()) {
    check_same_device(q, *p.rotation, kOp, (s + "_rotation").c_str());
    TORCH_CHECK_VALUE(p.rotation->dim() == 1 && p.rotation->size(0) == d, kOp, ": ", s, "_rotation must be [", d,
                      "] (the signs of one Hadamard pass), got ", p.rotation->sizes());
    TORCH_CHECK_TYPE(p.rotation->scalar_type() == q.scalar_type(), kOp, ": ", s, "_rotation must be ",
                     q.scalar_type(), ", got ", p.rotation->scalar_type());
  }
  if (p.sign()) {
    check_same_device(q, *p.sketch, kOp, (s + "_sketch").c_str());
    TORCH_CHECK_VALUE(p.sketch->dim() == 2 && p.sketch->size(1) == d, kOp, ": ", s, "_sketch must be [m, ", d,
                      "], got ", p.sketch->sizes());
    TORCH_CHECK_TYPE(p.sketch->scalar_type() == q.scalar_type(), kOp, ": ", s, "_sketch must be ", q.scalar_type(),
                     ", got ", p.sketch->scalar_type());
  }
  if (p.lloyd()) {
    TORCH_CHECK_VALUE(p.bits >= 1 && p.bits <= 8, kOp, ": ", s, "_bits must be in [1, 8], got ", p.bits);
    check_same_device(q, *p.levels, kOp, (s + "_levels").c_str());
    TORCH_CHECK_VALUE(p.levels->dim() == 1 && p.levels->size(0) == (int64_t{1} << p.bits), kOp, ": ", s,
                      "_levels must be 1-D of length 2^", s, "_bits = ", int64_t{1} << p.bits, ", got ",
                      p.levels->sizes());
    TORCH_CHECK_TYPE(p.levels->scalar_type() == q.scalar_type(), kOp, ": ", s, "_levels must be ", q.scalar_type(),
                     ", got ", p.levels->scalar_type());
  }
  if (p.sign()) {
    TORCH_CHECK_VALUE(std::isfinite(p.sign_scale), kOp, ": ", s, "_sign_scale must be finite, got ", p.sign_scale);
  }
  // codes [G, n_k >= n_code, bytes of a row] uint8 and their per-key factors [G, n_k] float, on q's device
  const int64_t m = p.sign() ? p.sketch->size(0) : 0;
  const std::pair<const std::optional<at::Tensor>*, const std::optional<at::Tensor>*> pairs[] = {{&p.packed, &p.norm},
                                                                                                {&p.signs, &p.sign_norm}};
  for (const auto& [codes, factor] : pairs) {
    if (!codes->has_value()) continue;
    const bool lloyd = codes == &p.packed;
    const std::string name = s + (lloyd ? "_packed" : "_signs"), factor_name = s + (lloyd ? "_norm" : "_sign_norm");
    const int64_t row_bytes = lloyd ? packed_bytes(d, p.bits) : packed_bytes(m, 1);
    check_same_device(q, **codes, kOp, name.c_str());
    check_same_device(q, **factor, kOp, factor_name.c_str());
    TORCH_CHECK_TYPE((*codes)->scalar_type() == at::kByte, kOp, ": ", name, " must be uint8, got ",
                     (*codes)->scalar_type());
    TORCH_CHECK_VALUE((*codes)->dim() == 3 && (*codes)->size(0) == groups && (*codes)->size(1) >= n_code &&
                          (*codes)->size(2) == row_bytes,
                      kOp, ": ", name, " must be [", groups, ", n_k >= n_code = ", n_code, ", ", row_bytes, "], got ",
                      (*codes)->sizes());
    TORCH_CHECK_VALUE((*factor)->dim() == 2 && (*factor)->size(0) == groups && (*factor)->size(1) == (*codes)->size(1),
                      kOp, ": ", factor_name, " must be [", groups, ", ", (*codes)->size(1), "] (one per key of ", name,
                      "), got ", (*factor)->sizes());
    TORCH_CHECK_TYPE(is_float_dtype((*factor)->scalar_type()), kOp, ": ", factor_name, " must be a float tensor, got ",
                     (*factor)->scalar_type());
  }
  TORCH_CHECK_VALUE(!(p.lloyd() && p.sign()) || p.packed->size(1) == p.signs->size(1), kOp, ": ", s, "_packed and ",
                    s, "_signs must hold the same keys, got ", p.packed->size(1), " and ", p.signs->size(1));
}

void check_inputs(const at::Tensor& q, const at::Tensor& win_k, const at::Tensor& win_v, int64_t n_code,
                  double scaling, std::optional<double> softcap, const std::optional<at::Tensor>& sinks) {
  TORCH_CHECK_VALUE(q.dim() == 3, kOp, ": q must be [G, n_q, d], got ", q.sizes());
  TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble, kOp,
                   ": q must be float32 or float64 (the accumulation dtype), got ", q.scalar_type());
  for (const at::Tensor* t : {&win_k, &win_v}) {
    const char* name = t == &win_k ? "win_k" : "win_v";
    check_same_device(q, *t, kOp, name);
    TORCH_CHECK_VALUE(t->dim() == 3 && t->size(0) == q.size(0) && t->size(2) == q.size(2), kOp, ": ", name,
                      " must be [", q.size(0), ", w, ", q.size(2), "], got ", t->sizes());
    TORCH_CHECK_TYPE(t->scalar_type() == q.scalar_type(), kOp, ": ", name, " must be ", q.scalar_type(), ", got ",
                     t->scalar_type());
  }
  TORCH_CHECK_VALUE(win_k.size(1) == win_v.size(1), kOp, ": win_k and win_v must hold the same tokens, got ",
                    win_k.size(1), " and ", win_v.size(1));
  TORCH_CHECK_VALUE(n_code >= 0, kOp, ": n_code must be >= 0, got ", n_code);
  TORCH_CHECK_VALUE(n_code + win_k.size(1) >= 1, kOp, ": a step needs at least one key, got n_code = 0 and an "
                    "empty window");
  const double largest = q.scalar_type() == at::kDouble ? std::numeric_limits<double>::max()
                                                        : static_cast<double>(std::numeric_limits<float>::max());
  TORCH_CHECK_VALUE(std::isfinite(scaling) && std::abs(scaling) <= largest, kOp, ": scaling must be finite in ",
                    q.scalar_type(), " (|scaling| <= ", largest, "), got ", scaling);
  TORCH_CHECK_VALUE(!softcap.has_value() || (std::isfinite(*softcap) && *softcap > 0), kOp,
                    ": softcap must be a finite positive number or None, got ", softcap.value_or(0.0));
  if (sinks.has_value()) {
    check_same_device(q, *sinks, kOp, "sinks");
    TORCH_CHECK_VALUE(sinks->dim() == 2 && sinks->size(0) == q.size(0) && sinks->size(1) == q.size(1), kOp,
                      ": sinks must be [", q.size(0), ", ", q.size(1), "] (one logit per query row), got ",
                      sinks->sizes());
    TORCH_CHECK_TYPE(sinks->scalar_type() == q.scalar_type(), kOp, ": sinks must be ", q.scalar_type(), ", got ",
                     sinks->scalar_type());
    TORCH_CHECK_VALUE(at::isfinite(*sinks).all().item<bool>(), kOp, ": sinks must be finite, got ",
                      sinks->masked_select(at::logical_not(at::isfinite(*sinks))).flatten()[0].item<double>());
  }
}

// x [..., K] @ m [K, N] as kvstats.ops.rows_matmul: up to kRowsOneByOne rows one product per row (bmm), whose sums
// BLAS never splits between threads (MKL's few-row sgemm does), so that a step does not depend on the thread count.
constexpr int64_t kRowsOneByOne = 64;  // = kvstats.ops.ROWS_ONE_BY_ONE

at::Tensor rows_matmul(const at::Tensor& x, const at::Tensor& m) {
  const int64_t k = x.size(-1), rows = k ? x.numel() / k : 0;
  if (rows == 0 || rows > kRowsOneByOne) return at::matmul(x, m);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = m.size(-1);
  return at::bmm(x.reshape({rows, 1, k}), m.expand({rows, m.size(0), m.size(1)})).view(sizes);
}

// Scores of q [G, n_q, d] against every key of the part's codes: [G, n_q, n_k] (the K quantizers' inner_plan:
// rotate the queries, then lloyd_scores, qjl_scores of S q, or turbo_prod_scores of both).
at::Tensor code_scores(const StepOps& ops, const at::Tensor& q, const Part& k) {
  const at::Tensor qr = k.rotation.has_value() ? ops.fwht.call(q * *k.rotation) : q;
  if (k.lloyd() && k.sign()) {
    return ops.turbo_prod_scores.call(qr, rows_matmul(qr, k.sketch->t()), *k.packed, *k.norm, *k.levels, k.bits,
                                      *k.signs, *k.sign_norm, k.sign_scale);
  }
  if (k.lloyd()) return ops.lloyd_scores.call(qr, *k.packed, *k.norm, *k.levels, k.bits);
  return ops.qjl_scores.call(rows_matmul(qr, k.sketch->t()), *k.signs, *k.sign_norm, k.sign_scale);
}

// Σ_j w_ij v̂_j [G, n_q, d] for weights w [G, n_q, n_k] over every key of the part's codes (the V quantizers'
// weighted_sum_plan: the Lloyd part's sum, plus the sign part's sum times S, then the inverse rotation).
at::Tensor code_values(const StepOps& ops, const at::Tensor& w, const Part& v, int64_t d) {
  at::Tensor out;
  if (v.lloyd()) out = ops.lloyd_weighted_sum.call(w, *v.packed, *v.norm, *v.levels, v.bits, d);
  if (v.sign()) {
    const at::Tensor signed_part =
        rows_matmul(ops.qjl_weighted_sum.call(w, *v.signs, *v.sign_norm, v.sign_scale, v.sketch->size(0)), *v.sketch);
    out = out.defined() ? out + signed_part : signed_part;
  }
  return v.rotation.has_value() ? ops.fwht.call(out) * *v.rotation : out;
}

}  // namespace

template <OpNamespace NS>
std::tuple<at::Tensor, at::Tensor> decode_attention(
    const at::Tensor& q, const at::Tensor& win_k, const at::Tensor& win_v, int64_t n_code, double scaling,
    std::optional<double> softcap, const std::optional<at::Tensor>& sinks,
    const std::optional<at::Tensor>& k_rotation, const std::optional<at::Tensor>& k_packed,
    const std::optional<at::Tensor>& k_norm, const std::optional<at::Tensor>& k_levels, int64_t k_bits,
    const std::optional<at::Tensor>& k_sketch, const std::optional<at::Tensor>& k_signs,
    const std::optional<at::Tensor>& k_sign_norm, double k_sign_scale, const std::optional<at::Tensor>& v_rotation,
    const std::optional<at::Tensor>& v_packed, const std::optional<at::Tensor>& v_norm,
    const std::optional<at::Tensor>& v_levels, int64_t v_bits, const std::optional<at::Tensor>& v_sketch,
    const std::optional<at::Tensor>& v_signs, const std::optional<at::Tensor>& v_sign_norm, double v_sign_scale) {
  check_inputs(q, win_k, win_v, n_code, scaling, softcap, sinks);
  const Part k{"k", k_rotation, k_packed, k_norm, k_levels, k_bits, k_sketch, k_signs, k_sign_norm, k_sign_scale};
  const Part v{"v", v_rotation, v_packed, v_norm, v_levels, v_bits, v_sketch, v_signs, v_sign_norm, v_sign_scale};
  if (n_code > 0) {
    check_part(k, q, n_code);
    check_part(v, q, n_code);
  }
  const StepOps& ops = step_ops<NS>();
  const int64_t n_win = win_k.size(1), d = q.size(2);
  // The window's products as the unfused path forms them ([B, H_kv, ·, ·] @ [B, H_kv, ·, ·]): one leading axis
  // more, so that matmul folds the same batch the same way.
  const at::Tensor exact = at::matmul(q.unsqueeze(0), win_k.unsqueeze(0).transpose(-1, -2)).squeeze(0);
  at::Tensor logits = n_code > 0 ? at::cat({code_scores(ops, q, k).narrow(-1, 0, n_code), exact}, -1) : exact;
  logits.mul_(scaling);
  if (softcap.has_value()) logits = at::tanh(logits / *softcap) * *softcap;
  const at::Tensor weights =
      sinks.has_value()
          ? at::softmax(at::cat({logits, sinks->unsqueeze(-1)}, -1), -1).narrow(-1, 0, n_code + n_win).contiguous()
          : at::softmax(logits, -1);
  at::Tensor out = at::matmul(weights.narrow(-1, n_code, n_win).unsqueeze(0), win_v.unsqueeze(0)).squeeze(0);
  if (n_code > 0) {
    at::Tensor w = weights.narrow(-1, 0, n_code);
    const int64_t n_values = v.keys();
    if (n_values > n_code) w = at::constant_pad_nd(w, {0, n_values - n_code});  // codes ahead: weight 0
    out.add_(code_values(ops, w, v, d));
  }
  // finite inputs can still overflow a logit or a sum in q's dtype: the step is refused, never returned as NaN/inf
  TORCH_CHECK_VALUE(at::isfinite(out).all().item<bool>(), kOp, ": the output is not finite (a logit or a weighted ",
                    "sum overflowed ", q.scalar_type(), ", or q or the window hold a non-finite value); rescale the ",
                    "inputs or pass float64");
  return {out, weights};
}

template DecodeAttention decode_attention<OpNamespace::kFast>;
template DecodeAttention decode_attention<OpNamespace::kShared>;

}  // namespace kvstats
