// Decode steps straight from the codes (few queries per key group), fp32, AVX2: each key's codes are
// expanded eight at a time into their levels in registers and multiplied into the queries' accumulators.
//
//   scores:       s[g, i, j] = key_score(mse_w[g, j], Σ_t q[g, i, t] · levels[code[g, j, t]],
//                                        qjl_w[g, j], Σ_t qs[g, i, t] · (±1)[g, j, t])
//   weighted sum: out[g, i, t] = Σ_j (w[g, i, j] · key_w[g, j]) · levels[code[g, j, t]]
//
// Eight codes of b ≤ 4 bits fill exactly b bytes (bitpack.h: group of 8), one 32-bit word: broadcast to
// eight lanes and shifted by 0, b, …, 7b they are the codes (masked below 3 bits: vpermps reads bits 0–2 of a
// lane), and one vpermps (two and a blend at 4 bits) turns them into levels. Signs are 1-bit codes with levels
// {−1, +1} (QJL): x·(±1) is x with its sign bit flipped or kept, exactly, so the sign bits are moved to bit 31
// of the lanes and XORed into the factor instead of looked up and multiplied (the same numbers, one op less).
// Per key that is d/8 word loads and lookups and n_q·d/8 vector multiply-adds — no table to build per
// query and no scattered table update per key, which is what the table kernels (score_tables.h,
// weighted_sum.h) pay and what makes them slower than BLAS on a decode step's few queries.
//
// Rounding. A weighted sum multiplies, then adds (no FMA contraction): each element's terms in key order,
// the terms of math::weighted_term — the same sum as the shared path (math::weighted_sum_one), bit for
// bit. A score sums its d terms in eight lanes (lane l: coordinates ≡ l mod 8, in order) with one rounding per
// term (FMA; the signs' terms ±q are exact, so an add), then the lanes pairwise ((0+4)+(2+6))+((1+5)+(3+7));
// the keys are split between threads, never the terms, so neither depends on the thread count. Machines
// without AVX2 and FMA take the table kernels (a different order).
#pragma once

#include <cstdint>

#include "../quant_math.h"

namespace kvstats {
namespace cpu {

// Most queries per group the row kernels take (the accumulators stay in registers), widest codes.
constexpr int64_t kRowsMaxQueries = 8;
constexpr int64_t kRowsMaxBits = 4;

// True when this CPU runs AVX2 and FMA (checked once) and the extension was built for x86-64 with GCC/Clang.
bool rows_available();

// Whether a launch of n_q queries per group over rows of d codes of `bits` bits takes the row kernels.
inline bool rows_apply(int64_t nq, int64_t bits, int64_t d) {
  return nq >= 1 && nq <= kRowsMaxQueries && bits >= 1 && bits <= kRowsMaxBits && d % 8 == 0 && d > 0 &&
         rows_available();
}

// A score launch (either part optional): the code part into out, then the sign part (levels −1, +1) added to
// it, as math::key_score. Both parts must pass rows_apply (codes: n_q, bits, d; signs: n_q, 1, m).
void row_scores_f32(const math::ScoreParams<float>& p);

// A weighted-sum launch of codes with levels (kLevels: lloyd; QJL signs as 1-bit codes with levels
// {−1, +1}): out [G, nq, d] = Σ_j weighted_key_coefficient(w[g, i, j], key_w[g, j]) · levels[code[g, j, t]].
void row_weighted_f32(const math::WeightedSumParams<float>& p);

}  // namespace cpu
}  // namespace kvstats
