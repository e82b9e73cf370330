// The kvstats_shared backend's transforms, encodes and decodes (common_shared.h): each as its CUDA kernel in
// cuda/quant_cuda.cu and cuda/fwht_cuda.cu, with one serial lane per row.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <vector>

#include "../checks/fwht.h"
#include "../checks/lloyd.h"
#include "../checks/minmax.h"
#include "../checks/pack.h"
#include "../checks/qjl.h"
#include "../checks/sign_decode.h"
#include "../checks/turbo_prod.h"
#include "../kernels.h"
#include "common_shared.h"

namespace kvstats {
namespace shared {
namespace {

// Rows per chunk where a scratch residual or projection is needed (as the CUDA kernels).
constexpr int64_t kChunkRows = 65536;

at::Tensor fwht(const at::Tensor& x) {
  check_fwht_input(x);
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t d = xc.size(-1), rows = xc.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "fwht_shared", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, row_grain(d), [&](int64_t begin, int64_t end) {
      std::vector<acc_t> buf(d);
      for (int64_t r = begin; r < end; ++r) math::fwht_row(xp + r * d, yp + r * d, d, buf.data(), Lane{});
    });
  });
  return y;
}

at::Tensor pack_codes(const at::Tensor& codes, int64_t bits) {
  const int64_t n = codes.size(0), d = codes.size(1), nb = packed_bytes(d, bits);
  at::Tensor out = at::empty({n, nb}, codes.options());
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
  return out;
}

at::Tensor pack_bits(const at::Tensor& codes, int64_t bits) {
  check_pack_input(codes, bits);
  return pack_codes(codes.contiguous(), bits);
}

at::Tensor unpack_bits(const at::Tensor& packed, int64_t bits, int64_t d) {
  check_unpack_input(packed, bits, d);
  const at::Tensor p = packed.contiguous();
  const int64_t n = p.size(0), nb = p.size(1);
  at::Tensor out = at::empty({n, d}, p.options());
  const uint8_t* src = p.const_data_ptr<uint8_t>();
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  at::parallel_for(0, n, row_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t i = 0; i < d; ++i) dst[r * d + i] = static_cast<uint8_t>(unpack_code(src + r * nb, nb, bits, i));
  });
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

std::tuple<at::Tensor, at::Tensor> lloyd_encode(const at::Tensor& x, const at::Tensor& signs,
                                                const at::Tensor& thresholds, int64_t bits, at::ScalarType norm_dtype) {
  check_lloyd_encode_input(x, signs, thresholds, bits);
  const at::Tensor xc = x.contiguous(), sg = signs.contiguous(), th = thresholds.contiguous();
  const int64_t n = xc.size(0), nb = packed_bytes(xc.size(1), bits);
  at::Tensor packed = at::empty({n, nb}, xc.options().dtype(at::kByte));
  at::Tensor norm = at::empty({n}, xc.options().dtype(th.scalar_type()));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "lloyd_encode_shared", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    encode_rows(lloyd_encode_params<scalar_t, acc_t>(xc, sg, th, bits, packed, norm));
  });
  return {packed, norm.to(storage_dtype(x, norm_dtype))};
}

template <typename acc_t>
void decode_rows(const uint8_t* packed, const acc_t* norm, const acc_t* levels, int64_t bits, int64_t d,
                 const math::Rotation& rot, acc_t* out, int64_t begin, int64_t end, acc_t* buf) {
  const int64_t nb = packed_bytes(d, bits);
  for (int64_t r = begin; r < end; ++r)
    math::decode_lloyd_row(packed + r * nb, norm[r], levels, bits, d, rot, buf, out + r * d, Lane{});
}

at::Tensor lloyd_decode(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                        const at::Tensor& levels, int64_t bits, int64_t d) {
  check_lloyd_decode_input(packed, norm, signs, levels, bits, d);
  const at::Tensor pc = packed.contiguous(), sg = signs.contiguous(), lv = levels.contiguous();
  const at::Tensor nc = norm.to(lv.scalar_type()).contiguous();
  const int64_t n = pc.size(0);
  at::Tensor out = at::empty({n, d}, lv.options());
  AT_DISPATCH_FLOATING_TYPES(lv.scalar_type(), "lloyd_decode_shared", [&] {
    const math::Rotation rot = rotation_of(sg);
    at::parallel_for(0, n, row_grain(d), [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> buf(d);
      decode_rows(pc.const_data_ptr<uint8_t>(), nc.const_data_ptr<scalar_t>(), lv.const_data_ptr<scalar_t>(), bits,
                  d, rot, out.mutable_data_ptr<scalar_t>(), begin, end, buf.data());
    });
  });
  return out;
}

