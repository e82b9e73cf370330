// Many-query scores from packed codes with the queries innermost (product quantization's "asymmetric
// distance computation", Jégou, Douze & Schmid, IEEE TPAMI 2011, §III-A, with the look-up tables laid out
// query-major as in André, Kermarrec & Le Scouarnec, "Cache locality is not enough", VLDB 2015).
//
// The estimator is a sum over table positions p of a function of the field f_p(key) read from the key's
// packed row (a byte of codes or signs, a 6-bit pair of 3-bit codes, one code):
//
//   scores[i, j] = mse_w[j] · Σ_p Tc[p][f_p(j)][i]  +  qjl_w[j] · Σ_p Ts[p][f_p(j)][i]
//
// For a block of NQB queries (16, or 8 for a short last block) the entries of each position are stored
// as rows of NQB values (query i contiguous), so each field of a key selects one row that is added,
// vectorised over the queries, into the key's NQB accumulators: d·bits/8 + m/8 row additions per key
// (4-bit codes and m = 512 sign bits: 64 byte positions, 2 AVX2 vectors each) instead of (d + m)·NQB
// multiply-adds of decoding the key and a GEMM. The entries are the ones score_tables.h tabulates per
// query, computed in the same order, so each query's score is the per-query tables' sum reordered.
//
// One block's tables (NQB values per entry: 256 per byte position, 256 per group of eight 3-bit codes,
// 2^bits per code otherwise; 1 MiB for m = 512 sign bits at NQB = 16) are built by the task that uses
// them and stay in its core's L2 while it streams a chunk of keys; KI keys are summed at a time
// (independent accumulators hide the add latency and the table loads' L1 misses); each key's NQB results
// go through a small buffer that is written to the rows of out [G, n_q, n_k] transposed. The tables must
// be 64-byte aligned: a row of 16 fp32 is then one cache line (misaligned rows split every other load
// across two lines, measured 1.8x slower).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../bitpack.h"
#include "common_cpu.h"
#include "score_tables.h"

namespace kvstats {
namespace cpu {

// Keys per output buffer (the buffer holds kAdcKeyBlock rows of NQB results).
constexpr int64_t kAdcKeyBlock = 64;
// Queries per block of tables (the last block may use kAdcShortBlock).
constexpr int64_t kAdcBlock = 16;
constexpr int64_t kAdcShortBlock = 8;

// One SIMD vector of acc_t (32 bytes, an AVX2 register; two SSE registers in the baseline copy), loaded
// and stored without alignment requirements.
template <typename acc_t>
struct AdcVec;
template <>
struct AdcVec<float> {
  typedef float type __attribute__((vector_size(32), aligned(4)));
};
template <>
struct AdcVec<double> {
  typedef double type __attribute__((vector_size(32), aligned(8)));
};

// The table layout of one block of queries: the code part (CodeTable's positions and entries), then the
// sign part (mb byte positions of 256 entries). Sizes in entries; an entry is a row of NQB values.
struct AdcLayout {
  bool has_codes = false, has_signs = false;
  CodeTable ct{0, 1};
  int64_t m = 0, mb = 0;
  int64_t code_entries = 0, sign_entries = 0;

