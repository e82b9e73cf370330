// Dense bit packing (layout: bitpack.h): the schemas, checks and prologues of pack_bits and unpack_bits
// (prologue/common.h).
#pragma once

#include "common.h"

namespace kvstats {

inline void define_pack_ops(torch::Library& m) {
  // Dense bit packing of codes [N, d] (uint8 < 2^bits) into [N, ceil(d*bits/8)], and back.
  m.def("pack_bits(Tensor codes, int bits) -> Tensor");
  m.def("unpack_bits(Tensor packed, int bits, int d) -> Tensor");
}

inline void check_pack_input(const at::Tensor& codes, int64_t bits) {
  check_bits(bits, "pack_bits");
  TORCH_CHECK_VALUE(codes.dim() == 2, "pack_bits: codes must be [N, d], got ", codes.sizes());
  TORCH_CHECK_TYPE(codes.scalar_type() == at::kByte, "pack_bits: codes must be uint8, got ", codes.scalar_type());
}

inline void check_unpack_input(const at::Tensor& packed, int64_t bits, int64_t d) {
  check_bits(bits, "unpack_bits");
  TORCH_CHECK_VALUE(d >= 1, "unpack_bits: d must be positive, got ", d);
  check_packed(packed, 2, bits, d, "unpack_bits");
}

// n rows of d codes of `bits` bits, both ways: codes [n, d] uint8 and packed [n, nb = ceil(d·bits/8)] uint8,
// contiguous; pack_bits reads codes and writes packed, unpack_bits the reverse.
struct BitPackArgs {
  at::Tensor codes, packed;
  int64_t n = 0, d = 0, bits = 0, nb = 0;
};

inline BitPackArgs pack_bits_prologue(const at::Tensor& codes, int64_t bits) {
  check_pack_input(codes, bits);
  BitPackArgs a;
  a.codes = codes.contiguous();
  a.n = a.codes.size(0);
  a.d = a.codes.size(1);
  a.bits = bits;
  a.nb = packed_bytes(a.d, bits);
  a.packed = at::empty({a.n, a.nb}, a.codes.options());
  return a;
}

inline BitPackArgs unpack_bits_prologue(const at::Tensor& packed, int64_t bits, int64_t d) {
  check_unpack_input(packed, bits, d);
  BitPackArgs a;
  a.packed = packed.contiguous();
  a.n = a.packed.size(0);
  a.d = d;
  a.bits = bits;
  a.nb = a.packed.size(1);
  a.codes = at::empty({a.n, d}, a.packed.options());
  return a;
}

}  // namespace kvstats
