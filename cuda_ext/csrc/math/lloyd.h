// Lloyd–Max rows: the scaled load and norm, encode, the TurboQuant_prod residual, decode, sign decode,
// and the parameters of an encode launch.
#pragma once

#include <cstdint>

#include "../bitpack.h"
#include "pack.h"
#include "scalar.h"
#include "signs.h"
#include "wht.h"

namespace kvstats {
namespace math {

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

}  // namespace math
}  // namespace kvstats
