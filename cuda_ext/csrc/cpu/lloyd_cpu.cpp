// CPU kernels of the rotation + Lloyd–Max family (lloyd, turbo_mse) and of TurboQuant_prod:
// encode (normalise, rotate, find the cell, pack, norm), decode, and scores straight from the codes.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "../bitpack.h"
#include "../kernels.h"
#include "common_cpu.h"
#include "score_tables.h"
#include "wht.h"

namespace kvstats {
namespace {

// Encode one row: y = Pi x (in buf), u = y / |x|, codes, packed bytes; returns |x| (unrounded).
template <typename scalar_t, typename acc_t>
acc_t encode_row(const scalar_t* x, int64_t d, const acc_t* signs, int64_t passes, int64_t block,
                 const acc_t* thresholds, int64_t bits, acc_t* buf, uint8_t* codes, uint8_t* packed) {
  acc_t ss = 0;
  for (int64_t j = 0; j < d; ++j) {
    buf[j] = static_cast<acc_t>(x[j]);
    ss += buf[j] * buf[j];
  }
  const acc_t norm = std::sqrt(ss);
  cpu::rotate_forward(buf, d, signs, passes, block);
  const acc_t denom = norm > 0 ? norm : acc_t(1);
  for (int64_t j = 0; j < d; ++j) codes[j] = static_cast<uint8_t>(cell_index(buf[j] / denom, thresholds, bits));
  cpu::pack_row(codes, d, bits, packed);
  return norm;
}

at::Tensor empty_rows(int64_t n, int64_t cols, const at::Tensor& like, at::ScalarType dtype) {
  return at::empty({n, cols}, like.options().dtype(dtype));
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> lloyd_encode_cpu(const at::Tensor& x, const at::Tensor& signs,
                                                    const at::Tensor& thresholds, int64_t bits,
                                                    at::ScalarType norm_dtype) {
  check_lloyd_encode_input(x, signs, thresholds, bits);
  const at::Tensor xc = x.contiguous(), sg = signs.contiguous(), th = thresholds.contiguous();
  const int64_t n = xc.size(0), d = xc.size(1), nb = packed_bytes(d, bits);
  const int64_t passes = sg.size(0), block = passes > 0 ? sg.size(1) : 0;
  at::Tensor packed = empty_rows(n, nb, xc, at::kByte);
  at::Tensor norm = at::empty({n}, xc.options().dtype(th.scalar_type()));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "lloyd_encode_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    const acc_t* sp = sg.const_data_ptr<acc_t>();
    const acc_t* tp = th.const_data_ptr<acc_t>();
    uint8_t* pp = packed.mutable_data_ptr<uint8_t>();
    acc_t* np = norm.mutable_data_ptr<acc_t>();
    at::parallel_for(0, n, std::max<int64_t>(1, 2048 / d), [&](int64_t begin, int64_t end) {
      std::vector<acc_t> buf(d);
      std::vector<uint8_t> codes(d);
      for (int64_t r = begin; r < end; ++r)
        np[r] = encode_row(xp + r * d, d, sp, passes, block, tp, bits, buf.data(), codes.data(), pp + r * nb);
    });
  });
  return {packed, norm.to(storage_dtype(x, norm_dtype))};
}

at::Tensor lloyd_decode_cpu(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                            const at::Tensor& levels, int64_t bits, int64_t d) {
  check_lloyd_decode_input(packed, norm, signs, levels, bits, d);
  const at::Tensor pc = packed.contiguous(), sg = signs.contiguous(), lv = levels.contiguous();
  const at::Tensor nc = norm.to(lv.scalar_type()).contiguous();
  const int64_t n = pc.size(0), nb = pc.size(1);
  const int64_t passes = sg.size(0), block = passes > 0 ? sg.size(1) : 0;
  at::Tensor out = at::empty({n, d}, lv.options());
  AT_DISPATCH_FLOATING_TYPES(lv.scalar_type(), "lloyd_decode_cpu", [&] {
    const uint8_t* pp = pc.const_data_ptr<uint8_t>();
    const scalar_t* np = nc.const_data_ptr<scalar_t>();
    const scalar_t* sp = sg.const_data_ptr<scalar_t>();
    const scalar_t* lp = lv.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, std::max<int64_t>(1, 2048 / d), [&](int64_t begin, int64_t end) {
      std::vector<uint8_t> codes(d);
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* row = op + r * d;
        cpu::unpack_row(pp + r * nb, d, bits, codes.data());
        for (int64_t j = 0; j < d; ++j) row[j] = lp[codes[j]] * np[r];
        cpu::rotate_inverse(row, d, sp, passes, block);
      }
    });
  });
  return out;
}

