// Weighted sums of reconstructions straight from the packed codes (attention's w·V without decoding V; the
// formulas in math/weighted.h), the fast CPU kernels:
//
// * fp32, n_q <= 8 per group, codes of <= 4 bits (signs: 1), d a multiple of 8, on an AVX2 CPU: the row
//   kernels of code_rows.h (a decode step), the shared path's sum bit for bit. SmolLM2's layer (3 groups of
//   3 queries, 2,048 keys, d = 64, 1 thread): lloyd 0.09–0.10 ms at 3–4 bits and qjl 0.09 ms, against
//   0.45–0.50 and 0.25 ms for the tables below and 0.12 ms for a dense fp32 w·V.
// * Codebook codes (lloyd / turbo_mse) and QJL signs (levels {−1, +1}, bits 1): tables of accumulated
//   weights. A row of codes is read as F fields of k = 8 / bits consecutive codes (fb = k·bits ≤ 8 bits:
//   a whole byte for bits 1, 2, 4, 8; pairs of 3-bit codes; single 5–7-bit codes). For a block of NQ
//   queries, key j adds its coefficients c[j][q] = w[q, j]·key_w[j] to A[f][v][·], v = field f of key j
//   (one NQ-wide vector add per field, queries innermost). Then
//     out[q, f·k + c] = Σ_v A[f][v][q] · levels[code c of v],
//   F·2^fb·k·NQ multiply-adds per block, independent of n_k. Per key and block that is F (d/2 for 3 or
//   4 bits, d/4 at 2 bits) vector adds against NQ·d multiply-adds for decode-then-multiply.
// * Min-max codes: per key, the codes of a chunk of 64 coordinates are unpacked and reconstructed with
//   math::minmax_value (the arithmetic of minmax_decode, with its no-overflow fallback), then added into
//   NQ ≤ 16 query accumulators that stay in L1.
//
// The summation order does not depend on the thread count: tasks split (group, query block, fields or
// coordinate chunks) only, never the keys, so every output element (and every table entry) is one
// task's sum over the keys in key order.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../bitpack.h"
#include "../quant_math.h"
#include "common_cpu.h"

