// The kvstats_shared backend: the GPU's code on the CPU. Every op runs the row programs of quant_math.h with
// one serial lane (math::SerialLanes) where its CUDA kernel runs them with a thread block (or one thread per
// byte, key or group), the rows spread over the CPU's threads, and lays out its outputs and intermediates as
// the CUDA kernel does (cuda/<family>_cuda.cu). It is slower than the fast CPU kernels (cpu/) and exists so
// that the CPU suite runs the lines the GPU executes: kvstats.ops.shared_path() routes the CPU ops here.
// One file per op family (<family>_shared.cpp), each op its prologue (prologue/<family>.h) and then the loops
// below or its own; this header holds the loops several families run.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../bitpack.h"
#include "../quant_math.h"

namespace kvstats {
namespace shared {

using Lane = math::SerialLanes;

// Rows per chunk where a scratch residual or projection is needed (as the CUDA kernels).
constexpr int64_t kChunkRows = 65536;

// Rows per task: about 2K values, so that small batches stay on one thread.
inline int64_t row_grain(int64_t d) { return std::max<int64_t>(1, 2048 / std::max<int64_t>(d, 1)); }

// Packs codes [n, d] (one byte per code, masked to `bits` bits) into out [n, ceil(d·bits/8)], one byte at a time
// as the CUDA kernel (math::pack_row).
inline void pack_codes(const at::Tensor& codes, int64_t bits, const at::Tensor& out) {
  const int64_t n = codes.size(0), d = codes.size(1), nb = out.size(1);
  const uint8_t* src = codes.const_data_ptr<uint8_t>();
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  const uint32_t mask = (1u << bits) - 1u;
  at::parallel_for(0, n, row_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* row = src + r * d;
      auto code_at = [&](int64_t i) { return static_cast<uint32_t>(row[i]) & mask; };
      math::pack_row(code_at, d, bits, dst + r * nb, Lane{});
    }
  });
}

// Packed sign bits of the rows of proj [n, m] (math::sign_bit, one byte at a time as the CUDA kernel).
template <typename acc_t>
at::Tensor pack_signs(const at::Tensor& proj) {
  const int64_t n = proj.size(0), m = proj.size(1), mb = packed_bytes(m, 1);
  at::Tensor out = at::empty({n, mb}, proj.options().dtype(at::kByte));
  const acc_t* pp = proj.const_data_ptr<acc_t>();
  uint8_t* op = out.mutable_data_ptr<uint8_t>();
  at::parallel_for(0, n, row_grain(m), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const acc_t* row = pp + r * m;
      auto sign_at = [&](int64_t i) { return math::sign_bit(row[i]); };
      math::pack_row(sign_at, m, 1, op + r * mb, Lane{});
    }
  });
  return out;
}

// The packed signs of S y for the rows of y [k, d] (sketch S [m, d], both in the accumulation dtype): one matrix
// product, then pack_signs, as the CUDA kernels per chunk of rows.
inline at::Tensor sketch_signs(const at::Tensor& y, const at::Tensor& sketch) {
  const at::Tensor proj = at::matmul(y, sketch.t()).contiguous();
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "pack_signs_shared", [&] { out = pack_signs<scalar_t>(proj); });
  return out;
}

// Rows [0, p.n) of p through math::encode_params_row (the residual too when p.residual is set).
template <typename scalar_t, typename acc_t>
void encode_rows(const math::LloydEncodeParams<scalar_t, acc_t>& p) {
  at::parallel_for(0, p.n, row_grain(p.d), [&](int64_t begin, int64_t end) {
    std::vector<acc_t> buf(p.d);
    std::vector<uint8_t> codes(p.d);
    for (int64_t r = begin; r < end; ++r) math::encode_params_row(p, r, buf.data(), codes.data(), Lane{});
  });
}

// x̂ = Πᵀ(norm · levels[codes]) of the packed rows [begin, end) into out (math::decode_lloyd_row); buf: d values.
template <typename acc_t>
void decode_rows(const uint8_t* packed, const acc_t* norm, const acc_t* levels, int64_t bits, int64_t d,
                 const math::Rotation& rot, acc_t* out, int64_t begin, int64_t end, acc_t* buf) {
  const int64_t nb = packed_bytes(d, bits);
  for (int64_t r = begin; r < end; ++r)
    math::decode_lloyd_row(packed + r * nb, norm[r], levels, bits, d, rot, buf, out + r * d, Lane{});
}

// Every (query, key) pair with math::score_one: the loop one CUDA thread runs per key (scores_kernel).
template <typename acc_t>
void score_all(const math::ScoreParams<acc_t>& p) {
  at::parallel_for(0, p.G * p.nq, 1, [&](int64_t begin, int64_t end) {
    for (int64_t gi = begin; gi < end; ++gi) {
      const int64_t g = gi / p.nq;
      const acc_t* qr = p.codes ? p.q + gi * p.d : nullptr;
      const acc_t* qsr = p.signs ? p.qs + gi * p.m : nullptr;
      for (int64_t j = 0; j < p.nk; ++j) p.out[gi * p.nk + j] = math::score_one(p, qr, qsr, g, j);
    }
  });
}

// Every output element with math::weighted_sum_one: the loop one CUDA thread runs per element
// (weighted_sum_kernel).
template <typename acc_t>
void weighted_all(const math::WeightedSumParams<acc_t>& p) {
  at::parallel_for(0, p.G * p.nq, 1, [&](int64_t begin, int64_t end) {
    for (int64_t gi = begin; gi < end; ++gi)
      for (int64_t t = 0; t < p.d; ++t) p.out[gi * p.d + t] = math::weighted_sum_one(p, p.levels, gi / p.nq, gi % p.nq, t);
  });
}

}  // namespace shared
}  // namespace kvstats
