// Scores straight from packed codes and signs: the code part, the sign part, the parameters of a score
// launch and one (query, key) score.
#pragma once

#include <cstdint>

#include "../bitpack.h"
#include "scalar.h"
#include "signs.h"

namespace kvstats {
namespace math {

// ------------------------------------------------------------------------------------------- scores
//   score(q, key) = mse_w · Σ_t q[t] · levels[code_t]  +  qjl_w · Σ_t qs[t] · (±1)_t
// The code part of one key: Σ_t q[t]·levels[code_t] over its packed row.
template <typename acc_t>
KVSTATS_HD acc_t code_dot(const acc_t* q, const acc_t* levels, const uint8_t* row, int64_t bits, int64_t d) {
  const int64_t nb = packed_bytes(d, bits);
  acc_t s = 0;
  for (int64_t t = 0; t < d; ++t) s += q[t] * levels[unpack_code(row, nb, bits, t)];
  return s;
}

// The sign part of one key: Σ_t ±qs[t] over its packed signs.
template <typename acc_t>
KVSTATS_HD acc_t sign_dot(const acc_t* qs, const uint8_t* row, int64_t m) {
  acc_t s = 0;
  for (int64_t t = 0; t < m; ++t) s += sign_value(sign_bit_at(row, t), qs[t]);
  return s;
}

// Score accumulation: the weighted code part plus the weighted sign part (either absent: weight 0 and
// sum 0 are never formed; the caller passes has_* flags).
template <typename acc_t>
KVSTATS_HD acc_t key_score(bool has_codes, acc_t mse_w, acc_t code_sum, bool has_signs, acc_t qjl_w, acc_t sign_sum) {
  acc_t s = has_codes ? mse_w * code_sum : acc_t(0);
  if (has_signs) s += qjl_w * sign_sum;
  return s;
}

// Entry v of a per-query byte table of codes (score_tables.h): Σ_t q[p·per + t] · levels[field t of v].
template <typename acc_t>
KVSTATS_HD acc_t code_byte_entry(const acc_t* q, int64_t d, const acc_t* levels, int64_t bits, int64_t p, uint32_t v) {
  const int64_t per = 8 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  acc_t s = 0;
  for (int64_t t = 0; t < per; ++t) {
    const int64_t idx = p * per + t;
    if (idx < d) s += q[idx] * levels[(v >> (t * bits)) & mask];
  }
  return s;
}

// ---------------------------------------------------------------------------------- kernel parameters
// The parameters of one score launch, named (instead of 14 positional arguments with null pointers for
// "absent"): the code part is present when codes != nullptr, the sign part when signs != nullptr.
template <typename acc_t>
struct ScoreParams {
  int64_t G = 0, nq = 0, nk = 0;
  // code part: q [G, nq, d], codes [G, nk, ceil(d·bits/8)], mse_w [G, nk], levels [2^bits]
  const acc_t* q = nullptr;
  const uint8_t* codes = nullptr;
  const acc_t* mse_w = nullptr;
  const acc_t* levels = nullptr;
  int64_t bits = 0, d = 0;
  // sign part: qs [G, nq, m], signs [G, nk, ceil(m/8)], qjl_w [G, nk]
  const acc_t* qs = nullptr;
  const uint8_t* signs = nullptr;
  const acc_t* qjl_w = nullptr;
  int64_t m = 0;
  acc_t* out = nullptr;  // [G, nq, nk]
};

// Score of query i of group g against key j (the GPU's one-thread-per-key loop, the CPU's shared path).
template <typename acc_t>
KVSTATS_HD acc_t score_one(const ScoreParams<acc_t>& p, const acc_t* q, const acc_t* qs, int64_t g, int64_t j) {
  const int64_t key = g * p.nk + j;
  const bool has_codes = p.codes != nullptr, has_signs = p.signs != nullptr;
  const acc_t cs = has_codes ? code_dot(q, p.levels, p.codes + key * packed_bytes(p.d, p.bits), p.bits, p.d) : acc_t(0);
  const acc_t ss = has_signs ? sign_dot(qs, p.signs + key * packed_bytes(p.m, 1), p.m) : acc_t(0);
  return key_score(has_codes, has_codes ? p.mse_w[key] : acc_t(0), cs, has_signs, has_signs ? p.qjl_w[key] : acc_t(0), ss);
}

}  // namespace math
}  // namespace kvstats