  AdcLayout(bool codes, int64_t d, int64_t bits, bool signs, int64_t m_)
      : has_codes(codes), has_signs(signs), ct(codes ? d : 0, codes ? bits : 1), m(signs ? m_ : 0),
        mb(signs ? packed_bytes(m_, 1) : 0), code_entries(codes ? ct.size : 0), sign_entries(mb * 256) {}
  int64_t entries() const { return code_entries + sign_entries; }
};

// One task: a chunk of keys [j0, j1) of one group against one block of queries.
template <typename acc_t>
struct AdcTask {
  const AdcLayout* layout = nullptr;
  int64_t nqb = 0;                 // NQB: kAdcBlock or kAdcShortBlock
  int64_t rows = 0;                // queries of the block actually written (<= nqb)
  const acc_t* table = nullptr;    // [entries][nqb], 64-byte aligned
  const uint8_t* codes = nullptr;  // the group's codes [nk, nb] (or nullptr)
  const uint8_t* signs = nullptr;  // the group's signs [nk, mb] (or nullptr)
  const acc_t* mse_w = nullptr;    // [nk]
  const acc_t* qjl_w = nullptr;    // [nk]
  int64_t j0 = 0, j1 = 0;
  acc_t* out = nullptr;            // row 0 of the block in out; row stride nk
  int64_t nk = 0;
  acc_t* buf = nullptr;            // scratch [kAdcKeyBlock][nqb]
  uint8_t* scratch = nullptr;      // scratch [kAdcKeyBlock][d] for unpacked codes (kCode layout)
};

// The block's tables from its queries transposed: qT [d][NQB] and qsT [m][NQB] (query i at column i,
// zero columns past the block's queries). Entries as score_tables.h's build_code_table /
// build_sign_table, summed in the same order.
template <typename acc_t, int NQB>
KVSTATS_ALWAYS_INLINE void adc_build(const AdcLayout& L, const acc_t* qT, const acc_t* qsT, const acc_t* levels,
                                     acc_t* table) {
  if (L.has_codes) {
    const CodeTable& ct = L.ct;
    const int64_t Lv = int64_t{1} << ct.bits;
    auto per_code = [&](int64_t first, acc_t* t) {  // t[(i - first)·L + c] = q[i]·levels[c]
      for (int64_t i = first; i < ct.d; ++i)
        for (int64_t c = 0; c < Lv; ++c) {
          acc_t* e = t + ((i - first) * Lv + c) * NQB;
          const acc_t l = levels[c];
          for (int r = 0; r < NQB; ++r) e[r] = qT[i * NQB + r] * l;
        }
    };
    switch (ct.layout) {
      case CodeTable::Layout::kByte: {
        const int64_t per = 8 / ct.bits;
        const uint32_t mask = (1u << ct.bits) - 1u;
        for (int64_t p = 0; p < ct.nb; ++p)
          for (uint32_t v = 0; v < 256; ++v) {
            acc_t* e = table + (p * 256 + v) * NQB;
            acc_t s[NQB] = {};
            for (int64_t t = 0; t < per && p * per + t < ct.d; ++t) {
              const acc_t* qr = qT + (p * per + t) * NQB;
              const acc_t l = levels[(v >> (t * ct.bits)) & mask];
              for (int r = 0; r < NQB; ++r) s[r] += qr[r] * l;
            }
            for (int r = 0; r < NQB; ++r) e[r] = s[r];
          }
        break;
      }
      case CodeTable::Layout::kPair3:
        for (int64_t g = 0; g < ct.groups; ++g)
          for (int64_t p = 0; p < 4; ++p) {
            const acc_t* qa = qT + (8 * g + 2 * p) * NQB;
            const acc_t* qb = qa + NQB;
            for (uint32_t v = 0; v < 64; ++v) {
              acc_t* e = table + (g * 256 + p * 64 + v) * NQB;
              const acc_t la = levels[v & 7u], lb = levels[v >> 3];
              for (int r = 0; r < NQB; ++r) e[r] = qa[r] * la + qb[r] * lb;
            }
          }
        per_code(8 * ct.groups, table + ct.groups * 256 * NQB);
        break;
      case CodeTable::Layout::kCode: per_code(0, table); break;
    }
  }
  if (L.has_signs) {
    acc_t* st = table + L.code_entries * NQB;
    for (int64_t p = 0; p < L.mb; ++p) {
      acc_t* row = st + p * 256 * NQB;
      acc_t base[NQB] = {};
      for (int64_t t = 0; t < 8 && 8 * p + t < L.m; ++t)
        for (int r = 0; r < NQB; ++r) base[r] -= qsT[(8 * p + t) * NQB + r];
      for (int r = 0; r < NQB; ++r) row[r] = base[r];
      for (uint32_t v = 1; v < 256; ++v) {
        const int t = __builtin_ctz(v);
        const acc_t* prev = row + (v & (v - 1)) * NQB;
        acc_t* e = row + v * NQB;
        if (8 * p + t < L.m) {
          const acc_t* qr = qsT + (8 * p + t) * NQB;
          for (int r = 0; r < NQB; ++r) e[r] = prev[r] + 2 * qr[r];
        } else {
          for (int r = 0; r < NQB; ++r) e[r] = prev[r] + acc_t(0);
        }
      }
    }
  }
}

// acc[k] += Σ_p T[p][row_k[p]] over nb byte positions, for KI keys (rows at stride `stride`).
template <typename acc_t, int NQB, int KI>
KVSTATS_ALWAYS_INLINE void adc_add_bytes(const acc_t* T, const uint8_t* rows, int64_t stride, int64_t nb,
                                         typename AdcVec<acc_t>::type (&acc)[KI][NQB * sizeof(acc_t) / 32]) {
  using V = typename AdcVec<acc_t>::type;
  constexpr int W = 32 / sizeof(acc_t), NV = NQB / W;
  for (int64_t p = 0; p < nb; ++p) {
    const acc_t* tp = T + p * 256 * NQB;
#pragma GCC unroll 16
    for (int k = 0; k < KI; ++k) {
      const V* e = reinterpret_cast<const V*>(tp + static_cast<int64_t>(rows[k * stride + p]) * NQB);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[k][v] += e[v];
    }
  }
}

// acc[k] += the kPair3 table sum of KI rows of 3-bit codes: each group of 8 codes (3 bytes, read as one
// little-endian word) gives four 6-bit fields; the tail codes one by one.
template <typename acc_t, int NQB, int KI>
KVSTATS_ALWAYS_INLINE void adc_add_pair3(const CodeTable& ct, const acc_t* T, const uint8_t* rows, int64_t stride,
                                         typename AdcVec<acc_t>::type (&acc)[KI][NQB * sizeof(acc_t) / 32]) {
  using V = typename AdcVec<acc_t>::type;
  constexpr int W = 32 / sizeof(acc_t), NV = NQB / W;
  for (int64_t g = 0; g < ct.groups; ++g) {
    const acc_t* tg = T + g * 256 * NQB;
#pragma GCC unroll 16
    for (int k = 0; k < KI; ++k) {
      const uint8_t* b = rows + k * stride + 3 * g;
      uint32_t w;
      if (g + 1 < ct.groups) {  // the 4th byte is still in the row
        std::memcpy(&w, b, 4);
        w = le32(w);
      } else {
        w = b[0] | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16);
      }
#pragma GCC unroll 4
      for (int f = 0; f < 4; ++f) {
        const V* e = reinterpret_cast<const V*>(tg + (f * 64 + ((w >> (6 * f)) & 63u)) * NQB);
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) acc[k][v] += e[v];
      }
    }
  }
  const acc_t* tail = T + ct.groups * 256 * NQB;
  for (int64_t i = 8 * ct.groups; i < ct.d; ++i)
    for (int k = 0; k < KI; ++k) {
      const uint32_t c = unpack_code(rows + k * stride, ct.nb, 3, i);
      const V* e = reinterpret_cast<const V*>(tail + ((i - 8 * ct.groups) * 8 + c) * NQB);
      for (int v = 0; v < NV; ++v) acc[k][v] += e[v];
    }
}

