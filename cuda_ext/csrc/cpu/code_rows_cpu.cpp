// The row kernels of code_rows.h: AVX2 (intrinsics in functions compiled for AVX2; the scores also for FMA, the
// weighted sums without it, so that nothing contracts their multiply-then-add), chosen at run time; elsewhere
// rows_available() is false and the table kernels serve.
#include "code_rows.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVSTATS_ROWS_AVX2 1
#include <immintrin.h>
#endif

namespace kvstats {
namespace cpu {

#ifdef KVSTATS_ROWS_AVX2

#define KVSTATS_AVX2 __attribute__((target("avx2")))
#define KVSTATS_AVX2_FMA __attribute__((target("avx2,fma")))

bool rows_available() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

namespace {

// Keys per score task, coordinates' groups of 8 per weighted-sum task (its accumulators: about twelve
// vectors, so that they stay in registers).
constexpr int64_t kRowsKeyBlock = 256;

// One part of a score launch: out[g, i, j] (+)= w[g, j] · Σ_t q[g, i, t] · levels[code[g, j, t]], q [G, nq, d],
// codes [G, nk, d·bits/8], w [G, nk]; accumulate: add to out (the sign part after the code part).
struct ScorePart {
  int64_t G = 0, nq = 0, nk = 0, d = 0, bits = 0;
  const float* q = nullptr;
  const uint8_t* codes = nullptr;
  const float* w = nullptr;
  const float* levels = nullptr;
  float* out = nullptr;
  bool accumulate = false;
};

// The word of a group of eight codes (BITS bytes, little-endian: x86).
template <int BITS>
KVSTATS_AVX2 inline uint32_t group_word(const uint8_t* p) {
  if constexpr (BITS == 4) {
    uint32_t w;
    std::memcpy(&w, p, 4);
    return w;
  } else if constexpr (BITS == 3) {
    return p[0] | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16);
  } else if constexpr (BITS == 2) {
    uint16_t w;
    std::memcpy(&w, p, 2);
    return w;
  } else {
    return p[0];
  }
}

// The levels of the eight codes of a word: lanes shifted by 0, BITS, …, 7·BITS and masked, then looked
// up in lo (levels 0–7) and, at 4 bits, hi (levels 8–15), bit 3 choosing between them.
template <int BITS>
KVSTATS_AVX2 inline __m256 group_levels(uint32_t word, __m256 lo, __m256 hi) {
  const __m256i shifts = _mm256_setr_epi32(0, BITS, 2 * BITS, 3 * BITS, 4 * BITS, 5 * BITS, 6 * BITS, 7 * BITS);
  const __m256i shifted = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts);
  // vpermps reads bits 0-2 of each lane only: codes of 3 and 4 bits need no mask (bit 3 chooses hi below)
  const __m256i idx = BITS >= 3 ? shifted : _mm256_and_si256(shifted, _mm256_set1_epi32((1 << BITS) - 1));
  const __m256 a = _mm256_permutevar8x32_ps(lo, idx);
  if constexpr (BITS < 4) {
    return a;
  } else {
    const __m256 b = _mm256_permutevar8x32_ps(hi, idx);
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
  }
}

// For eight signs (1-bit codes with levels −1, +1): the sign-bit mask of the lanes whose code is 0 (level −1).
// x · (±1) is x with its sign bit flipped or kept, exactly: x XOR mask is the product, and adding it is the
// multiply-then-add of the levels, bit for bit, one lookup less.
KVSTATS_AVX2 inline __m256 group_flips(uint32_t word) {
  const __m256i to_top = _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24);  // code l to bit 31 of lane l
  const __m256i top = _mm256_sllv_epi32(_mm256_set1_epi32(static_cast<int>(word)), to_top);
  return _mm256_castsi256_ps(_mm256_andnot_si256(top, _mm256_set1_epi32(static_cast<int>(0x80000000u))));
}

// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
KVSTATS_AVX2 inline float lane_sum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

