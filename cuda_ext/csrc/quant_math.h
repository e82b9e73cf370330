// The arithmetic of every kvstats kernel, written once for the CPU and the GPU.
//
// Everything here is KVSTATS_HD (`__host__ __device__` under nvcc, plain `inline` otherwise): the CPU
// kernels (csrc/cpu) and the CUDA kernels (csrc/cuda) both include this header and call it, so the CPU
// test suite runs the very lines the GPU runs. What stays in the backend files is the mapping only:
// threads, blocks, shared memory and warp reductions on CUDA; loops, SIMD twins and OpenMP on the CPU.
//
// Row programs (encode_lloyd_row, decode_lloyd_row, fwht_row, ...) are written for a group of `Lanes`
// that cooperate on one row: lane i of n handles elements i, i + n, ...; `sync()` is a barrier and
// `sum`/`max` are reductions whose result every lane receives. CUDA instantiates them with the threads
// of a block (csrc/cuda/device_utils.cuh: BlockLanes); the CPU's shared path with one serial lane
// (SerialLanes below), which is the GPU's code path run on the CPU (kvstats.ops.shared_path()).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>

#include "bitpack.h"

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

// ------------------------------------------------------------------------------------ Lloyd–Max cells
// Index of the cell of u: the number of thresholds strictly below u (torch.bucketize, right=False),
// for every width 1–8: cell_index in bitpack.h (branch-free binary lifting over 2^bits − 1 thresholds).
using kvstats::cell_index;

// The value a code stands for: norm · levels[code].
template <typename acc_t>
KVSTATS_HD acc_t level_value(const acc_t* levels, uint32_t code, acc_t norm) {
  return levels[code] * norm;
}

// u = y / ‖x‖ (a zero vector gives u = 0).
template <typename acc_t>
KVSTATS_HD acc_t unit_denominator(acc_t norm) {
  return norm > acc_t(0) ? norm : acc_t(1);
}

// ------------------------------------------------------------------------------------------- signs
// Sign bits (bitpack.h layout): bit 1 for v >= 0 (so sign(0) = +1), bit 0 for v < 0.
template <typename acc_t>
KVSTATS_HD uint32_t sign_bit(acc_t v) {
  return v >= acc_t(0) ? 1u : 0u;
}

// ±w for a sign bit.
template <typename acc_t>
KVSTATS_HD acc_t sign_value(uint32_t bit, acc_t w) {
  return bit ? w : -w;
}

// Sign bit i of a packed row.
KVSTATS_HD uint32_t sign_bit_at(const uint8_t* row, int64_t i) { return (row[i >> 3] >> (i & 7)) & 1u; }

// ------------------------------------------------------------------------------------------- QJL
// The QJL estimator of <q, k> (arXiv 2406.03482, Lemma 3.2): √(π/2)/m · ‖k‖ · <S q, sign(S k)>. The
// quantizers pass the constant scale = √(π/2)/m (times their own factors) to the score ops; a key's
// sign part is weighted by qjl_key_weight(‖k‖ or γ, scale).

template <typename acc_t>
KVSTATS_HD acc_t qjl_key_weight(acc_t norm, acc_t scale) {
  return norm * scale;
}

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

// ----------------------------------------------------------------------------------------- packing
// Bytes [0, ceil(d·bits/8)) of a packed row from code_at(i), split over the lanes (no two lanes write
// one byte, so no atomics).
KVSTATS_HD_TEMPLATE
template <typename CodeAt, typename Lanes>
KVSTATS_HD void pack_row(const CodeAt& code_at, int64_t d, int64_t bits, uint8_t* out, const Lanes& lanes) {
  const int64_t nb = packed_bytes(d, bits);
  for (int64_t k = lanes.id(); k < nb; k += lanes.count()) out[k] = pack_byte(code_at, d, bits, k);
}

