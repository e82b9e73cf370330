// In-place Walsh–Hadamard butterflies and the randomized-Hadamard rotation on one vector (CPU).
#pragma once

#include <cmath>
#include <cstdint>

#include "../quant_math.h"

namespace kvstats {
namespace cpu {

// The CPU fast path of the WHT (the shared one, run by the GPU, is math::wht_butterflies).
// Unnormalised Sylvester–Hadamard transform of buf[0..n), n a power of two. The butterfly stages
// commute, so the three short-stride stages (h = 1, 2, 4) run first as an unrolled 8-point transform
// per block of 8, and the long strides (h >= 8) as loops the compiler vectorises.
template <typename acc_t>
inline void butterfly_inplace(acc_t* buf, int64_t n) {
  int64_t h = 1;
  if (n >= 8) {
    for (int64_t i = 0; i < n; i += 8) {
      acc_t* a = buf + i;
      const acc_t b0 = a[0] + a[1], b1 = a[0] - a[1], b2 = a[2] + a[3], b3 = a[2] - a[3];
      const acc_t b4 = a[4] + a[5], b5 = a[4] - a[5], b6 = a[6] + a[7], b7 = a[6] - a[7];
      const acc_t c0 = b0 + b2, c1 = b1 + b3, c2 = b0 - b2, c3 = b1 - b3;
      const acc_t c4 = b4 + b6, c5 = b5 + b7, c6 = b4 - b6, c7 = b5 - b7;
      a[0] = c0 + c4; a[1] = c1 + c5; a[2] = c2 + c6; a[3] = c3 + c7;
      a[4] = c0 - c4; a[5] = c1 - c5; a[6] = c2 - c6; a[7] = c3 - c7;
    }
    h = 8;
  }
  for (; h < n; h <<= 1) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      acc_t* __restrict__ lo = buf + i;
      acc_t* __restrict__ hi = buf + i + h;
      for (int64_t j = 0; j < h; ++j) {
        const acc_t a = lo[j];
        const acc_t b = hi[j];
        lo[j] = a + b;
        hi[j] = a - b;
      }
    }
  }
}

// Randomized Hadamard rotation of buf[0..d): `passes` (0, 1 or 3) sign-flip + orthonormal WHT passes
// over blocks of `block` coordinates starting at 0, d - block, 0 (kvstats.rotations.RandomizedHadamard).
// signs: [passes, block]. Order per pass: multiply by signs, butterflies, scale by 1/sqrt(block) —
// the same operations, in the same order, as the pure-torch path fwht(x * signs).
template <typename acc_t>
inline void rotate_forward(acc_t* buf, int64_t d, const acc_t* signs, int64_t passes, int64_t block) {
  const acc_t scale = math::wht_scale<acc_t>(block);
  for (int64_t k = 0; k < passes; ++k) {
    acc_t* span = buf + math::pass_start(k, d, block);
    const acc_t* s = signs + k * block;
    for (int64_t j = 0; j < block; ++j) span[j] *= s[j];
    butterfly_inplace(span, block);
    for (int64_t j = 0; j < block; ++j) span[j] *= scale;
  }
}

// Inverse of rotate_forward: passes in reverse order, each fwht(span) * signs.
template <typename acc_t>
inline void rotate_inverse(acc_t* buf, int64_t d, const acc_t* signs, int64_t passes, int64_t block) {
  const acc_t scale = math::wht_scale<acc_t>(block);
  for (int64_t k = passes - 1; k >= 0; --k) {
    acc_t* span = buf + math::pass_start(k, d, block);
    const acc_t* s = signs + k * block;
    butterfly_inplace(span, block);
    for (int64_t j = 0; j < block; ++j) span[j] = span[j] * scale * s[j];
  }
}

}  // namespace cpu
}  // namespace kvstats
