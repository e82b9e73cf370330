// The Walsh–Hadamard transform and the randomized-Hadamard rotation Π as row programs.
#pragma once

#include <cstdint>

#include "scalar.h"

namespace kvstats {
namespace math {

// ---------------------------------------------------------------------------- Walsh–Hadamard transform
// One butterfly of stage h (a power of two): pair p (0 <= p < n/2) joins i = (p / h)·2h + p % h and i + h.
template <typename acc_t>
KVSTATS_HD void butterfly(acc_t* buf, int64_t h, int64_t p) {
  const int64_t i = (p / h) * 2 * h + (p % h);
  const acc_t a = buf[i];
  const acc_t b = buf[i + h];
  buf[i] = a + b;
  buf[i + h] = a - b;
}

template <typename acc_t>
KVSTATS_HD acc_t wht_scale(int64_t n) {
  return acc_t(1) / sqrt_of(static_cast<acc_t>(n));
}

// The randomized-Hadamard pass schedule (kvstats.rotations.RandomizedHadamard): `passes` (0, 1 or 3)
// passes over blocks of `block` coordinates starting at 0, d − block, 0; signs [passes, block].
struct Rotation {
  const void* signs = nullptr;  // acc_t [passes, block]
  int64_t passes = 0;
  int64_t block = 0;
};

KVSTATS_HD int64_t pass_start(int64_t k, int64_t d, int64_t block) { return k == 1 ? d - block : 0; }

// Unnormalised Sylvester–Hadamard transform of buf[0..n) (n a power of two): log2(n) stages of n/2
// butterflies, the lanes splitting each stage, a barrier between stages.
KVSTATS_HD_TEMPLATE
template <typename acc_t, typename Lanes>
KVSTATS_HD void wht_butterflies(acc_t* buf, int64_t n, const Lanes& lanes) {
  const int64_t half = n >> 1;
  for (int64_t h = 1; h < n; h <<= 1) {
    for (int64_t p = lanes.id(); p < half; p += lanes.count()) butterfly(buf, h, p);
    lanes.sync();
  }
}

// Π buf: per pass, multiply by the signs, butterflies, scale by 1/√block (the same operations in the same
// order as the reference fwht(x · s)).
KVSTATS_HD_TEMPLATE
template <typename acc_t, typename Lanes>
KVSTATS_HD void rotate_forward(acc_t* buf, int64_t d, const Rotation& rot, const Lanes& lanes) {
  const acc_t scale = wht_scale<acc_t>(rot.block);
  const acc_t* signs = static_cast<const acc_t*>(rot.signs);
  for (int64_t k = 0; k < rot.passes; ++k) {
    acc_t* span = buf + pass_start(k, d, rot.block);
    const acc_t* s = signs + k * rot.block;
    for (int64_t j = lanes.id(); j < rot.block; j += lanes.count()) span[j] *= s[j];
    lanes.sync();
    wht_butterflies(span, rot.block, lanes);
    for (int64_t j = lanes.id(); j < rot.block; j += lanes.count()) span[j] *= scale;
    lanes.sync();
  }
}

// Πᵀ buf: the passes in reverse, each fwht(span) · s.
KVSTATS_HD_TEMPLATE
template <typename acc_t, typename Lanes>
KVSTATS_HD void rotate_inverse(acc_t* buf, int64_t d, const Rotation& rot, const Lanes& lanes) {
  const acc_t scale = wht_scale<acc_t>(rot.block);
  const acc_t* signs = static_cast<const acc_t*>(rot.signs);
  for (int64_t k = rot.passes - 1; k >= 0; --k) {
    acc_t* span = buf + pass_start(k, d, rot.block);
    const acc_t* s = signs + k * rot.block;
    wht_butterflies(span, rot.block, lanes);
    for (int64_t j = lanes.id(); j < rot.block; j += lanes.count()) span[j] = span[j] * scale * s[j];
    lanes.sync();
  }
}

// The orthonormal WHT of one row: load into buf (acc_t), butterflies, scale by 1/√d, store.
KVSTATS_HD_TEMPLATE
template <typename scalar_t, typename acc_t, typename Lanes>
KVSTATS_HD void fwht_row(const scalar_t* x, scalar_t* y, int64_t d, acc_t* buf, const Lanes& lanes) {
  for (int64_t j = lanes.id(); j < d; j += lanes.count()) buf[j] = static_cast<acc_t>(x[j]);
  lanes.sync();
  wht_butterflies(buf, d, lanes);
  const acc_t scale = wht_scale<acc_t>(d);
  for (int64_t j = lanes.id(); j < d; j += lanes.count()) y[j] = static_cast<scalar_t>(buf[j] * scale);
}

}  // namespace math
}  // namespace kvstats