namespace {

// Many queries per key (n_q >= kGemmQueries): decode a chunk of keys to dense rows (levels[codes] * w,
// and ±w for the signs) and let BLAS multiply; the table path costs a look-up per byte per query, the
// dense path a decode per key plus fused multiply-adds at GEMM speed. Extra memory: one chunk.
constexpr int64_t kGemmQueries = 8;
constexpr int64_t kGemmChunk = 4096;

template <typename acc_t>
void score_codes_gemm(const at::Tensor& q, const uint8_t* packed, const acc_t* mse_w, const acc_t* levels,
                      int64_t bits, const at::Tensor& qs, const uint8_t* sign_packed, const acc_t* qjl_w, int64_t m,
                      int64_t G, int64_t nk, int64_t d, at::Tensor& out) {
  const int64_t nb = packed_bytes(d, bits), mb = qs.defined() ? packed_bytes(m, 1) : 0;
  at::Tensor dense = at::empty({std::min(nk, kGemmChunk), d}, q.options());
  at::Tensor dense_signs = qs.defined() ? at::empty({std::min(nk, kGemmChunk), m}, q.options()) : at::Tensor();
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t j0 = 0; j0 < nk; j0 += kGemmChunk) {
      const int64_t rows = std::min(kGemmChunk, nk - j0);
      acc_t* dp = dense.mutable_data_ptr<acc_t>();
      acc_t* sp = qs.defined() ? dense_signs.mutable_data_ptr<acc_t>() : nullptr;
      at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
        std::vector<uint8_t> codes(std::max(d, m));
        for (int64_t r = begin; r < end; ++r) {
          const int64_t key = g * nk + j0 + r;
          cpu::unpack_row(packed + key * nb, d, bits, codes.data());
          for (int64_t t = 0; t < d; ++t) dp[r * d + t] = levels[codes[t]] * mse_w[key];
          if (sp) {
            cpu::unpack_row(sign_packed + key * mb, m, 1, codes.data());
            for (int64_t t = 0; t < m; ++t) sp[r * m + t] = codes[t] ? qjl_w[key] : -qjl_w[key];
          }
        }
      });
      at::Tensor scores = at::matmul(q[g], dense.narrow(0, 0, rows).t());
      if (qs.defined()) scores.add_(at::matmul(qs[g], dense_signs.narrow(0, 0, rows).t()));
      out[g].narrow(1, j0, rows).copy_(scores);
    }
  }
}

