// KIVI-style min-max quantization along the vector (groups of `group` coordinates): the schemas, checks and
// prologues of minmax_encode, minmax_decode and minmax_weighted_sum (prologue/common.h).
#pragma once

#include <tuple>
#include <utility>

#include "../weighted_params.h"
#include "common.h"

namespace kvstats {

inline void define_minmax_ops(torch::Library& m) {
  // Min-max: (packed codes, lo [N, d/group], scale [N, d/group]) in side_dtype.
  m.def("minmax_encode(Tensor x, int group, int bits, ScalarType side_dtype) -> (Tensor, Tensor, Tensor)");
  m.def("minmax_decode(Tensor packed, Tensor lo, Tensor scale, int group, int bits, int d) -> Tensor");
  // Attention's weighted sum straight from the codes, w [G, n_q, n_k]:
  //   out[g, i, t] = sum_j w[g, i, j] * (lo[g, j, t/group] + scale[g, j, t/group] * code[g, j, t])
  m.def(
      "minmax_weighted_sum(Tensor w, Tensor packed, Tensor lo, Tensor scale, int group, int bits, int d) -> Tensor");
}

// ------------------------------------------------------------------------------------------- checks
inline void check_minmax_encode_input(const at::Tensor& x, int64_t group, int64_t bits) {
  check_bits(bits, "minmax_encode");
  TORCH_CHECK_VALUE(x.dim() == 2, "minmax_encode: x must be [N, d], got ", x.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(x.scalar_type()), "minmax_encode: x must be a float tensor, got ", x.scalar_type());
  TORCH_CHECK_VALUE(group >= 1 && x.size(1) % group == 0, "minmax_encode: group must divide d = ", x.size(1), ", got ",
              group);
}

inline void check_minmax_decode_input(const at::Tensor& packed, const at::Tensor& lo, const at::Tensor& scale,
                                      int64_t group, int64_t bits, int64_t d) {
  check_bits(bits, "minmax_decode");
  TORCH_CHECK_VALUE(group >= 1 && d % group == 0, "minmax_decode: group must divide d = ", d, ", got ", group);
  check_packed(packed, 2, bits, d, "minmax_decode");
  for (const at::Tensor* t : {&lo, &scale}) {
    check_same_device(packed, *t, "minmax_decode", "lo/scale");
    TORCH_CHECK_VALUE(t->dim() == 2 && t->size(0) == packed.size(0) && t->size(1) == d / group,
                "minmax_decode: lo and scale must be [", packed.size(0), ", ", d / group, "], got ", t->sizes());
    TORCH_CHECK_TYPE(is_float_dtype(t->scalar_type()), "minmax_decode: lo and scale must be float tensors, got ", t->scalar_type());
  }
}

inline void check_minmax_weighted_sum_input(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& lo,
                                            const at::Tensor& scale, int64_t group, int64_t bits, int64_t d) {
  const char* op = "minmax_weighted_sum";
  check_bits(bits, op);
  TORCH_CHECK_VALUE(group >= 1 && d % group == 0, op, ": group must divide d = ", d, ", got ", group);
  // The fake checks lo[..., 0] as the per-key tensor: lo's sizes without the last axis when it has three.
  check_weighted_keys(w, packed, lo, lo.dim() == 3 ? lo.sizes().slice(0, 2) : lo.sizes(), bits, d, op, "lo");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"lo", &lo}, {"scale", &scale}}) {
    check_same_device(w, *t, op, name);
    TORCH_CHECK_VALUE(t->dim() == 3 && t->size(0) == packed.size(0) && t->size(1) == packed.size(1) &&
                          t->size(2) == d / group,
                      op, ": ", name, " must be [G, n_k, d/group] = [", packed.size(0), ", ", packed.size(1), ", ",
                      d / group, "], got ", t->sizes());
    TORCH_CHECK_TYPE(is_float_dtype(t->scalar_type()), op, ": ", name, " must be a float tensor, got ",
                     t->scalar_type());
  }
}

