// Scalar arithmetic of the kernels: square root, rounding, finiteness, rounding to a stored dtype, and the
// power-of-two scaling that keeps norms from overflowing. KVSTATS_HD: host and device (bitpack.h).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>

#include "../bitpack.h"

// nvcc: a __host__ __device__ template may call device-only members of its Lanes argument (CUDA's
// BlockLanes); each instantiation is only ever used on one side, so the cross-side check is silenced.
#ifdef __CUDACC__
#define KVSTATS_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define KVSTATS_HD_TEMPLATE
#endif

namespace kvstats {
namespace math {

// -------------------------------------------------------------------------------------- scalar helpers
template <typename acc_t>
KVSTATS_HD acc_t sqrt_of(acc_t v) {
#ifdef __CUDA_ARCH__
  return sqrt(v);
#else
  return std::sqrt(v);
#endif
}

// Round half to even (the reference's torch.round).
template <typename acc_t>
KVSTATS_HD acc_t round_half_even(acc_t v) {
#ifdef __CUDA_ARCH__
  return nearbyint(v);
#else
  return std::nearbyint(v);
#endif
}

// False for ±inf and NaN (no <cmath> classification, which differs between host and device).
template <typename acc_t>
KVSTATS_HD bool is_finite(acc_t v) {
  return v - v == acc_t(0);
}

template <typename acc_t>
KVSTATS_HD acc_t abs_of(acc_t v) {
  return v < acc_t(0) ? -v : v;
}

// ------------------------------------------------------------------------------ rounding to storage
// The dtype a stored scalar (a norm, a min-max offset or step) is kept in; named, not a magic number.
enum class Stored : int8_t { kFloat32, kFloat16, kBFloat16, kKeep };

// v rounded to the precision it is stored in, back in acc_t (decode sees exactly what encode used).
template <typename acc_t>
KVSTATS_HD acc_t round_to_stored(acc_t v, Stored stored) {
  switch (stored) {
    case Stored::kFloat32: return static_cast<acc_t>(static_cast<float>(v));
    case Stored::kFloat16: return static_cast<acc_t>(static_cast<float>(c10::Half(static_cast<float>(v))));
    case Stored::kBFloat16: return static_cast<acc_t>(static_cast<float>(c10::BFloat16(static_cast<float>(v))));
    default: return v;
  }
}

// --------------------------------------------------------------------------- overflow-free norms
// A row is scaled by 2^-e, e the binary exponent of its largest |value|, before it is squared: the
// scaled values lie in [-1, 1], so Σ v² never overflows (fp32 rows of norm up to ~3e38, not 1.8e19).
// Scaling by a power of two is exact, so for rows that never overflowed every result is bit-identical
// to the unscaled computation. e is clamped so that 2^±e stays a normal number of acc_t.
template <typename acc_t>
KVSTATS_HD int scale_exponent(acc_t max_abs) {
  if (!(max_abs > acc_t(0)) || !is_finite(max_abs)) return 0;
  int e = 0;
  (void)::frexp(static_cast<double>(max_abs), &e);
  const int limit = sizeof(acc_t) >= 8 ? 1000 : 120;
  return e > limit ? limit : (e < -limit ? -limit : e);
}

template <typename acc_t>
KVSTATS_HD acc_t pow2(int e) {
  return static_cast<acc_t>(::ldexp(1.0, e));
}

// The norm of a row from the sum of squares of its values scaled by 2^-e.
template <typename acc_t>
KVSTATS_HD acc_t unscaled_norm(acc_t scaled_sum_squares, int e) {
  return sqrt_of(scaled_sum_squares) * pow2<acc_t>(e);
}

}  // namespace math
}  // namespace kvstats