// --------------------------------------------------------------------------------- Lloyd–Max rows
// The result of encoding one row: the norm is ‖x‖ = scaled_norm · 2^exponent (see scale_exponent);
// the row buffer holds the scaled rotated vector y' = Π x · 2^-exponent.
template <typename acc_t>
struct RowNorm {
  acc_t scaled_norm;
  int exponent;
  KVSTATS_HD acc_t norm() const { return scaled_norm * pow2<acc_t>(exponent); }
};

// Load x (any float dtype) into buf scaled by 2^-e and return its norm. buf: d values of acc_t.
KVSTATS_HD_TEMPLATE
template <typename scalar_t, typename acc_t, typename Lanes>
KVSTATS_HD RowNorm<acc_t> load_scaled(const scalar_t* x, int64_t d, acc_t* buf, const Lanes& lanes) {
  acc_t m = 0;
  for (int64_t j = lanes.id(); j < d; j += lanes.count()) {
    const acc_t a = abs_of(static_cast<acc_t>(x[j]));
    m = a > m ? a : m;
  }
  const int e = scale_exponent(lanes.max(m));
  const acc_t s = pow2<acc_t>(-e);
  acc_t ss = 0;
  for (int64_t j = lanes.id(); j < d; j += lanes.count()) {
    const acc_t v = static_cast<acc_t>(x[j]) * s;
    buf[j] = v;
    ss += v * v;
  }
  return {sqrt_of(lanes.sum(ss)), e};
}

// lloyd / turbo_mse encode of one row: norm, rotate, cells, pack. On return buf holds y' (scaled Π x)
// and codes the d cell indices (both read by the TurboQuant_prod residual).
KVSTATS_HD_TEMPLATE
template <typename scalar_t, typename acc_t, typename Lanes>
KVSTATS_HD RowNorm<acc_t> encode_lloyd_row(const scalar_t* x, int64_t d, const Rotation& rot, const acc_t* thresholds,
                                           int64_t bits, acc_t* buf, uint8_t* codes, uint8_t* packed,
                                           const Lanes& lanes) {
  const RowNorm<acc_t> rn = load_scaled(x, d, buf, lanes);
  lanes.sync();
  rotate_forward(buf, d, rot, lanes);
  const acc_t denom = unit_denominator(rn.scaled_norm);
  for (int64_t j = lanes.id(); j < d; j += lanes.count())
    codes[j] = static_cast<uint8_t>(cell_index(buf[j] / denom, thresholds, bits));
  lanes.sync();
  auto code_at = [&](int64_t i) { return static_cast<uint32_t>(codes[i]); };
  pack_row(code_at, d, bits, packed, lanes);
  return rn;
}

// TurboQuant_prod residual of an encoded row (arXiv 2504.19874, Alg. 2): r' = y' − ‖x‖_stored·2^-e ·
// levels[codes], written to residual (may alias buf); returns γ = ‖r‖ (unscaled).
KVSTATS_HD_TEMPLATE
template <typename acc_t, typename Lanes>
KVSTATS_HD acc_t residual_row(const acc_t* buf, const uint8_t* codes, const acc_t* levels, RowNorm<acc_t> rn,
                              Stored stored, int64_t d, acc_t* residual, const Lanes& lanes) {
  const acc_t w = round_to_stored(rn.norm(), stored) * pow2<acc_t>(-rn.exponent);
  acc_t ss = 0;
  for (int64_t j = lanes.id(); j < d; j += lanes.count()) {
    const acc_t r = buf[j] - level_value(levels, codes[j], w);
    residual[j] = r;
    ss += r * r;
  }
  return unscaled_norm(lanes.sum(ss), rn.exponent);
}

// x̂ = Πᵀ(norm · levels[codes]) of one packed row, through buf (d values), written to out.
KVSTATS_HD_TEMPLATE
template <typename acc_t, typename Lanes>
KVSTATS_HD void decode_lloyd_row(const uint8_t* row, acc_t norm, const acc_t* levels, int64_t bits, int64_t d,
                                 const Rotation& rot, acc_t* buf, acc_t* out, const Lanes& lanes) {
  const int64_t nb = packed_bytes(d, bits);
  for (int64_t j = lanes.id(); j < d; j += lanes.count()) buf[j] = level_value(levels, unpack_code(row, nb, bits, j), norm);
  lanes.sync();
  rotate_inverse(buf, d, rot, lanes);
  for (int64_t j = lanes.id(); j < d; j += lanes.count()) out[j] = buf[j];
}