namespace kvstats {
namespace cpu {

// Most bytes one task's tables may take: they stay in a core's L2.
constexpr int64_t kWeightedTableBytes = int64_t{256} << 10;
// Coordinates per min-max task (a multiple of 8, so that a chunk starts on a byte) and queries per block.
constexpr int64_t kWeightedDimChunk = 64;
constexpr int64_t kWeightedMinMaxQueries = 16;

// How a packed row of d codes of `bits` bits is read as fields (see above).
struct FieldLayout {
  int64_t bits = 0, d = 0, nb = 0;
  int64_t k = 0;   // codes per field
  int64_t fb = 0;  // bits per field
  int64_t E = 0;   // entries per field: 2^fb
  int64_t F = 0;   // fields per row: ceil(d / k)
};

inline FieldLayout field_layout(int64_t bits, int64_t d) {
  FieldLayout L;
  L.bits = bits;
  L.d = d;
  L.nb = packed_bytes(d, bits);
  L.k = 8 / bits;
  L.fb = L.k * bits;
  L.E = int64_t{1} << L.fb;
  L.F = (d + L.k - 1) / L.k;
  return L;
}

// One task of the tables kernel: fields [f0, f1) of the keys of one group for one block of NQ queries.
template <typename acc_t>
struct TableTask {
  FieldLayout L;
  int64_t nk = 0, f0 = 0, f1 = 0;
  const uint8_t* codes = nullptr;  // [nk, nb] of the group
  const acc_t* coef = nullptr;     // [nk, NQ]: w[q, j] · key_w[j], zero for padded queries
  const acc_t* levels = nullptr;   // [2^bits]
  acc_t* table = nullptr;          // scratch [(f1 − f0), E, NQ]
  acc_t* out = nullptr;            // out[q, t] at out + q · d + t
  int64_t nq = 0;                  // queries of the block that exist (≤ NQ)
};

// NQ accumulators as one vector (GCC/Clang vector extension: one SSE/AVX add; memcpy loads and stores
// make no alignment assumption). NQ = 1: the scalar itself.
template <typename acc_t, int NQ>
struct QueryVec {
  typedef acc_t type __attribute__((vector_size(NQ * sizeof(acc_t))));
  static KVSTATS_ALWAYS_INLINE void add(acc_t* dst, const acc_t* src) {
    type a, b;
    std::memcpy(&a, dst, sizeof(type));
    std::memcpy(&b, src, sizeof(type));
    a += b;
    std::memcpy(dst, &a, sizeof(type));
  }
};
template <typename acc_t>
struct QueryVec<acc_t, 1> {
  static KVSTATS_ALWAYS_INLINE void add(acc_t* dst, const acc_t* src) { *dst += *src; }
};

// Field values of fields [f0, f1) of a row (f0·k a multiple of 8, so the fields' codes are a packed stream
// of their own from byte f0·k·bits/8): the codes unpacked, then k of them joined per field.
KVSTATS_ALWAYS_INLINE void row_fields(const FieldLayout& L, const uint8_t* row, int64_t f0, int64_t f1, uint8_t* codes,
                                      uint8_t* fields) {
  const int64_t c0 = f0 * L.k, c1 = std::min(L.d, f1 * L.k);
  unpack_row(row + c0 * L.bits / 8, c1 - c0, L.bits, codes);
  if (L.k == 1) {
    for (int64_t f = 0; f < f1 - f0; ++f) fields[f] = codes[f];
  } else {
    for (int64_t i = c1 - c0; i < (f1 - f0) * L.k; ++i) codes[i] = 0;
    for (int64_t f = 0; f < f1 - f0; ++f) {
      uint32_t v = 0;
      for (int64_t c = 0; c < L.k; ++c) v |= static_cast<uint32_t>(codes[f * L.k + c]) << (c * L.bits);
      fields[f] = static_cast<uint8_t>(v);
    }
  }
}

template <typename acc_t, int NQ, bool kByteFields>
KVSTATS_ALWAYS_INLINE void table_task_any(const TableTask<acc_t>& t) {
  const FieldLayout& L = t.L;
  const int64_t nf = t.f1 - t.f0;
  std::fill(t.table, t.table + nf * L.E * NQ, acc_t(0));
  std::vector<uint8_t> codes(static_cast<size_t>(nf * L.k + 8)), fields(static_cast<size_t>(nf));
  const int64_t stride = L.E * NQ;
  for (int64_t j = 0; j < t.nk; ++j) {
    const uint8_t* row = t.codes + j * L.nb;
    const acc_t* c = t.coef + j * NQ;
    const uint8_t* v = row + t.f0;
    if constexpr (!kByteFields) {
      if (L.bits == 3) {
        // Eight 3-bit codes fill three bytes: one 24-bit word, four 6-bit fields (pairs of codes).
        const int64_t full = std::min(nf, (L.d / 8) * 4 - t.f0);
        const uint8_t* b = row + t.f0 / 4 * 3;
        int64_t f = 0;
        for (; f + 4 <= full; f += 4, b += 3) {
          const uint32_t word = b[0] | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16);
          for (int s = 0; s < 4; ++s) fields[f + s] = static_cast<uint8_t>((word >> (6 * s)) & 63u);
        }
        if (f < nf) row_fields(L, row, t.f0 + f, t.f1, codes.data(), fields.data() + f);
      } else {
        row_fields(L, row, t.f0, t.f1, codes.data(), fields.data());
      }
      v = fields.data();
    }
    acc_t* tab = t.table;
    int64_t f = 0;
    // Four independent fields per step: their read-modify-writes overlap.
    for (; f + 4 <= nf; f += 4, tab += 4 * stride) {
      QueryVec<acc_t, NQ>::add(tab + v[f] * NQ, c);
      QueryVec<acc_t, NQ>::add(tab + stride + v[f + 1] * NQ, c);
      QueryVec<acc_t, NQ>::add(tab + 2 * stride + v[f + 2] * NQ, c);
      QueryVec<acc_t, NQ>::add(tab + 3 * stride + v[f + 3] * NQ, c);
    }
    for (; f < nf; ++f, tab += stride) QueryVec<acc_t, NQ>::add(tab + v[f] * NQ, c);
  }
  // out[q, f·k + c] = Σ_v A[f][v][q] · levels[code c of v].
  const uint32_t code_mask = (1u << L.bits) - 1u;
  for (int64_t f = 0; f < nf; ++f) {
    const acc_t* tab = t.table + f * L.E * NQ;
    for (int64_t c = 0; c < L.k; ++c) {
      const int64_t col = (t.f0 + f) * L.k + c;
      if (col >= L.d) break;
      acc_t s[NQ] = {};
      for (int64_t v = 0; v < L.E; ++v) {
        const acc_t lv = t.levels[(static_cast<uint32_t>(v) >> (c * L.bits)) & code_mask];
        for (int q = 0; q < NQ; ++q) s[q] += tab[v * NQ + q] * lv;
      }
      for (int64_t q = 0; q < t.nq; ++q) t.out[q * L.d + col] = s[q];
    }
  }
}

template <typename acc_t, int NQ>
KVSTATS_ALWAYS_INLINE void table_task_nq(const TableTask<acc_t>& t) {
  if (t.L.fb == 8) {
    table_task_any<acc_t, NQ, true>(t);
  } else {
    table_task_any<acc_t, NQ, false>(t);
  }
}

// One task of the min-max kernel: coordinates [t0, t1) of one group for queries [0, nq) of a block.
template <typename acc_t>
struct MinMaxTask {
  int64_t d = 0, bits = 0, nb = 0, group = 1, nk = 0, t0 = 0, t1 = 0, nq = 0;
  const uint8_t* codes = nullptr;  // [nk, nb] of the group
  const acc_t* lo = nullptr;       // [nk, d/group]
  const acc_t* step = nullptr;     // [nk, d/group]
  const acc_t* w = nullptr;        // w[q, j] at w + q · w_stride + j
  int64_t w_stride = 0;
  acc_t* acc = nullptr;            // scratch [nq, t1 − t0]
  acc_t* out = nullptr;            // out[q, t] at out + q · d + t
};

template <typename acc_t>
KVSTATS_ALWAYS_INLINE void minmax_task_any(const MinMaxTask<acc_t>& t) {
  const int64_t dc = t.t1 - t.t0, ng = t.d / t.group;
  std::fill(t.acc, t.acc + t.nq * dc, acc_t(0));
  uint8_t codes[kWeightedDimChunk];
  acc_t x_hat[kWeightedDimChunk];
  for (int64_t j = 0; j < t.nk; ++j) {
    // t0 is a multiple of 8: the chunk's codes are a packed stream of their own from byte t0·bits/8.
    unpack_row(t.codes + j * t.nb + t.t0 * t.bits / 8, dc, t.bits, codes);
    const acc_t* lo = t.lo + j * ng;
    const acc_t* step = t.step + j * ng;
    for (int64_t a = t.t0; a < t.t1;) {
      const int64_t gi = a / t.group, b = std::min(t.t1, (gi + 1) * t.group);
      const acc_t l = lo[gi], s = step[gi];
      // math::minmax_value, its plain lo + step·code first (vectorised); the halves only where that overflowed.
      bool finite = true;
      for (int64_t i = a - t.t0; i < b - t.t0; ++i) {
        x_hat[i] = l + s * static_cast<acc_t>(codes[i]);
        finite &= math::is_finite(x_hat[i]);
      }
      if (!finite)
        for (int64_t i = a - t.t0; i < b - t.t0; ++i) x_hat[i] = math::minmax_value(l, s, codes[i]);
      a = b;
    }
    for (int64_t q = 0; q < t.nq; ++q) {
      const acc_t wq = t.w[q * t.w_stride + j];
      acc_t* __restrict__ aq = t.acc + q * dc;
      const acc_t* __restrict__ xh = x_hat;
      for (int64_t i = 0; i < dc; ++i) aq[i] += wq * xh[i];
    }
  }
  for (int64_t q = 0; q < t.nq; ++q)
    for (int64_t i = 0; i < dc; ++i) t.out[q * t.d + t.t0 + i] = t.acc[q * dc + i];
}

// The fp32 instances with an AVX2 clone (weighted_sum_cpu.cpp).
void table_task_f32_1(const TableTask<float>& t);
void table_task_f32_4(const TableTask<float>& t);
void table_task_f32_8(const TableTask<float>& t);
void minmax_task_f32(const MinMaxTask<float>& t);

template <typename acc_t, int NQ>
inline void table_task(const TableTask<acc_t>& t) {
  if constexpr (std::is_same_v<acc_t, float>) {
    if constexpr (NQ == 1) table_task_f32_1(t);
    else if constexpr (NQ == 4) table_task_f32_4(t);
    else table_task_f32_8(t);
  } else {
    table_task_nq<acc_t, NQ>(t);
  }
}

template <typename acc_t>
inline void minmax_task(const MinMaxTask<acc_t>& t) {
  if constexpr (std::is_same_v<acc_t, float>) {
    minmax_task_f32(t);
  } else {
    minmax_task_any<acc_t>(t);
  }
}

}  // namespace cpu
}  // namespace kvstats
