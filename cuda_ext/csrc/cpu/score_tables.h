// Scoring packed codes against queries with lookup tables (CPU).
//
// For a query q and a packed key row, the estimator is a sum over bytes p of a function of byte p
// alone whenever codes never straddle bytes (bits ∈ {1, 2, 4, 8}, and sign bits). So per query we
// tabulate T[p][v] (v = 0..255) once, and each key costs nbytes table look-ups — fewer operations and
// fewer bytes read than a dense dot product over the unquantised key. 3-bit codes straddle bytes, but
// eight of them fill exactly three bytes: read those as a 24-bit word and look up its four 6-bit
// fields (pairs of codes) in 64-entry tables — again d/2 look-ups per key. Other widths (5, 6, 7 bits)
// unpack the row and look up each code.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "../bitpack.h"
#include "../quant_math.h"

namespace kvstats {
namespace cpu {

// A little-endian 32-bit word as loaded on this host (the packed layout is little-endian).
inline uint32_t le32(uint32_t w) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return __builtin_bswap32(w);
#else
  return w;
#endif
}

// T[p][v] = sum_t q[p*per + t] * levels[(v >> (t*bits)) & mask], per = 8 / bits (math::code_byte_entry).
template <typename acc_t>
inline void build_code_table(const acc_t* q, int64_t d, const acc_t* levels, int64_t bits, int64_t nb, acc_t* table) {
  for (int64_t p = 0; p < nb; ++p)
    for (uint32_t v = 0; v < 256; ++v) table[p * 256 + v] = math::code_byte_entry(q, d, levels, bits, p, v);
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

// Per-query table of the codes of one packed row: its layout and size (in values).
struct CodeTable {
  enum class Layout { kByte, kPair3, kCode };
  Layout layout;
  int64_t d, bits, nb, groups, size;

  CodeTable(int64_t d_, int64_t bits_) : d(d_), bits(bits_), nb(packed_bytes(d_, bits_)), groups(d_ / 8) {
    if (8 % bits == 0) {
      layout = Layout::kByte;
      size = nb * 256;
    } else if (bits == 3) {
      layout = Layout::kPair3;  // groups of 8 codes: 4 pair tables of 64; the tail code by code
      size = groups * 256 + (d - 8 * groups) * 8;
    } else {
      layout = Layout::kCode;
      size = d << bits;
    }
  }
};

template <typename acc_t>
inline void build_code_table(const CodeTable& ct, const acc_t* q, const acc_t* levels, acc_t* table) {
  const int64_t L = int64_t{1} << ct.bits;
  auto per_code = [&](int64_t first, acc_t* t) {  // t[(i - first) * L + c] = q[i] * levels[c]
    for (int64_t i = first; i < ct.d; ++i)
      for (int64_t c = 0; c < L; ++c) t[(i - first) * L + c] = q[i] * levels[c];
  };
  switch (ct.layout) {
    case CodeTable::Layout::kByte: build_code_table(q, ct.d, levels, ct.bits, ct.nb, table); break;
    case CodeTable::Layout::kPair3:
      for (int64_t g = 0; g < ct.groups; ++g)
        for (int64_t p = 0; p < 4; ++p)
          for (uint32_t v = 0; v < 64; ++v)
            table[g * 256 + p * 64 + v] = q[8 * g + 2 * p] * levels[v & 7u] + q[8 * g + 2 * p + 1] * levels[v >> 3];
      per_code(8 * ct.groups, table + ct.groups * 256);
      break;
    case CodeTable::Layout::kCode: per_code(0, table); break;
  }
}

// Sum over the 3-bit codes of one row from its kPair3 table: each group of 8 codes is 3 bytes, read as
// one little-endian word (4 bytes, the 4th masked off, except for the last group, which may end the
// buffer), whose four 6-bit fields index four 64-entry tables.
template <typename acc_t>
inline acc_t pair3_sum(const CodeTable& ct, const acc_t* table, const uint8_t* row) {
  acc_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int64_t g = 0; g < ct.groups; ++g) {
    const uint8_t* b = row + 3 * g;
    uint32_t w;
    if (g + 1 < ct.groups) {
      std::memcpy(&w, b, 4);
      w = le32(w);
    } else {
      w = b[0] | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16);
    }
    const acc_t* t = table + g * 256;
    s0 += t[w & 63u];
    s1 += t[64 + ((w >> 6) & 63u)];
    s2 += t[128 + ((w >> 12) & 63u)];
    s3 += t[192 + ((w >> 18) & 63u)];
  }
  const acc_t* tail = table + ct.groups * 256;
  for (int64_t i = 8 * ct.groups; i < ct.d; ++i) s0 += tail[(i - 8 * ct.groups) * 8 + unpack_code(row, ct.nb, 3, i)];
  return (s0 + s1) + (s2 + s3);
}

// Sum over the codes of one row from its kCode table; codes: scratch of d bytes.
template <typename acc_t>
inline acc_t per_code_sum(const CodeTable& ct, const acc_t* table, const uint8_t* row, uint8_t* codes) {
  const int64_t L = int64_t{1} << ct.bits;
  for (int64_t g = 0; g < ct.groups; ++g) unpack_group8(row + g * ct.bits, ct.bits, codes + 8 * g);
  for (int64_t i = 8 * ct.groups; i < ct.d; ++i) codes[i] = static_cast<uint8_t>(unpack_code(row, ct.nb, ct.bits, i));
  acc_t s = 0;
  for (int64_t i = 0; i < ct.d; ++i) s += table[i * L + codes[i]];
  return s;
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