// ‖x_r‖ per row without overflow (math::load_scaled), x in its accumulation dtype.
at::Tensor row_norms(const at::Tensor& x) {
  const int64_t n = x.size(0), d = x.size(1);
  at::Tensor norm = at::empty({n}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "row_norms_shared", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* np = norm.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, row_grain(d), [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> buf(d);
      for (int64_t r = begin; r < end; ++r) np[r] = math::load_scaled(xp + r * d, d, buf.data(), Lane{}).norm();
    });
  });
  return norm;
}

at::Tensor sketch_signs(const at::Tensor& y, const at::Tensor& sketch) {
  const at::Tensor proj = at::matmul(y, sketch.t()).contiguous();
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "pack_signs_shared", [&] { out = pack_signs<scalar_t>(proj); });
  return out;
}

std::tuple<at::Tensor, at::Tensor> qjl_encode(const at::Tensor& x, const at::Tensor& sketch,
                                              at::ScalarType norm_dtype) {
  check_qjl_encode_input(x, sketch);
  const at::Tensor sk = sketch.contiguous();
  const at::Tensor xa = x.to(sk.scalar_type()).contiguous();
  const int64_t n = xa.size(0), mb = packed_bytes(sk.size(0), 1);
  at::Tensor packed = at::empty({n, mb}, xa.options().dtype(at::kByte));
  for (int64_t c0 = 0; c0 < n; c0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, n - c0);
    packed.narrow(0, c0, rows).copy_(sketch_signs(xa.narrow(0, c0, rows), sk));
  }
  return {packed, row_norms(xa).to(storage_dtype(x, norm_dtype))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> turbo_prod_encode(
    const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds, const at::Tensor& levels,
    int64_t bits, const at::Tensor& sketch, at::ScalarType norm_dtype) {
  check_turbo_prod_encode_input(x, signs, thresholds, levels, bits, sketch);
  const at::Tensor xc = x.contiguous(), sg = signs.contiguous(), th = thresholds.contiguous();
  const at::Tensor lv = levels.contiguous(), sk = sketch.contiguous();
  const int64_t n = xc.size(0), d = xc.size(1), nb = packed_bytes(d, bits), mb = packed_bytes(sk.size(0), 1);
  const at::ScalarType stored = storage_dtype(x, norm_dtype);
  at::Tensor packed = at::empty({n, nb}, xc.options().dtype(at::kByte));
  at::Tensor sign_packed = at::empty({n, mb}, xc.options().dtype(at::kByte));
  at::Tensor norm = at::empty({n}, xc.options().dtype(th.scalar_type()));
  at::Tensor gamma = at::empty({n}, xc.options().dtype(th.scalar_type()));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "turbo_prod_encode_shared", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    // The residual of one chunk at a time, kept scaled by 2^-e per row (its sign bits are those of r).
    at::Tensor residual = at::empty({std::min(n, kChunkRows), d}, th.options());
    for (int64_t c0 = 0; c0 < n; c0 += kChunkRows) {
      auto p = lloyd_encode_params<scalar_t, acc_t>(xc, sg, th, bits, packed, norm, c0, std::min(kChunkRows, n - c0));
      p.levels = lv.const_data_ptr<acc_t>();
      p.norm_stored = stored_of(stored);
      p.residual = residual.mutable_data_ptr<acc_t>();
      p.gamma = gamma.mutable_data_ptr<acc_t>() + c0;
      encode_rows(p);
      sign_packed.narrow(0, c0, p.n).copy_(sketch_signs(residual.narrow(0, 0, p.n), sk));
    }
  });
  return {packed, norm.to(stored), sign_packed, gamma.to(stored)};
}

at::Tensor sign_decode(const at::Tensor& packed, const at::Tensor& tables, const at::Tensor& weight,
                       const std::optional<at::Tensor>& base) {
  check_sign_decode_input(packed, tables, weight, base);
  const at::Tensor pc = packed.contiguous(), tc = tables.contiguous();
  const at::Tensor wc = weight.to(tc.scalar_type()).contiguous();
  const at::Tensor bc = base.has_value() ? base->contiguous() : at::Tensor();
  const int64_t n = pc.size(0), mb = pc.size(1), d = tc.size(1);
  at::Tensor out = at::empty({n, d}, tc.options());
  AT_DISPATCH_FLOATING_TYPES(tc.scalar_type(), "sign_decode_shared", [&] {
    const uint8_t* pp = pc.const_data_ptr<uint8_t>();
    const scalar_t* tp = tc.const_data_ptr<scalar_t>();
    const scalar_t* wp = wc.const_data_ptr<scalar_t>();
    const scalar_t* bp = bc.defined() ? bc.const_data_ptr<scalar_t>() : nullptr;
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, row_grain(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        math::sign_decode_row(pp + r * mb, mb, tp, d, wp[r], bp == nullptr ? nullptr : bp + r * d, op + r * d, Lane{});
    });
  });
  return out;
}

