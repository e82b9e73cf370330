// CPU kernels of KIVI-style min-max quantization along the vector (groups of `group` coordinates).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "../bitpack.h"
#include "../checks/minmax.h"
#include "../kernels.h"
#include "common_cpu.h"

namespace kvstats {

std::tuple<at::Tensor, at::Tensor, at::Tensor> minmax_encode_cpu(const at::Tensor& x, int64_t group, int64_t bits,
                                                                 at::ScalarType side_dtype) {
  check_minmax_encode_input(x, group, bits);
  const at::Tensor xc = x.contiguous();
  const int64_t n = xc.size(0), d = xc.size(1), nb = packed_bytes(d, bits), ng = d / group;
  const at::ScalarType acc = xc.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::ScalarType side = storage_dtype(x, side_dtype);
  at::Tensor packed = at::empty({n, nb}, xc.options().dtype(at::kByte));
  at::Tensor lo_t = at::empty({n, ng}, xc.options().dtype(acc));
  at::Tensor scale_t = at::empty({n, ng}, xc.options().dtype(acc));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "minmax_encode_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    uint8_t* pp = packed.mutable_data_ptr<uint8_t>();
    acc_t* lp = lo_t.mutable_data_ptr<acc_t>();
    acc_t* sp = scale_t.mutable_data_ptr<acc_t>();
    const math::Stored stored = stored_of(side);
    at::parallel_for(0, n, std::max<int64_t>(1, 2048 / d), [&](int64_t begin, int64_t end) {
      std::vector<uint8_t> codes(d);
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t gi = 0; gi < ng; ++gi) {
          const auto p = math::minmax_group<scalar_t, acc_t>(xp + r * d + gi * group, group, bits, stored,
                                                             codes.data() + gi * group);
          lp[r * ng + gi] = p.lo;
          sp[r * ng + gi] = p.step;
        }
        cpu::pack_row(codes.data(), d, bits, pp + r * nb);
      }
    });
  });
  return {packed, lo_t.to(side), scale_t.to(side)};
}

at::Tensor minmax_decode_cpu(const at::Tensor& packed, const at::Tensor& lo, const at::Tensor& scale,
                             int64_t group, int64_t bits, int64_t d) {
  check_minmax_decode_input(packed, lo, scale, group, bits, d);
  const at::ScalarType acc = lo.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor pc = packed.contiguous(), lc = lo.to(acc).contiguous(), sc = scale.to(acc).contiguous();
  const int64_t n = pc.size(0), nb = pc.size(1), ng = d / group;
  at::Tensor out = at::empty({n, d}, lc.options());
  AT_DISPATCH_FLOATING_TYPES(acc, "minmax_decode_cpu", [&] {
    const uint8_t* pp = pc.const_data_ptr<uint8_t>();
    const scalar_t* lp = lc.const_data_ptr<scalar_t>();
    const scalar_t* sp = sc.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, std::max<int64_t>(1, 2048 / d), [&](int64_t begin, int64_t end) {
      std::vector<uint8_t> codes(d);
      for (int64_t r = begin; r < end; ++r) {
        cpu::unpack_row(pp + r * nb, d, bits, codes.data());
        for (int64_t j = 0; j < d; ++j) {
          const int64_t gi = r * ng + j / group;
          op[r * d + j] = math::minmax_value(lp[gi], sp[gi], codes[j]);
        }
      }
    });
  });
  return out;
}

TORCH_LIBRARY_IMPL(kvstats, CPU, m) {
  m.impl("minmax_encode", &minmax_encode_cpu);
  m.impl("minmax_decode", &minmax_decode_cpu);
}

}  // namespace kvstats