// scores[g, i, j] = mse_w[g, j] * <q[g, i], levels[codes[g, j]]>  (+ qjl_w[g, j] * <qs[g, i], signs[g, j]>)
template <typename acc_t>
void score_codes(const acc_t* q, const uint8_t* packed, const acc_t* mse_w, const acc_t* levels, int64_t bits,
                 const acc_t* qs, const uint8_t* sign_packed, const acc_t* qjl_w, int64_t m, int64_t G, int64_t nq,
                 int64_t nk, int64_t d, acc_t* out) {
  const int64_t nb = packed_bytes(d, bits), mb = qs ? packed_bytes(m, 1) : 0;
  const bool byte_tables = 8 % bits == 0;
  // Per (g, i): a byte table for the codes (or a per-code table [d][2^bits]) and one for the signs.
  const int64_t code_table = byte_tables ? nb * 256 : d * (int64_t{1} << bits);
  const int64_t sign_table = mb * 256;
  std::vector<acc_t> tables(G * nq * (code_table + sign_table));
  at::parallel_for(0, G * nq, 1, [&](int64_t begin, int64_t end) {
    for (int64_t gi = begin; gi < end; ++gi) {
      acc_t* t = tables.data() + gi * (code_table + sign_table);
      const acc_t* qv = q + gi * d;
      if (byte_tables) {
        cpu::build_code_table(qv, d, levels, bits, nb, t);
      } else {
        const int64_t L = int64_t{1} << bits;
        for (int64_t j = 0; j < d; ++j)
          for (int64_t c = 0; c < L; ++c) t[j * L + c] = qv[j] * levels[c];
      }
      if (qs) cpu::build_sign_table(qs + gi * m, m, mb, t + code_table);
    }
  });
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (nk + kBlock - 1) / kBlock;
  at::parallel_for(0, G * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> codes(byte_tables ? 0 : d);
    for (int64_t gb = begin; gb < end; ++gb) {
      const int64_t g = gb / blocks, j0 = (gb % blocks) * kBlock, j1 = std::min(nk, j0 + kBlock);
      for (int64_t i = 0; i < nq; ++i) {
        const acc_t* t = tables.data() + (g * nq + i) * (code_table + sign_table);
        acc_t* o = out + (g * nq + i) * nk;
        for (int64_t j = j0; j < j1; ++j) {
          const uint8_t* row = packed + (g * nk + j) * nb;
          acc_t s;
          if (byte_tables) {
            s = cpu::table_sum(t, row, nb);
          } else {
            s = 0;
            const int64_t L = int64_t{1} << bits;
            cpu::unpack_row(row, d, bits, codes.data());
            for (int64_t c = 0; c < d; ++c) s += t[c * L + codes[c]];
          }
          s *= mse_w[g * nk + j];
          if (qs) s += qjl_w[g * nk + j] * cpu::table_sum(t + code_table, sign_packed + (g * nk + j) * mb, mb);
          o[j] = s;
        }
      }
    }
  });
}

}  // namespace