// acc[k] += Σ_i T[i][code_i] over the d unpacked codes of KI keys (codes [KI][d]).
template <typename acc_t, int NQB, int KI>
KVSTATS_ALWAYS_INLINE void adc_add_codes(const CodeTable& ct, const acc_t* T, const uint8_t* codes,
                                         typename AdcVec<acc_t>::type (&acc)[KI][NQB * sizeof(acc_t) / 32]) {
  using V = typename AdcVec<acc_t>::type;
  constexpr int W = 32 / sizeof(acc_t), NV = NQB / W;
  const int64_t Lv = int64_t{1} << ct.bits;
  for (int64_t i = 0; i < ct.d; ++i) {
    const acc_t* ti = T + i * Lv * NQB;
#pragma GCC unroll 16
    for (int k = 0; k < KI; ++k) {
      const V* e = reinterpret_cast<const V*>(ti + static_cast<int64_t>(codes[k * ct.d + i]) * NQB);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[k][v] += e[v];
    }
  }
}

// buf rows [b, b + KI) = mse_w · (code sums) + qjl_w · (sign sums) of keys j .. j + KI.
template <typename acc_t, int NQB, int KI>
KVSTATS_ALWAYS_INLINE void adc_keys(const AdcTask<acc_t>& t, int64_t j, acc_t* buf) {
  using V = typename AdcVec<acc_t>::type;
  constexpr int W = 32 / sizeof(acc_t), NV = NQB / W;
  const AdcLayout& L = *t.layout;
  V* out = reinterpret_cast<V*>(buf);
  if (L.has_codes) {
    V acc[KI][NV] = {};
    const CodeTable& ct = L.ct;
    const uint8_t* rows = t.codes + j * ct.nb;
    switch (ct.layout) {
      case CodeTable::Layout::kByte: adc_add_bytes<acc_t, NQB, KI>(t.table, rows, ct.nb, ct.nb, acc); break;
      case CodeTable::Layout::kPair3: adc_add_pair3<acc_t, NQB, KI>(ct, t.table, rows, ct.nb, acc); break;
      case CodeTable::Layout::kCode:
        for (int k = 0; k < KI; ++k) unpack_row(rows + k * ct.nb, ct.d, ct.bits, t.scratch + k * ct.d);
        adc_add_codes<acc_t, NQB, KI>(ct, t.table, t.scratch, acc);
        break;
    }
    for (int k = 0; k < KI; ++k) {
      const acc_t w = t.mse_w[j + k];
      for (int v = 0; v < NV; ++v) out[k * NV + v] = acc[k][v] * w;
    }
  }
  if (L.has_signs) {
    V acc[KI][NV] = {};
    adc_add_bytes<acc_t, NQB, KI>(t.table + L.code_entries * NQB, t.signs + j * L.mb, L.mb, L.mb, acc);
    for (int k = 0; k < KI; ++k) {
      const acc_t w = t.qjl_w[j + k];
      for (int v = 0; v < NV; ++v) out[k * NV + v] = L.has_codes ? out[k * NV + v] + acc[k][v] * w : acc[k][v] * w;
    }
  }
}

