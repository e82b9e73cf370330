// Weighted sums of reconstructions straight from the packed codes (attention's w·V without decoding V):
//   lloyd:  out[g, i, t] = Σ_j w[g, i, j] · norm[g, j] · levels[code[g, j, t]]
//   qjl:    out[g, i, t] = Σ_j w[g, i, j] · (scale · norm[g, j]) · (±1)[g, j, t]
//   minmax: out[g, i, t] = Σ_j w[g, i, j] · x̂[g, j, t],  x̂ = minmax_value(lo, step, code)
// The parameters of a launch and one output element, summed over the keys in key order (the GPU's
// one-thread-per-element loop, the CPU's shared path). The fast CPU kernels (cpu/weighted_sum_cpu.cpp)
// reorder the same terms.
#pragma once

#include <cstdint>

#include "../bitpack.h"
#include "minmax.h"
#include "scalar.h"
#include "signs.h"

namespace kvstats {
namespace math {

// A key's weight for query i: w[g, i, j] · key_w[g, j] (key_w: ‖x‖, or qjl_key_weight(‖k‖, scale)).
template <typename acc_t>
KVSTATS_HD acc_t weighted_key_coefficient(acc_t w, acc_t key_w) {
  return w * key_w;
}

enum class WeightedKind { kLevels, kSigns, kMinMax };

// One weighted-sum launch, named fields: out [G, nq, d] from w [G, nq, nk] and the keys' codes
// [G, nk, ceil(d·bits/8)]; kLevels reads key_w [G, nk] and levels [2^bits], kSigns key_w (bits = 1, d = m),
// kMinMax lo and step [G, nk, d/group].
template <typename acc_t>
struct WeightedSumParams {
  WeightedKind kind = WeightedKind::kLevels;
  int64_t G = 0, nq = 0, nk = 0, d = 0, bits = 0;
  const acc_t* w = nullptr;
  const uint8_t* codes = nullptr;
  const acc_t* key_w = nullptr;
  const acc_t* levels = nullptr;
  const acc_t* lo = nullptr;
  const acc_t* step = nullptr;
  int64_t group = 1;
  acc_t* out = nullptr;
};

// Term of key j (row `key` = g·nk + j) for element t with attention weight w.
template <typename acc_t>
KVSTATS_HD acc_t weighted_term(const WeightedSumParams<acc_t>& p, const acc_t* levels, acc_t w, int64_t key,
                               int64_t t) {
  const int64_t nb = packed_bytes(p.d, p.bits);
  const uint8_t* row = p.codes + key * nb;
  if (p.kind == WeightedKind::kMinMax) {
    const int64_t gi = key * (p.d / p.group) + t / p.group;
    return w * minmax_value(p.lo[gi], p.step[gi], unpack_code(row, nb, p.bits, t));
  }
  const acc_t c = weighted_key_coefficient(w, p.key_w[key]);
  if (p.kind == WeightedKind::kSigns) return sign_value(sign_bit_at(row, t), c);
  return c * levels[unpack_code(row, nb, p.bits, t)];
}

// out[g, i, t]: the terms of keys 0 .. nk − 1 summed in key order.
template <typename acc_t>
KVSTATS_HD acc_t weighted_sum_one(const WeightedSumParams<acc_t>& p, const acc_t* levels, int64_t g, int64_t i,
                                  int64_t t) {
  const acc_t* wr = p.w + (g * p.nq + i) * p.nk;
  acc_t s = 0;
  for (int64_t j = 0; j < p.nk; ++j) s += weighted_term(p, levels, wr[j], g * p.nk + j, t);
  return s;
}

}  // namespace math
}  // namespace kvstats
