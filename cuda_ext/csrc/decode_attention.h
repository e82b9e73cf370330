// decode_attention: one decode step of attention from the codes in one call. It is composed from
// the library's own ops, called through the dispatcher in the namespace of the backend that registered it, and
// from ATen's matmul and softmax, in the order the unfused path calls them (kvstats/hf/cache_layer.py:
// KVStatsLayer._attend_last with the quantizers' plans), so that its numbers are that path's on every backend.
// What the one call saves is the Python between the ops: about 40 op calls per layer and generated token.
//
// Shapes (G key groups = batch × KV heads, n_q queries per group = the GQA group of one decode step):
//   q [G, n_q, d], win_k / win_v [G, w, d] (fp32, or fp64), n_code ≤ n_k code keys before the window;
//   a part's codes [G, n_k, ·] and norms [G, n_k], levels [2^bits], sketch [m, d], rotation signs [d];
//   sinks [G, n_q]; out [G, n_q, d], weights [G, n_q, n_code + w].
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace kvstats {

// Which ops a decode_attention composes: the fast kernels (`kvstats`: CPU and CUDA) or the GPU's row
// programs on the CPU (`kvstats_shared`).
enum class OpNamespace { kFast, kShared };

// The op's C++ signature (the schema's arguments in order), once: the composition is declared, instantiated and
// registered through it.
using DecodeAttention = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor& q, const at::Tensor& win_k, const at::Tensor& win_v, int64_t n_code, double scaling,
    std::optional<double> softcap, const std::optional<at::Tensor>& sinks,
    const std::optional<at::Tensor>& k_rotation, const std::optional<at::Tensor>& k_packed,
    const std::optional<at::Tensor>& k_norm, const std::optional<at::Tensor>& k_levels, int64_t k_bits,
    const std::optional<at::Tensor>& k_sketch, const std::optional<at::Tensor>& k_signs,
    const std::optional<at::Tensor>& k_sign_norm, double k_sign_scale, const std::optional<at::Tensor>& v_rotation,
    const std::optional<at::Tensor>& v_packed, const std::optional<at::Tensor>& v_norm,
    const std::optional<at::Tensor>& v_levels, int64_t v_bits, const std::optional<at::Tensor>& v_sketch,
    const std::optional<at::Tensor>& v_signs, const std::optional<at::Tensor>& v_sign_norm, double v_sign_scale);

template <OpNamespace NS>
DecodeAttention decode_attention;

inline void define_decode_attention_ops(torch::Library& m) {
  // One decode step of attention from the codes: G key groups, each with n_q queries q [G, n_q, d], n_code
  // keys read through the K part's codes and an exact window win_k / win_v [G, w, d]:
  //   logits  = [K-part scores of keys 0 .. n_code - 1, q · win_k^T] * scaling, then softcap * tanh(. / softcap)
  //   weights = softmax over the keys (with one sink logit per query row [G, n_q] joining the sum, then dropped)
  //   out     = weights[..., n_code:] @ win_v + V part's sum_j weights_j * v_hat_j over the code keys
  // A part (k_ or v_): rotation signs [d] (q -> fwht(q * s) before scoring, y -> fwht(y) * s after summing;
  // absent: none), Lloyd codes (packed [G, n_k, .], norm [G, n_k], levels, bits) and/or QJL signs (sketch
  // S [m, d], packed signs [G, n_k, .], norm, scale): the library's ops, in the order the unfused path calls them.
  m.def(
      "decode_attention(Tensor q, Tensor win_k, Tensor win_v, int n_code, float scaling, float? softcap, "
      "Tensor? sinks, Tensor? k_rotation, Tensor? k_packed, Tensor? k_norm, Tensor? k_levels, int k_bits, "
      "Tensor? k_sketch, Tensor? k_signs, Tensor? k_sign_norm, float k_sign_scale, Tensor? v_rotation, "
      "Tensor? v_packed, Tensor? v_norm, Tensor? v_levels, int v_bits, Tensor? v_sketch, Tensor? v_signs, "
      "Tensor? v_sign_norm, float v_sign_scale) -> (Tensor, Tensor)");
}

}  // namespace kvstats