// Scores of keys [t.j0, t.j1) against the block's queries, written to out's rows 0 .. t.rows.
template <typename acc_t, int NQB>
KVSTATS_ALWAYS_INLINE void adc_run(const AdcTask<acc_t>& t) {
  // Keys summed at a time: eight accumulator vectors (AVX2 has 16 registers).
  constexpr int NV = NQB * sizeof(acc_t) / 32;
  constexpr int KI = NV >= 8 ? 1 : 8 / NV;
  for (int64_t b0 = t.j0; b0 < t.j1; b0 += kAdcKeyBlock) {
    const int64_t b1 = std::min(t.j1, b0 + kAdcKeyBlock);
    int64_t j = b0;
    for (; j + KI <= b1; j += KI) adc_keys<acc_t, NQB, KI>(t, j, t.buf + (j - b0) * NQB);
    for (; j < b1; ++j) adc_keys<acc_t, NQB, 1>(t, j, t.buf + (j - b0) * NQB);
    for (int64_t r = 0; r < t.rows; ++r) {
      acc_t* o = t.out + r * t.nk;
      for (int64_t k = b0; k < b1; ++k) o[k] = t.buf[(k - b0) * NQB + r];
    }
  }
}

template <typename acc_t>
KVSTATS_ALWAYS_INLINE void adc_build_any(const AdcLayout& L, int64_t nqb, const acc_t* qT, const acc_t* qsT,
                                         const acc_t* levels, acc_t* table) {
  if (nqb == kAdcBlock) {
    adc_build<acc_t, kAdcBlock>(L, qT, qsT, levels, table);
  } else {
    adc_build<acc_t, kAdcShortBlock>(L, qT, qsT, levels, table);
  }
}

template <typename acc_t>
KVSTATS_ALWAYS_INLINE void adc_run_any(const AdcTask<acc_t>& t) {
  if (t.nqb == kAdcBlock) {
    adc_run<acc_t, kAdcBlock>(t);
  } else {
    adc_run<acc_t, kAdcShortBlock>(t);
  }
}

// The fp32 instances, with an AVX2 clone (score_adc.cpp).
void adc_build_f32(const AdcLayout& L, int64_t nqb, const float* qT, const float* qsT, const float* levels,
                   float* table);
void adc_run_f32(const AdcTask<float>& t);

template <typename acc_t>
inline void adc_build_tables(const AdcLayout& L, int64_t nqb, const acc_t* qT, const acc_t* qsT, const acc_t* levels,
                             acc_t* table) {
  if constexpr (std::is_same_v<acc_t, float>) {
    adc_build_f32(L, nqb, qT, qsT, levels, table);
  } else {
    adc_build_any<acc_t>(L, nqb, qT, qsT, levels, table);
  }
}

template <typename acc_t>
inline void adc_score_chunk(const AdcTask<acc_t>& t) {
  if constexpr (std::is_same_v<acc_t, float>) {
    adc_run_f32(t);
  } else {
    adc_run_any<acc_t>(t);
  }
}

}  // namespace cpu
}  // namespace kvstats
