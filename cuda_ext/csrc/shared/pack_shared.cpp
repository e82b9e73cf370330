// The kvstats_shared backend's bit packing (common_shared.h): one output byte (math::pack_row) or one code
// (unpack_code) at a time, as the CUDA kernels with one thread per byte or per code (cuda/pack_cuda.cu).
#include <torch/library.h>

#include "../prologue/pack.h"
#include "common_shared.h"

namespace kvstats {
namespace shared {
namespace {

at::Tensor pack_bits(const at::Tensor& codes, int64_t bits) {
  const BitPackArgs a = pack_bits_prologue(codes, bits);
  pack_codes(a.codes, bits, a.packed);
  return a.packed;
}

at::Tensor unpack_bits(const at::Tensor& packed, int64_t bits, int64_t d) {
  const BitPackArgs a = unpack_bits_prologue(packed, bits, d);
  const int64_t nb = a.nb;
  const uint8_t* src = a.packed.const_data_ptr<uint8_t>();
  uint8_t* dst = a.codes.mutable_data_ptr<uint8_t>();
  at::parallel_for(0, a.n, row_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t i = 0; i < d; ++i) dst[r * d + i] = static_cast<uint8_t>(unpack_code(src + r * nb, nb, bits, i));
  });
  return a.codes;
}

}  // namespace
}  // namespace shared

TORCH_LIBRARY_IMPL(kvstats_shared, CPU, m) {
  m.impl("pack_bits", &shared::pack_bits);
  m.impl("unpack_bits", &shared::unpack_bits);
}

}  // namespace kvstats