at::Tensor turbo_prod_decode(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                             const at::Tensor& levels, int64_t bits, int64_t d, const at::Tensor& signs_packed,
                             const at::Tensor& tables, const at::Tensor& weight) {
  check_turbo_prod_decode_input(packed, norm, signs, levels, bits, d, signs_packed, tables, weight);
  const at::Tensor pc = packed.contiguous(), sg = signs.contiguous(), lv = levels.contiguous();
  const at::Tensor nc = norm.to(lv.scalar_type()).contiguous();
  const at::Tensor spc = signs_packed.contiguous(), tc = tables.contiguous();
  const at::Tensor wc = weight.to(tc.scalar_type()).contiguous();
  const int64_t n = pc.size(0), mb = spc.size(1);
  at::Tensor out = at::empty({n, d}, lv.options());
  AT_DISPATCH_FLOATING_TYPES(lv.scalar_type(), "turbo_prod_decode_shared", [&] {
    const math::Rotation rot = rotation_of(sg);
    const uint8_t* spp = spc.const_data_ptr<uint8_t>();
    const scalar_t* tp = tc.const_data_ptr<scalar_t>();
    const scalar_t* wp = wc.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, row_grain(d), [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> buf(d);
      // Per row, as one CUDA block: the MSE part into the output row, then the sign part added in place.
      for (int64_t r = begin; r < end; ++r) {
        decode_rows(pc.const_data_ptr<uint8_t>(), nc.const_data_ptr<scalar_t>(), lv.const_data_ptr<scalar_t>(), bits,
                    d, rot, op, r, r + 1, buf.data());
        math::sign_decode_row(spp + r * mb, mb, tp, d, wp[r], op + r * d, op + r * d, Lane{});
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> minmax_encode(const at::Tensor& x, int64_t group, int64_t bits,
                                                             at::ScalarType side_dtype) {
  check_minmax_encode_input(x, group, bits);
  const at::Tensor xc = x.contiguous();
  const int64_t n = xc.size(0), d = xc.size(1), ng = d / group;
  const at::ScalarType acc = xc.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::ScalarType side = storage_dtype(x, side_dtype);
  at::Tensor codes = at::empty({n, d}, xc.options().dtype(at::kByte));
  at::Tensor lo = at::empty({n, ng}, xc.options().dtype(acc));
  at::Tensor step = at::empty({n, ng}, xc.options().dtype(acc));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "minmax_encode_shared", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    uint8_t* cp = codes.mutable_data_ptr<uint8_t>();
    acc_t* lp = lo.mutable_data_ptr<acc_t>();
    acc_t* sp = step.mutable_data_ptr<acc_t>();
    const math::Stored stored = stored_of(side);
    // One group at a time, as the CUDA kernel's one thread per group; then the codes are packed.
    at::parallel_for(0, n * ng, row_grain(group), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t offset = (t / ng) * d + (t % ng) * group;
        const auto p = math::minmax_group<scalar_t, acc_t>(xp + offset, group, bits, stored, cp + offset);
        lp[t] = p.lo;
        sp[t] = p.step;
      }
    });
  });
  return {pack_codes(codes, bits), lo.to(side), step.to(side)};
}

at::Tensor minmax_decode(const at::Tensor& packed, const at::Tensor& lo, const at::Tensor& scale, int64_t group,
                         int64_t bits, int64_t d) {
  check_minmax_decode_input(packed, lo, scale, group, bits, d);
  const at::ScalarType acc = lo.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor pc = packed.contiguous(), lc = lo.to(acc).contiguous(), sc = scale.to(acc).contiguous();
  const int64_t n = pc.size(0), nb = pc.size(1), ng = d / group;
  at::Tensor out = at::empty({n, d}, lc.options());
  AT_DISPATCH_FLOATING_TYPES(acc, "minmax_decode_shared", [&] {
    const uint8_t* pp = pc.const_data_ptr<uint8_t>();
    const scalar_t* lp = lc.const_data_ptr<scalar_t>();
    const scalar_t* sp = sc.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, row_grain(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        for (int64_t j = 0; j < d; ++j) {
          const int64_t gi = r * ng + j / group;
          op[r * d + j] = math::minmax_value(lp[gi], sp[gi], unpack_code(pp + r * nb, nb, bits, j));
        }
    });
  });
  return out;
}

}  // namespace
}  // namespace shared

TORCH_LIBRARY_IMPL(kvstats_shared, CPU, m) {
  m.impl("fwht", &shared::fwht);
  m.impl("pack_bits", &shared::pack_bits);
  m.impl("unpack_bits", &shared::unpack_bits);
  m.impl("lloyd_encode", &shared::lloyd_encode);
  m.impl("lloyd_decode", &shared::lloyd_decode);
  m.impl("qjl_encode", &shared::qjl_encode);
  m.impl("turbo_prod_encode", &shared::turbo_prod_encode);
  m.impl("sign_decode", &shared::sign_decode);
  m.impl("turbo_prod_decode", &shared::turbo_prod_decode);
  m.impl("minmax_encode", &shared::minmax_encode);
  m.impl("minmax_decode", &shared::minmax_decode);
}

}  // namespace kvstats
