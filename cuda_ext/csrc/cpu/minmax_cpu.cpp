// CPU kernels of KIVI-style min-max quantization along the vector (groups of `group` coordinates).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "../bitpack.h"
#include "../prologue/minmax.h"
#include "common_cpu.h"

namespace kvstats {

std::tuple<at::Tensor, at::Tensor, at::Tensor> minmax_encode_cpu(const at::Tensor& x, int64_t group, int64_t bits,
                                                                 at::ScalarType side_dtype) {
  const MinMaxEncodeArgs a = minmax_encode_prologue(x, group, bits, side_dtype);
  const int64_t d = a.d, nb = a.nb, ng = a.ng;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "minmax_encode_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = a.x.const_data_ptr<scalar_t>();
    uint8_t* pp = a.packed.mutable_data_ptr<uint8_t>();
    acc_t* lp = a.lo.mutable_data_ptr<acc_t>();
    acc_t* sp = a.step.mutable_data_ptr<acc_t>();
    const math::Stored stored = stored_of(a.side);
    at::parallel_for(0, a.n, std::max<int64_t>(1, 2048 / d), [&](int64_t begin, int64_t end) {
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
  return a.result();
}

at::Tensor minmax_decode_cpu(const at::Tensor& packed, const at::Tensor& lo, const at::Tensor& scale,
                             int64_t group, int64_t bits, int64_t d) {
  const MinMaxDecodeArgs a = minmax_decode_prologue(packed, lo, scale, group, bits, d);
  const int64_t nb = a.nb, ng = a.ng;
  AT_DISPATCH_FLOATING_TYPES(a.lo.scalar_type(), "minmax_decode_cpu", [&] {
    const uint8_t* pp = a.packed.const_data_ptr<uint8_t>();
    const scalar_t* lp = a.lo.const_data_ptr<scalar_t>();
    const scalar_t* sp = a.step.const_data_ptr<scalar_t>();
    scalar_t* op = a.out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, a.n, std::max<int64_t>(1, 2048 / d), [&](int64_t begin, int64_t end) {
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
  return a.out;
}

TORCH_LIBRARY_IMPL(kvstats, CPU, m) {
  m.impl("minmax_encode", &minmax_encode_cpu);
  m.impl("minmax_decode", &minmax_decode_cpu);
}

}  // namespace kvstats