// Sign decode from byte tables (QJL reconstruction Bᵀ b, b ∈ {±1}^m packed 8 per byte, LSB first):
// tables [mb·256, d] hold T[256·p + v] = Σ_t (bit t of v ? +1 : −1) · B[8p + t], so that
//   out[j] = base[j] + w · Σ_p T[256·p + row[p]][j]      (base null: w · Σ_p ...)
// for the mb bytes of one packed row. Lane i of n sums the columns i, i + n, ...
KVSTATS_HD_TEMPLATE
template <typename acc_t, typename Lanes>
KVSTATS_HD void sign_decode_row(const uint8_t* row, int64_t mb, const acc_t* tables, int64_t d, acc_t w,
                                const acc_t* base, acc_t* out, const Lanes& lanes) {
  for (int64_t j = lanes.id(); j < d; j += lanes.count()) {
    acc_t s = 0;
    for (int64_t p = 0; p < mb; ++p) s += tables[(p * 256 + row[p]) * d + j];
    out[j] = base != nullptr ? base[j] + w * s : w * s;
  }
}

// ------------------------------------------------------------------------------------------- scores
//   score(q, key) = mse_w · Σ_t q[t] · levels[code_t]  +  qjl_w · Σ_t qs[t] · (±1)_t
// The code part of one key: Σ_t q[t]·levels[code_t] over its packed row.
template <typename acc_t>
KVSTATS_HD acc_t code_dot(const acc_t* q, const acc_t* levels, const uint8_t* row, int64_t bits, int64_t d) {
  const int64_t nb = packed_bytes(d, bits);
  acc_t s = 0;
  for (int64_t t = 0; t < d; ++t) s += q[t] * levels[unpack_code(row, nb, bits, t)];
  return s;
}

// The sign part of one key: Σ_t ±qs[t] over its packed signs.
template <typename acc_t>
KVSTATS_HD acc_t sign_dot(const acc_t* qs, const uint8_t* row, int64_t m) {
  acc_t s = 0;
  for (int64_t t = 0; t < m; ++t) s += sign_value(sign_bit_at(row, t), qs[t]);
  return s;
}

// Score accumulation: the weighted code part plus the weighted sign part (either absent: weight 0 and
// sum 0 are never formed; the caller passes has_* flags).
template <typename acc_t>
KVSTATS_HD acc_t key_score(bool has_codes, acc_t mse_w, acc_t code_sum, bool has_signs, acc_t qjl_w, acc_t sign_sum) {
  acc_t s = has_codes ? mse_w * code_sum : acc_t(0);
  if (has_signs) s += qjl_w * sign_sum;
  return s;
}

// Entry v of a per-query byte table of codes (score_tables.h): Σ_t q[p·per + t] · levels[field t of v].
template <typename acc_t>
KVSTATS_HD acc_t code_byte_entry(const acc_t* q, int64_t d, const acc_t* levels, int64_t bits, int64_t p, uint32_t v) {
  const int64_t per = 8 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  acc_t s = 0;
  for (int64_t t = 0; t < per; ++t) {
    const int64_t idx = p * per + t;
    if (idx < d) s += q[idx] * levels[(v >> (t * bits)) & mask];
  }
  return s;
}