template <int BITS, int NQ, bool SIGNS>
KVSTATS_AVX2_FMA void scores_task(const ScorePart& p, int64_t g, int64_t j0, int64_t j1, const float* lv) {
  const __m256 lo = _mm256_loadu_ps(lv), hi = _mm256_loadu_ps(lv + 8);
  const int64_t d = p.d, ng = d / 8, nb = d * BITS / 8;
  const float* q = p.q + g * NQ * d;
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = p.codes + (g * p.nk + j) * nb;
    __m256 acc[NQ];
    for (int i = 0; i < NQ; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t c = 0; c < ng; ++c) {
      if constexpr (SIGNS) {
        const __m256 flip = group_flips(group_word<1>(row + c));
        for (int i = 0; i < NQ; ++i) acc[i] = _mm256_add_ps(acc[i], _mm256_xor_ps(_mm256_loadu_ps(q + i * d + 8 * c), flip));
      } else {
        const __m256 x = group_levels<BITS>(group_word<BITS>(row + c * BITS), lo, hi);
        for (int i = 0; i < NQ; ++i) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i * d + 8 * c), x, acc[i]);
      }
    }
    const float w = p.w[g * p.nk + j];
    for (int i = 0; i < NQ; ++i) {
      float* o = p.out + (g * NQ + i) * p.nk + j;
      const float v = w * lane_sum(acc[i]);
      *o = p.accumulate ? *o + v : v;
    }
  }
}

template <int BITS, int NQ, bool SIGNS>
KVSTATS_AVX2 void weighted_task(const math::WeightedSumParams<float>& p, int64_t g, int64_t c0, int64_t c1, const float* lv) {
  const __m256 lo = _mm256_loadu_ps(lv), hi = _mm256_loadu_ps(lv + 8);
  constexpr int kMaxGroups = NQ >= 12 ? 1 : 12 / NQ;
  const int64_t d = p.d, nb = d * BITS / 8, nk = p.nk, nc = c1 - c0;
  __m256 acc[NQ][kMaxGroups];
  for (int i = 0; i < NQ; ++i)
    for (int c = 0; c < kMaxGroups; ++c) acc[i][c] = _mm256_setzero_ps();
  const float* w = p.w + g * NQ * nk;
  const float* key_w = p.key_w + g * nk;
  for (int64_t j = 0; j < nk; ++j) {
    const uint8_t* row = p.codes + (g * nk + j) * nb + c0 * BITS;
    __m256 coef[NQ];
    for (int i = 0; i < NQ; ++i) coef[i] = _mm256_set1_ps(math::weighted_key_coefficient(w[i * nk + j], key_w[j]));
    for (int64_t c = 0; c < nc; ++c) {
      if constexpr (SIGNS) {
        const __m256 flip = group_flips(group_word<1>(row + c));
        for (int i = 0; i < NQ; ++i) acc[i][c] = _mm256_add_ps(acc[i][c], _mm256_xor_ps(coef[i], flip));
      } else {
        const __m256 x = group_levels<BITS>(group_word<BITS>(row + c * BITS), lo, hi);
        for (int i = 0; i < NQ; ++i) acc[i][c] = _mm256_add_ps(acc[i][c], _mm256_mul_ps(coef[i], x));
      }
    }
  }
  for (int i = 0; i < NQ; ++i)
    for (int64_t c = 0; c < nc; ++c) _mm256_storeu_ps(p.out + (g * NQ + i) * d + 8 * (c0 + c), acc[i][c]);
}

// A launch's tasks: scores split the keys (blocks of kRowsKeyBlock), weighted sums the coordinates (groups of 8),
// so that no sum is split between threads. Plain functions (no AVX2): they pass the levels by pointer.
template <int BITS, int NQ, bool SIGNS>
void run_scores(const ScorePart& p, const float* lv) {
  const int64_t blocks = (p.nk + kRowsKeyBlock - 1) / kRowsKeyBlock;
  at::parallel_for(0, p.G * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t g = t / blocks, j0 = (t % blocks) * kRowsKeyBlock;
      scores_task<BITS, NQ, SIGNS>(p, g, j0, std::min(p.nk, j0 + kRowsKeyBlock), lv);
    }
  });
}

