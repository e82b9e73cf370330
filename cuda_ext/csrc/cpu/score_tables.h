// Scoring packed codes against queries with per-byte lookup tables (CPU).
//
// For a query q and a packed key row, the estimator is a sum over bytes p of a function of byte p
// alone whenever codes never straddle bytes (bits ∈ {1, 2, 4, 8}, and sign bits). So per query we
// tabulate T[p][v] (v = 0..255) once, and each key costs nbytes table look-ups — fewer operations and
// fewer bytes read than a dense dot product over the unquantised key.
#pragma once

#include <cstdint>
#include <vector>

namespace kvstats {
namespace cpu {

// T[p][v] = sum_t q[p*per + t] * levels[(v >> (t*bits)) & mask], per = 8 / bits (t over valid indices).
template <typename acc_t>
inline void build_code_table(const acc_t* q, int64_t d, const acc_t* levels, int64_t bits, int64_t nb, acc_t* table) {
  const int64_t per = 8 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  for (int64_t p = 0; p < nb; ++p) {
    for (uint32_t v = 0; v < 256; ++v) {
      acc_t s = 0;
      for (int64_t t = 0; t < per; ++t) {
        const int64_t idx = p * per + t;
        if (idx < d) s += q[idx] * levels[(v >> (t * bits)) & mask];
      }
      table[p * 256 + v] = s;
    }
  }
}

// T[p][v] = sum_t qs[8p + t] * (bit t of v ? +1 : -1), over valid t (8p + t < m).
template <typename acc_t>
inline void build_sign_table(const acc_t* qs, int64_t m, int64_t nb, acc_t* table) {
  for (int64_t p = 0; p < nb; ++p) {
    acc_t* row = table + p * 256;
    acc_t base = 0;
    for (int64_t t = 0; t < 8 && 8 * p + t < m; ++t) base -= qs[8 * p + t];
    row[0] = base;
    for (uint32_t v = 1; v < 256; ++v) {
      const int t = __builtin_ctz(v);
      row[v] = row[v & (v - 1)] + (8 * p + t < m ? 2 * qs[8 * p + t] : acc_t(0));
    }
  }
}

template <typename acc_t>
inline acc_t table_sum(const acc_t* table, const uint8_t* row, int64_t nb) {
  acc_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;  // four chains: the look-ups are independent
  int64_t p = 0;
  for (; p + 4 <= nb; p += 4) {
    s0 += table[(p + 0) * 256 + row[p + 0]];
    s1 += table[(p + 1) * 256 + row[p + 1]];
    s2 += table[(p + 2) * 256 + row[p + 2]];
    s3 += table[(p + 3) * 256 + row[p + 3]];
  }
  for (; p < nb; ++p) s0 += table[p * 256 + row[p]];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace cpu
}  // namespace kvstats
