// CPU kernels of dense bit packing (layout: bitpack.h / kvstats/packing.py).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../bitpack.h"
#include "../checks/pack.h"
#include "../kernels.h"
#include "common_cpu.h"

namespace kvstats {

at::Tensor pack_bits_cpu(const at::Tensor& codes, int64_t bits) {
  check_pack_input(codes, bits);
  const at::Tensor c = codes.contiguous();
  const int64_t n = c.size(0), d = c.size(1), nb = packed_bytes(d, bits);
  at::Tensor out = at::empty({n, nb}, c.options());
  const uint8_t* src = c.const_data_ptr<uint8_t>();
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  at::parallel_for(0, n, std::max<int64_t>(1, 4096 / std::max<int64_t>(d, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) cpu::pack_row(src + r * d, d, bits, dst + r * nb);
  });
  return out;
}

at::Tensor unpack_bits_cpu(const at::Tensor& packed, int64_t bits, int64_t d) {
  check_unpack_input(packed, bits, d);
  const at::Tensor p = packed.contiguous();
  const int64_t n = p.size(0), nb = p.size(1);
  at::Tensor out = at::empty({n, d}, p.options());
  const uint8_t* src = p.const_data_ptr<uint8_t>();
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  at::parallel_for(0, n, std::max<int64_t>(1, 4096 / d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) cpu::unpack_row(src + r * nb, d, bits, dst + r * d);
  });
  return out;
}

TORCH_LIBRARY_IMPL(kvstats, CPU, m) {
  m.impl("pack_bits", &pack_bits_cpu);
  m.impl("unpack_bits", &unpack_bits_cpu);
}

}  // namespace kvstats