template <int BITS, int NQ, bool SIGNS>
void run_weighted(const math::WeightedSumParams<float>& p, const float* lv) {
  constexpr int64_t kMaxGroups = NQ >= 12 ? 1 : 12 / NQ;
  const int64_t ng = p.d / 8, chunks = (ng + kMaxGroups - 1) / kMaxGroups;
  at::parallel_for(0, p.G * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t g = t / chunks, c0 = (t % chunks) * kMaxGroups;
      weighted_task<BITS, NQ, SIGNS>(p, g, c0, std::min(ng, c0 + kMaxGroups), lv);
    }
  });
}

// The instance for the launch's width and query count (1 ≤ nq ≤ kRowsMaxQueries, 1 ≤ bits ≤ 4); SIGNS: 1-bit
// codes whose levels are −1 and +1 (group_flips).
template <int BITS, bool SIGNS, typename Launch>
void by_queries(const Launch& p, const float* lv) {
  constexpr bool kScores = std::is_same_v<Launch, ScorePart>;
  auto go = [&](auto nq_c) {
    constexpr int N = decltype(nq_c)::value;
    if constexpr (kScores) run_scores<BITS, N, SIGNS>(p, lv); else run_weighted<BITS, N, SIGNS>(p, lv);
  };
  switch (p.nq) {
    case 1: go(std::integral_constant<int, 1>{}); break;
    case 2: go(std::integral_constant<int, 2>{}); break;
    case 3: go(std::integral_constant<int, 3>{}); break;
    case 4: go(std::integral_constant<int, 4>{}); break;
    case 5: go(std::integral_constant<int, 5>{}); break;
    case 6: go(std::integral_constant<int, 6>{}); break;
    case 7: go(std::integral_constant<int, 7>{}); break;
    default: go(std::integral_constant<int, 8>{}); break;
  }
}

template <typename Launch>
void run_rows(const Launch& p) {
  TORCH_CHECK(p.nq >= 1 && p.nq <= kRowsMaxQueries && p.bits >= 1 && p.bits <= kRowsMaxBits && p.d % 8 == 0,
              "row kernels: nq ", p.nq, ", bits ", p.bits, ", d ", p.d, " outside their range");
  float lv[16] = {};  // levels 0 .. 2^bits − 1, the rest unused (the codes never reach them)
  for (int64_t c = 0; c < (int64_t{1} << p.bits); ++c) lv[c] = p.levels[c];
  const bool signs = p.bits == 1 && lv[0] == -1.0f && lv[1] == 1.0f;  // exactly ±1: QJL's signs
  switch (p.bits) {
    case 1: signs ? by_queries<1, true>(p, lv) : by_queries<1, false>(p, lv); break;
    case 2: by_queries<2, false>(p, lv); break;
    case 3: by_queries<3, false>(p, lv); break;
    default: by_queries<4, false>(p, lv); break;
  }
}

}  // namespace

void row_scores_f32(const math::ScoreParams<float>& p) {
  static const float kSignLevels[2] = {math::sign_value(0u, 1.0f), math::sign_value(1u, 1.0f)};
  ScorePart part;
  part.G = p.G;
  part.nq = p.nq;
  part.nk = p.nk;
  part.out = p.out;
  if (p.codes) {
    part.d = p.d;
    part.bits = p.bits;
    part.q = p.q;
    part.codes = p.codes;
    part.w = p.mse_w;
    part.levels = p.levels;
    run_rows(part);
  }
  if (p.signs) {
    part.d = p.m;
    part.bits = 1;
    part.q = p.qs;
    part.codes = p.signs;
    part.w = p.qjl_w;
    part.levels = kSignLevels;
    part.accumulate = p.codes != nullptr;
    run_rows(part);
  }
}

void row_weighted_f32(const math::WeightedSumParams<float>& p) {
  TORCH_CHECK(p.kind == math::WeightedKind::kLevels, "row kernels: weighted sums of codes with levels only");
  run_rows(p);
}

#else  // not x86-64 with GCC/Clang: the table kernels serve

bool rows_available() { return false; }
void row_scores_f32(const math::ScoreParams<float>&) { TORCH_CHECK(false, "row kernels need AVX2"); }
void row_weighted_f32(const math::WeightedSumParams<float>&) { TORCH_CHECK(false, "row kernels need AVX2"); }

#endif

}  // namespace cpu
}  // namespace kvstats