at::Tensor lloyd_scores_cpu(const at::Tensor& q, const at::Tensor& packed, const at::Tensor& norm,
                            const at::Tensor& levels, int64_t bits) {
  check_lloyd_scores_input(q, packed, norm, levels, bits);
  const at::Tensor qc = q.contiguous(), pc = packed.contiguous(), lv = levels.contiguous();
  const at::Tensor nc = norm.to(qc.scalar_type()).contiguous();
  const int64_t G = qc.size(0), nq = qc.size(1), d = qc.size(2), nk = pc.size(1);
  at::Tensor out = at::empty({G, nq, nk}, qc.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "lloyd_scores_cpu", [&] {
    if (nq >= kGemmQueries) {
      score_codes_gemm<scalar_t>(qc, pc.const_data_ptr<uint8_t>(), nc.const_data_ptr<scalar_t>(),
                                 lv.const_data_ptr<scalar_t>(), bits, at::Tensor(), nullptr, nullptr, 0, G, nk, d, out);
      return;
    }
    score_codes<scalar_t>(qc.const_data_ptr<scalar_t>(), pc.const_data_ptr<uint8_t>(), nc.const_data_ptr<scalar_t>(),
                          lv.const_data_ptr<scalar_t>(), bits, nullptr, nullptr, nullptr, 0, G, nq, nk, d,
                          out.mutable_data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor turbo_prod_scores_cpu(const at::Tensor& q, const at::Tensor& q_sketch, const at::Tensor& packed,
                                 const at::Tensor& norm, const at::Tensor& levels, int64_t bits,
                                 const at::Tensor& signs_packed, const at::Tensor& gamma, double scale) {
  check_turbo_prod_scores_input(q, q_sketch, packed, norm, levels, bits, signs_packed, gamma);
  const at::Tensor qc = q.contiguous(), pc = packed.contiguous(), lv = levels.contiguous();
  const at::Tensor qsc = q_sketch.contiguous(), spc = signs_packed.contiguous();
  const at::Tensor nc = norm.to(qc.scalar_type()).contiguous();
  const at::Tensor gc = (gamma.to(qc.scalar_type()) * scale).contiguous();
  const int64_t G = qc.size(0), nq = qc.size(1), d = qc.size(2), nk = pc.size(1), m = qsc.size(2);
  at::Tensor out = at::empty({G, nq, nk}, qc.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "turbo_prod_scores_cpu", [&] {
    if (nq >= kGemmQueries) {
      score_codes_gemm<scalar_t>(qc, pc.const_data_ptr<uint8_t>(), nc.const_data_ptr<scalar_t>(),
                                 lv.const_data_ptr<scalar_t>(), bits, qsc, spc.const_data_ptr<uint8_t>(),
                                 gc.const_data_ptr<scalar_t>(), m, G, nk, d, out);
      return;
    }
    score_codes<scalar_t>(qc.const_data_ptr<scalar_t>(), pc.const_data_ptr<uint8_t>(), nc.const_data_ptr<scalar_t>(),
                          lv.const_data_ptr<scalar_t>(), bits, qsc.const_data_ptr<scalar_t>(),
                          spc.const_data_ptr<uint8_t>(), gc.const_data_ptr<scalar_t>(), m, G, nq, nk, d,
                          out.mutable_data_ptr<scalar_t>());
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> turbo_prod_encode_cpu(
    const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds, const at::Tensor& levels,
    int64_t bits, const at::Tensor& sketch, at::ScalarType norm_dtype) {
  check_turbo_prod_encode_input(x, signs, thresholds, levels, bits, sketch);
  const at::Tensor xc = x.contiguous(), sg = signs.contiguous(), th = thresholds.contiguous();
  const at::Tensor lv = levels.contiguous(), sk = sketch.contiguous();
  const int64_t n = xc.size(0), d = xc.size(1), nb = packed_bytes(d, bits), m = sk.size(0), mb = packed_bytes(m, 1);
  const int64_t passes = sg.size(0), block = passes > 0 ? sg.size(1) : 0;
  const at::ScalarType stored = storage_dtype(x, norm_dtype);
  at::Tensor packed = empty_rows(n, nb, xc, at::kByte);
  at::Tensor sign_packed = empty_rows(n, mb, xc, at::kByte);
  at::Tensor norm = at::empty({n}, xc.options().dtype(th.scalar_type()));
  at::Tensor gamma = at::empty({n}, xc.options().dtype(th.scalar_type()));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "turbo_prod_encode_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    const acc_t* sp = sg.const_data_ptr<acc_t>();
    const acc_t* tp = th.const_data_ptr<acc_t>();
    const acc_t* lp = lv.const_data_ptr<acc_t>();
    // Residuals of one chunk of rows at a time: extra memory is bounded by kChunkRows * (d + m) values.
    at::Tensor residual = at::empty({std::min(n, cpu::kChunkRows), d}, th.options());
    for (int64_t c0 = 0; c0 < n; c0 += cpu::kChunkRows) {
      const int64_t rows = std::min(cpu::kChunkRows, n - c0);
      acc_t* rp = residual.mutable_data_ptr<acc_t>();
      uint8_t* pp = packed.mutable_data_ptr<uint8_t>() + c0 * nb;
      acc_t* np = norm.mutable_data_ptr<acc_t>() + c0;
      acc_t* gp = gamma.mutable_data_ptr<acc_t>() + c0;
      at::parallel_for(0, rows, std::max<int64_t>(1, 2048 / d), [&](int64_t begin, int64_t end) {
        std::vector<uint8_t> codes(d);
        for (int64_t r = begin; r < end; ++r) {
          // encode_row leaves y = Pi x in the buffer; the residual is y − |x|_stored · levels[codes], with
          // the norm rounded as it is stored, so decode reproduces exactly what the residual was taken from.
          acc_t* y = rp + r * d;
          const acc_t nrm = encode_row(xp + (c0 + r) * d, d, sp, passes, block, tp, bits, y, codes.data(), pp + r * nb);
          const acc_t stored_norm = cpu::round_to(nrm, stored);
          acc_t ss = 0;
          for (int64_t j = 0; j < d; ++j) {
            y[j] -= lp[codes[j]] * stored_norm;
            ss += y[j] * y[j];
          }
          np[r] = nrm;
          gp[r] = std::sqrt(ss);
        }
      });
      const at::Tensor proj = at::matmul(residual.narrow(0, 0, rows), sk.t()).contiguous();
      const acc_t* jp = proj.const_data_ptr<acc_t>();
      uint8_t* spk = sign_packed.mutable_data_ptr<uint8_t>() + c0 * mb;
      cpu::pack_sign_rows(jp, rows, m, spk);
    }
  });
  return {packed, norm.to(stored), sign_packed, gamma.to(stored)};
}

}  // namespace kvstats
