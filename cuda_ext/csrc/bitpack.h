// Bit layout of packed codes, shared by the CPU and CUDA kernels. The one definition of the layout is
// in kvstats/packing.py: code i of a vector (`bits` bits, 1 <= bits <= 8) occupies stream bits
// [i*bits, (i+1)*bits), least significant bit first; stream bit p is bit (p % 8) of byte p / 8; a
// vector takes ceil(d*bits/8) bytes, the tail zero-padded. Signs: bit 1 = +1, bit 0 = -1.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KVSTATS_HD __host__ __device__ __forceinline__
#else
#define KVSTATS_HD inline
#endif

namespace kvstats {

KVSTATS_HD int64_t packed_bytes(int64_t d, int64_t bits) { return (d * bits + 7) / 8; }

// Byte k of a packed vector, assembled from the codes that overlap stream bits [8k, 8k + 8).
// code_at(i) returns code i as uint32_t (already masked to `bits` bits).
template <typename CodeAt>
KVSTATS_HD uint8_t pack_byte(const CodeAt& code_at, int64_t d, int64_t bits, int64_t k) {
  const int64_t first = (8 * k) / bits;
  int64_t last = (8 * k + 7) / bits;
  if (last > d - 1) last = d - 1;
  uint32_t acc = 0;
  for (int64_t i = first; i <= last; ++i) {
    const int64_t shift = i * bits - 8 * k;
    const uint32_t c = code_at(i);
    acc |= shift >= 0 ? (c << shift) : (c >> (-shift));
  }
  return static_cast<uint8_t>(acc & 0xFFu);
}

// Code i of a packed vector `row` of `nbytes` bytes.
KVSTATS_HD uint32_t unpack_code(const uint8_t* row, int64_t nbytes, int64_t bits, int64_t i) {
  const int64_t pos = i * bits;
  const int64_t byte = pos >> 3;
  const int64_t shift = pos & 7;
  uint32_t word = row[byte];
  if (shift + bits > 8 && byte + 1 < nbytes) word |= static_cast<uint32_t>(row[byte + 1]) << 8;
  return (word >> shift) & ((1u << bits) - 1u);
}

// Index of the Lloyd–Max cell of u: the number of thresholds strictly below u (torch.bucketize,
// right=False: a value equal to a threshold falls in the lower cell). thresholds ascending, 2^bits - 1
// of them. Branch-free binary lifting: bit by bit, step into the upper half when its first
// threshold is still below u (compiles to conditional moves on CPU, no divergence on GPU).
template <typename acc_t>
KVSTATS_HD uint32_t cell_index(acc_t u, const acc_t* thresholds, int64_t bits) {
  uint32_t idx = 0;
  for (uint32_t step = 1u << (bits - 1); step > 0; step >>= 1) idx += thresholds[idx + step - 1] < u ? step : 0u;
  return idx;
}

// Eight consecutive codes take exactly `bits` bytes: codes 8c .. 8c+7 live in bytes [c*bits, (c+1)*bits).
// These pack/unpack one such group through a 64-bit word (little-endian byte order, as the layout).
KVSTATS_HD void pack_group8(const uint8_t* codes, int64_t bits, uint8_t* out) {
  uint64_t word = 0;
  for (int t = 0; t < 8; ++t) word |= static_cast<uint64_t>(codes[t]) << (t * bits);
  for (int64_t b = 0; b < bits; ++b) out[b] = static_cast<uint8_t>(word >> (8 * b));
}

KVSTATS_HD void unpack_group8(const uint8_t* in, int64_t bits, uint8_t* codes) {
  uint64_t word = 0;
  for (int64_t b = 0; b < bits; ++b) word |= static_cast<uint64_t>(in[b]) << (8 * b);
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  for (int t = 0; t < 8; ++t) codes[t] = static_cast<uint8_t>((word >> (t * bits)) & mask);
}

}  // namespace kvstats
