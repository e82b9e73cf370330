// Small helpers shared by the CPU kernels.
#pragma once

#include <ATen/ATen.h>

namespace kvstats {
namespace cpu {

// v rounded to the precision of `dtype` (how a stored norm / offset / scale is kept), back in acc_t.
template <typename acc_t>
inline acc_t round_to(acc_t v, at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return static_cast<acc_t>(static_cast<float>(static_cast<at::Half>(static_cast<float>(v))));
    case at::kBFloat16:
      return static_cast<acc_t>(static_cast<float>(static_cast<at::BFloat16>(static_cast<float>(v))));
    case at::kFloat: return static_cast<acc_t>(static_cast<float>(v));
    default: return v;
  }
}

// Rows per chunk when an op needs a scratch buffer per row (bounds the extra memory).
constexpr int64_t kChunkRows = 8192;

}  // namespace cpu
}  // namespace kvstats

#include "../bitpack.h"

namespace kvstats {
namespace cpu {

// Pack d codes (masked to `bits` bits) of one vector into ceil(d*bits/8) bytes, eight codes at a time.
inline void pack_row(const uint8_t* codes, int64_t d, int64_t bits, uint8_t* out) {
  const uint8_t mask = static_cast<uint8_t>((1u << bits) - 1u);
  const int64_t full = d / 8;
  uint8_t group[8];
  for (int64_t c = 0; c < full; ++c) {
    for (int t = 0; t < 8; ++t) group[t] = codes[8 * c + t] & mask;
    pack_group8(group, bits, out + c * bits);
  }
  if (full * 8 < d) {
    auto code_at = [&](int64_t i) { return static_cast<uint32_t>(codes[i] & mask); };
    for (int64_t k = full * bits; k < packed_bytes(d, bits); ++k) out[k] = pack_byte(code_at, d, bits, k);
  }
}

// Unpack the d codes of one packed vector of ceil(d*bits/8) bytes.
inline void unpack_row(const uint8_t* in, int64_t d, int64_t bits, uint8_t* codes) {
  const int64_t full = d / 8, nb = packed_bytes(d, bits);
  for (int64_t c = 0; c < full; ++c) unpack_group8(in + c * bits, bits, codes + 8 * c);
  for (int64_t i = full * 8; i < d; ++i) codes[i] = static_cast<uint8_t>(unpack_code(in, nb, bits, i));
}

}  // namespace cpu
}  // namespace kvstats

#include <ATen/Parallel.h>

#include <vector>

namespace kvstats {
namespace cpu {

// Signs of proj [rows, m] (bit 1 for >= 0) packed 8 per byte into out [rows, ceil(m/8)].
template <typename acc_t>
inline void pack_sign_rows(const acc_t* proj, int64_t rows, int64_t m, uint8_t* out) {
  const int64_t mb = packed_bytes(m, 1);
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> bits(m);
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t i = 0; i < m; ++i) bits[i] = proj[r * m + i] >= acc_t(0);
      pack_row(bits.data(), m, 1, out + r * mb);
    }
  });
}

}  // namespace cpu
}  // namespace kvstats
