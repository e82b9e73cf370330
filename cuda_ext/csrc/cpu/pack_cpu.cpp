// CPU kernels of dense bit packing (layout: bitpack.h / kvstats/packing.py).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../bitpack.h"
#include "../prologue/pack.h"
#include "common_cpu.h"

namespace kvstats {

at::Tensor pack_bits_cpu(const at::Tensor& codes, int64_t bits) {
  const BitPackArgs a = pack_bits_prologue(codes, bits);
  const uint8_t* src = a.codes.const_data_ptr<uint8_t>();
  uint8_t* dst = a.packed.mutable_data_ptr<uint8_t>();
  at::parallel_for(0, a.n, std::max<int64_t>(1, 4096 / std::max<int64_t>(a.d, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) cpu::pack_row(src + r * a.d, a.d, bits, dst + r * a.nb);
  });
  return a.packed;
}

at::Tensor unpack_bits_cpu(const at::Tensor& packed, int64_t bits, int64_t d) {
  const BitPackArgs a = unpack_bits_prologue(packed, bits, d);
  const uint8_t* src = a.packed.const_data_ptr<uint8_t>();
  uint8_t* dst = a.codes.mutable_data_ptr<uint8_t>();
  at::parallel_for(0, a.n, std::max<int64_t>(1, 4096 / d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) cpu::unpack_row(src + r * a.nb, d, bits, dst + r * d);
  });
  return a.codes;
}

TORCH_LIBRARY_IMPL(kvstats, CPU, m) {
  m.impl("pack_bits", &pack_bits_cpu);
  m.impl("unpack_bits", &unpack_bits_cpu);
}

}  // namespace kvstats
