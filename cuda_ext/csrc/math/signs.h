// Lloyd–Max cells, sign bits and the QJL key weight.
#pragma once

#include <cstdint>

#include "scalar.h"

namespace kvstats {
namespace math {

// ------------------------------------------------------------------------------------ Lloyd–Max cells
// Index of the cell of u: the number of thresholds strictly below u (torch.bucketize, right=False),
// for every width 1–8: cell_index in bitpack.h (branch-free binary lifting over 2^bits − 1 thresholds).
using kvstats::cell_index;

// The value a code stands for: norm · levels[code].
template <typename acc_t>
KVSTATS_HD acc_t level_value(const acc_t* levels, uint32_t code, acc_t norm) {
  return levels[code] * norm;
}

// u = y / ‖x‖ (a zero vector gives u = 0).
template <typename acc_t>
KVSTATS_HD acc_t unit_denominator(acc_t norm) {
  return norm > acc_t(0) ? norm : acc_t(1);
}

// ------------------------------------------------------------------------------------------- signs
// Sign bits (bitpack.h layout): bit 1 for v >= 0 (so sign(0) = +1), bit 0 for v < 0.
template <typename acc_t>
KVSTATS_HD uint32_t sign_bit(acc_t v) {
  return v >= acc_t(0) ? 1u : 0u;
}

// ±w for a sign bit.
template <typename acc_t>
KVSTATS_HD acc_t sign_value(uint32_t bit, acc_t w) {
  return bit ? w : -w;
}

// Sign bit i of a packed row.
KVSTATS_HD uint32_t sign_bit_at(const uint8_t* row, int64_t i) { return (row[i >> 3] >> (i & 7)) & 1u; }

// ------------------------------------------------------------------------------------------- QJL
// The QJL estimator of <q, k> (arXiv 2406.03482, Lemma 3.2): √(π/2)/m · ‖k‖ · <S q, sign(S k)>. The
// quantizers pass the constant scale = √(π/2)/m (times their own factors) to the score ops; a key's
// sign part is weighted by qjl_key_weight(‖k‖ or γ, scale).

template <typename acc_t>
KVSTATS_HD acc_t qjl_key_weight(acc_t norm, acc_t scale) {
  return norm * scale;
}

}  // namespace math
}  // namespace kvstats
