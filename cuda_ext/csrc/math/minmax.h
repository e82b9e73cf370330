// KIVI-style min-max groups: offset, step, codes and values, overflow-free.
#pragma once

#include <cstdint>

#include "scalar.h"

namespace kvstats {
namespace math {

// ------------------------------------------------------------------------------------- min-max groups
template <typename acc_t>
struct MinMaxParams {
  acc_t lo;    // the group's minimum, rounded to the stored dtype
  acc_t step;  // (max − min) / (2^bits − 1), rounded to the stored dtype
};

// Offset and step of a group with minimum lo and maximum hi. hi − lo overflows for finite values of
// opposite sign near the dtype's maximum: then hi/top − lo/top, which does not.
template <typename acc_t>
KVSTATS_HD MinMaxParams<acc_t> minmax_params(acc_t lo, acc_t hi, int64_t bits, Stored stored) {
  const acc_t top = static_cast<acc_t>((int64_t{1} << bits) - 1);
  const acc_t range = hi - lo;
  const acc_t step = is_finite(range) ? range / top : hi / top - lo / top;
  return {round_to_stored(lo, stored), round_to_stored(step, stored)};
}

// The code of v: clamp(round((v − lo)/step), 0, 2^bits − 1), half to even; 0 where step = 0.
template <typename acc_t>
KVSTATS_HD uint8_t minmax_code(acc_t v, MinMaxParams<acc_t> p, int64_t bits) {
  if (!(p.step > acc_t(0))) return 0;
  const acc_t top = static_cast<acc_t>((int64_t{1} << bits) - 1);
  const acc_t diff = v - p.lo;
  acc_t c = round_half_even(is_finite(diff) ? diff / p.step : v / p.step - p.lo / p.step);
  c = c < acc_t(0) ? acc_t(0) : (c > top ? top : c);
  return static_cast<uint8_t>(c);
}

// x̂ = lo + step · code; where step · code overflows (a range wider than the dtype's maximum) but x̂
// does not, the halves (lo/2 + step · code/2) · 2, all exact scalings by two.
template <typename acc_t>
KVSTATS_HD acc_t minmax_value(acc_t lo, acc_t step, uint32_t code) {
  const acc_t c = static_cast<acc_t>(code);
  const acc_t v = lo + step * c;
  return is_finite(v) ? v : (lo * acc_t(0.5) + step * (c * acc_t(0.5))) * acc_t(2);
}

// One group of `group` values: its parameters, and its codes written to codes[0..group).
template <typename scalar_t, typename acc_t>
KVSTATS_HD MinMaxParams<acc_t> minmax_group(const scalar_t* gx, int64_t group, int64_t bits, Stored stored,
                                            uint8_t* codes) {
  acc_t lo = static_cast<acc_t>(gx[0]), hi = lo;
  for (int64_t j = 1; j < group; ++j) {
    const acc_t v = static_cast<acc_t>(gx[j]);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  // Codes come from the stored (rounded) offset and step, so decode matches what is kept.
  const MinMaxParams<acc_t> p = minmax_params(lo, hi, bits, stored);
  for (int64_t j = 0; j < group; ++j) codes[j] = minmax_code(static_cast<acc_t>(gx[j]), p, bits);
  return p;
}

}  // namespace math
}  // namespace kvstats
