// The op library's schemas, declared once: both namespaces that implement them include this list —
// `kvstats` (the CPU fast kernels, cpu/, and the CUDA kernels, cuda/) and `kvstats_shared` (the GPU's row
// programs run on the CPU, shared/). Shapes are fixed and small in number: vectors [N, d]; score ops take
// queries [G, n_q, ·] against keys [G, n_k, ·] (G = batch × heads, flattened by kvstats/quant/ops).
// Adding an op: its schema here, its kernels (each registers itself with TORCH_LIBRARY_IMPL), its family
// module in kvstats/quant/ops (docs/kernels.md).
#pragma once

#include <torch/library.h>

namespace kvstats {

inline void define_ops(torch::Library& m) {
  // Orthonormal Walsh–Hadamard transform along the last axis: y = x · H_d / sqrt(d).
  m.def("fwht(Tensor x) -> Tensor");
  // Dense bit packing of codes [N, d] (uint8 < 2^bits) into [N, ceil(d*bits/8)], and back.
  m.def("pack_bits(Tensor codes, int bits) -> Tensor");
  m.def("unpack_bits(Tensor packed, int bits, int d) -> Tensor");
  // Rotation + Lloyd–Max: (packed cell indices of (Pi x)/|x|, |x| in norm_dtype).
  m.def("lloyd_encode(Tensor x, Tensor signs, Tensor thresholds, int bits, ScalarType norm_dtype) -> (Tensor, Tensor)");
  // x_hat = Pi^T (|x| * levels[idx]), in the accumulation dtype.
  m.def("lloyd_decode(Tensor packed, Tensor norm, Tensor signs, Tensor levels, int bits, int d) -> Tensor");
  // scores[g, i, j] = norm[g, j] * sum_t q[g, i, t] * levels[idx[g, j, t]]   (q already rotated).
  m.def("lloyd_scores(Tensor q, Tensor packed, Tensor norm, Tensor levels, int bits) -> Tensor");
  // QJL: (packed sign(S x), |x| in norm_dtype).
  m.def("qjl_encode(Tensor x, Tensor sketch, ScalarType norm_dtype) -> (Tensor, Tensor)");
  // scores[g, i, j] = scale * norm[g, j] * <q_sketch[g, i], b[g, j]>, b = +-1 signs.
  m.def("qjl_scores(Tensor q_sketch, Tensor packed, Tensor norm, float scale) -> Tensor");
  // TurboQuant_prod: (packed (bits)-bit MSE indices, |x|, packed sign(S r), gamma = |r|), r the rotated residual.
  m.def(
      "turbo_prod_encode(Tensor x, Tensor signs, Tensor thresholds, Tensor levels, int bits, Tensor sketch, "
      "ScalarType norm_dtype) -> (Tensor, Tensor, Tensor, Tensor)");
  // lloyd_scores(q, ...) + qjl_scores(q_sketch, ...) in one pass over the keys.
  m.def(
      "turbo_prod_scores(Tensor q, Tensor q_sketch, Tensor packed, Tensor norm, Tensor levels, int bits, "
      "Tensor signs_packed, Tensor gamma, float scale) -> Tensor");
  // Sign decode from byte tables: out[n] = base[n] + weight[n] * sum_p tables[256 p + packed[n, p]]
  // (base absent: 0); B^T b of QJL signs with tables = kvstats.ops.sign_tables(B).
  m.def("sign_decode(Tensor packed, Tensor tables, Tensor weight, Tensor? base) -> Tensor");
  // TurboQuant_prod decode in one pass: sign_decode(signs_packed, tables, weight, lloyd_decode(packed, ...)),
  // tables of S·Pi, so that the sum is Pi^T(|x|·levels[idx] + weight·S^T b).
  m.def(
      "turbo_prod_decode(Tensor packed, Tensor norm, Tensor signs, Tensor levels, int bits, int d, "
      "Tensor signs_packed, Tensor tables, Tensor weight) -> Tensor");
  // Min-max: (packed codes, lo [N, d/group], scale [N, d/group]) in side_dtype.
  m.def("minmax_encode(Tensor x, int group, int bits, ScalarType side_dtype) -> (Tensor, Tensor, Tensor)");
  m.def("minmax_decode(Tensor packed, Tensor lo, Tensor scale, int group, int bits, int d) -> Tensor");
  // Weighted sums of reconstructions straight from the codes (attention's w·V without decoding V), w [G, n_q, n_k]:
  //   lloyd:  out[g, i, t] = sum_j w[g, i, j] * norm[g, j] * levels[idx[g, j, t]]   (rotated domain; Pi^T after)
  //   qjl:    out[g, i, p] = scale * sum_j w[g, i, j] * norm[g, j] * (+-1)[g, j, p]   (S^T after)
  //   minmax: out[g, i, t] = sum_j w[g, i, j] * (lo[g, j, t/group] + scale[g, j, t/group] * code[g, j, t])
  m.def("lloyd_weighted_sum(Tensor w, Tensor packed, Tensor norm, Tensor levels, int bits, int d) -> Tensor");
  m.def("qjl_weighted_sum(Tensor w, Tensor packed, Tensor norm, float scale, int m) -> Tensor");
  m.def(
      "minmax_weighted_sum(Tensor w, Tensor packed, Tensor lo, Tensor scale, int group, int bits, int d) -> Tensor");
  // One decode step of attention from the codes (decode_attention.h): G key groups, each with n_q queries q
  // [G, n_q, d], n_code keys read through the K part's codes and an exact window win_k / win_v [G, w, d]:
  //   logits  = [K-part scores of keys 0 .. n_code - 1, q · win_k^T] * scaling, then softcap * tanh(. / softcap)
  //   weights = softmax over the keys (with one sink logit per query row [G, n_q] joining the sum, then dropped)
  //   out     = weights[..., n_code:] @ win_v + V part's sum_j weights_j * v_hat_j over the code keys
  // A part (k_ or v_): rotation signs [d] (q -> fwht(q * s) before scoring, y -> fwht(y) * s after summing;
  // absent: none), Lloyd codes (packed [G, n_k, .], norm [G, n_k], levels, bits) and/or QJL signs (sketch
  // S [m, d], packed signs [G, n_k, .], norm, scale): the ops above, in the order the unfused path calls them.
  m.def(
      "decode_attention(Tensor q, Tensor win_k, Tensor win_v, int n_code, float scaling, float? softcap, "
      "Tensor? sinks, Tensor? k_rotation, Tensor? k_packed, Tensor? k_norm, Tensor? k_levels, int k_bits, "
      "Tensor? k_sketch, Tensor? k_signs, Tensor? k_sign_norm, float k_sign_scale, Tensor? v_rotation, "
      "Tensor? v_packed, Tensor? v_norm, Tensor? v_levels, int v_bits, Tensor? v_sketch, Tensor? v_signs, "
      "Tensor? v_sign_norm, float v_sign_scale) -> (Tensor, Tensor)");
}

}  // namespace kvstats