// ---------------------------------------------------------------------------------- kernel parameters
// The parameters of one score launch, named (instead of 14 positional arguments with null pointers for
// "absent"): the code part is present when codes != nullptr, the sign part when signs != nullptr.
template <typename acc_t>
struct ScoreParams {
  int64_t G = 0, nq = 0, nk = 0;
  // code part: q [G, nq, d], codes [G, nk, ceil(d·bits/8)], mse_w [G, nk], levels [2^bits]
  const acc_t* q = nullptr;
  const uint8_t* codes = nullptr;
  const acc_t* mse_w = nullptr;
  const acc_t* levels = nullptr;
  int64_t bits = 0, d = 0;
  // sign part: qs [G, nq, m], signs [G, nk, ceil(m/8)], qjl_w [G, nk]
  const acc_t* qs = nullptr;
  const uint8_t* signs = nullptr;
  const acc_t* qjl_w = nullptr;
  int64_t m = 0;
  acc_t* out = nullptr;  // [G, nq, nk]
};

// Score of query i of group g against key j (the GPU's one-thread-per-key loop, the CPU's shared path).
template <typename acc_t>
KVSTATS_HD acc_t score_one(const ScoreParams<acc_t>& p, const acc_t* q, const acc_t* qs, int64_t g, int64_t j) {
  const int64_t key = g * p.nk + j;
  const bool has_codes = p.codes != nullptr, has_signs = p.signs != nullptr;
  const acc_t cs = has_codes ? code_dot(q, p.levels, p.codes + key * packed_bytes(p.d, p.bits), p.bits, p.d) : acc_t(0);
  const acc_t ss = has_signs ? sign_dot(qs, p.signs + key * packed_bytes(p.m, 1), p.m) : acc_t(0);
  return key_score(has_codes, has_codes ? p.mse_w[key] : acc_t(0), cs, has_signs, has_signs ? p.qjl_w[key] : acc_t(0), ss);
}

// The parameters of a Lloyd–Max encode (lloyd, turbo_mse; with the residual fields, TurboQuant_prod).
template <typename scalar_t, typename acc_t>
struct LloydEncodeParams {
  const scalar_t* x = nullptr;  // [n, d]
  int64_t n = 0, d = 0, bits = 0;
  Rotation rotation;
  const acc_t* thresholds = nullptr;  // [2^bits − 1]
  uint8_t* packed = nullptr;          // [n, ceil(d·bits/8)]
  acc_t* norm = nullptr;              // [n], ‖x‖ unrounded
  // TurboQuant_prod only (residual == nullptr: plain encode)
  const acc_t* levels = nullptr;      // [2^bits]
  Stored norm_stored = Stored::kKeep;  // how ‖x‖ is stored, so the residual uses what decode will see
  acc_t* residual = nullptr;          // [n, d], the scaled rotated residual r'
  acc_t* gamma = nullptr;             // [n], ‖r‖
};

// Encode row r of a LloydEncodeParams: buf (d values) and codes (d bytes) are the lanes' scratch.
KVSTATS_HD_TEMPLATE
template <typename scalar_t, typename acc_t, typename Lanes>
KVSTATS_HD void encode_params_row(const LloydEncodeParams<scalar_t, acc_t>& p, int64_t r, acc_t* buf, uint8_t* codes,
                                  const Lanes& lanes) {
  const RowNorm<acc_t> rn = encode_lloyd_row(p.x + r * p.d, p.d, p.rotation, p.thresholds, p.bits, buf, codes,
                                             p.packed + r * packed_bytes(p.d, p.bits), lanes);
  if (lanes.id() == 0) p.norm[r] = rn.norm();
  if (p.residual == nullptr) return;
  const acc_t gamma = residual_row(buf, codes, p.levels, rn, p.norm_stored, p.d, p.residual + r * p.d, lanes);
  if (lanes.id() == 0) p.gamma[r] = gamma;
}

// ----------------------------------------------------------------------------- serial lanes (CPU)
// One lane: the CPU's shared path runs the row programs above exactly as one GPU thread block would,
// with the block's threads replaced by a sequential loop.
struct SerialLanes {
  KVSTATS_HD int64_t id() const { return 0; }
  KVSTATS_HD int64_t count() const { return 1; }
  KVSTATS_HD void sync() const {}
  template <typename T>
  KVSTATS_HD T sum(T v) const {
    return v;
  }
  template <typename T>
  KVSTATS_HD T max(T v) const {
    return v;
  }
};

}  // namespace math
}  // namespace kvstats