// ----------------------------------------------------------------------------------------- prologues
// x [n, d] contiguous; out: packed [n, nb] uint8 and, per group of `group` coordinates (ng = d / group per
// row), lo and step [n, ng] in x's accumulation dtype, both returned in the side dtype `side`.
struct MinMaxEncodeArgs {
  at::Tensor x, packed, lo, step;
  int64_t n = 0, d = 0, group = 0, bits = 0, ng = 0, nb = 0;
  at::ScalarType side = at::kFloat;

  std::tuple<at::Tensor, at::Tensor, at::Tensor> result() const { return {packed, lo.to(side), step.to(side)}; }
};

inline MinMaxEncodeArgs minmax_encode_prologue(const at::Tensor& x, int64_t group, int64_t bits,
                                               at::ScalarType side_dtype) {
  check_minmax_encode_input(x, group, bits);
  MinMaxEncodeArgs a;
  a.x = x.contiguous();
  a.n = a.x.size(0);
  a.d = a.x.size(1);
  a.group = group;
  a.bits = bits;
  a.ng = a.d / group;
  a.nb = packed_bytes(a.d, bits);
  a.side = storage_dtype(x, side_dtype);
  const at::ScalarType acc = acc_dtype_of(a.x);
  a.packed = at::empty({a.n, a.nb}, a.x.options().dtype(at::kByte));
  a.lo = at::empty({a.n, a.ng}, a.x.options().dtype(acc));
  a.step = at::empty({a.n, a.ng}, a.x.options().dtype(acc));
  return a;
}

// packed [n, nb] uint8 contiguous, lo and step (the op's `scale`) [n, ng] contiguous in lo's accumulation
// dtype; out [n, d] in that dtype.
struct MinMaxDecodeArgs {
  at::Tensor packed, lo, step, out;
  int64_t n = 0, d = 0, group = 0, bits = 0, ng = 0, nb = 0;
};

inline MinMaxDecodeArgs minmax_decode_prologue(const at::Tensor& packed, const at::Tensor& lo,
                                               const at::Tensor& scale, int64_t group, int64_t bits, int64_t d) {
  check_minmax_decode_input(packed, lo, scale, group, bits, d);
  MinMaxDecodeArgs a;
  const at::ScalarType acc = acc_dtype_of(lo);
  a.packed = packed.contiguous();
  a.lo = contiguous_in(lo, acc);
  a.step = contiguous_in(scale, acc);
  a.n = a.packed.size(0);
  a.d = d;
  a.group = group;
  a.bits = bits;
  a.ng = d / group;
  a.nb = a.packed.size(1);
  a.out = at::empty({a.n, d}, a.lo.options());
  return a;
}

// w [G, n_q, n_k] and packed [G, n_k, nb] contiguous, lo and step (the op's `scale`) [G, n_k, d/group]
// contiguous in w's dtype; out [G, n_q, d].
struct MinMaxWeightedSumArgs {
  at::Tensor w, packed, lo, step, out;
  int64_t group = 0, bits = 0, d = 0;

  template <typename acc_t>
  math::WeightedSumParams<acc_t> params() const {
    return weighted_minmax_params<acc_t>(w, packed, lo, step, group, bits, out);
  }
};

inline MinMaxWeightedSumArgs minmax_weighted_sum_prologue(const at::Tensor& w, const at::Tensor& packed,
                                                          const at::Tensor& lo, const at::Tensor& scale,
                                                          int64_t group, int64_t bits, int64_t d) {
  check_minmax_weighted_sum_input(w, packed, lo, scale, group, bits, d);
  MinMaxWeightedSumArgs a;
  a.w = w.contiguous();
  a.packed = packed.contiguous();
  a.lo = contiguous_in(lo, a.w.scalar_type());
  a.step = contiguous_in(scale, a.w.scalar_type());
  a.group = group;
  a.bits = bits;
  a.d = d;
  a.out = at::empty({a.w.size(0), a.w.size(1), d}, a.w.options());
  return a;
}

}  // namespace kvstats
