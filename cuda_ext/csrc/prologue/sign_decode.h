// The sign decode from byte tables (the QJL reconstruction Bᵀb): the schema, checks and prologue of
// sign_decode (prologue/common.h).
#pragma once

#include <optional>

#include "common.h"

namespace kvstats {

inline void define_sign_decode_ops(torch::Library& m) {
  // Sign decode from byte tables: out[n] = base[n] + weight[n] * sum_p tables[256 p + packed[n, p]]
  // (base absent: 0); B^T b of QJL signs with tables = kvstats.ops.sign_tables(B).
  m.def("sign_decode(Tensor packed, Tensor tables, Tensor weight, Tensor? base) -> Tensor");
}

inline void check_sign_decode_input(const at::Tensor& packed, const at::Tensor& tables, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& base) {
  TORCH_CHECK_TYPE(packed.scalar_type() == at::kByte, "sign_decode: packed must be uint8, got ", packed.scalar_type());
  TORCH_CHECK_VALUE(packed.dim() == 2 && packed.size(1) >= 1, "sign_decode: packed must be [N, mb] with mb >= 1, got ",
                    packed.sizes());
  check_same_device(packed, tables, "sign_decode", "tables");
  TORCH_CHECK_TYPE(tables.scalar_type() == at::kFloat || tables.scalar_type() == at::kDouble,
                   "sign_decode: tables must be float32 or float64, got ", tables.scalar_type());
  TORCH_CHECK_VALUE(tables.dim() == 2 && tables.size(0) == packed.size(1) * 256 && tables.size(1) >= 1,
                    "sign_decode: tables must be [256 * packed.size(1), d] = [", packed.size(1) * 256, ", d], got ",
                    tables.sizes());
  check_same_device(packed, weight, "sign_decode", "weight");
  TORCH_CHECK_TYPE(is_float_dtype(weight.scalar_type()), "sign_decode: weight must be a float tensor, got ",
                   weight.scalar_type());
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == packed.size(0), "sign_decode: weight must be [",
                    packed.size(0), "], got ", weight.sizes());
  if (base.has_value()) {
    check_same_device(packed, *base, "sign_decode", "base");
    TORCH_CHECK_TYPE(base->scalar_type() == tables.scalar_type(), "sign_decode: base must be ", tables.scalar_type(),
                     ", got ", base->scalar_type());
    TORCH_CHECK_VALUE(base->dim() == 2 && base->size(0) == packed.size(0) && base->size(1) == tables.size(1),
                      "sign_decode: base must be [", packed.size(0), ", ", tables.size(1), "], got ", base->sizes());
  }
}

// packed [n, mb] uint8, tables [256·mb, d] and base [n, d] (undefined when absent) contiguous, weight [n] in the
// tables' dtype; out [n, d] in the tables' dtype.
struct SignDecodeArgs {
  at::Tensor packed, tables, weight, base, out;
  int64_t n = 0, mb = 0, d = 0;
};

inline SignDecodeArgs sign_decode_prologue(const at::Tensor& packed, const at::Tensor& tables,
                                           const at::Tensor& weight, const std::optional<at::Tensor>& base) {
  check_sign_decode_input(packed, tables, weight, base);
  SignDecodeArgs a;
  a.packed = packed.contiguous();
  a.tables = tables.contiguous();
  a.weight = contiguous_in(weight, a.tables.scalar_type());
  a.base = base.has_value() ? base->contiguous() : at::Tensor();
  a.n = a.packed.size(0);
  a.mb = a.packed.size(1);
  a.d = a.tables.size(1);
  a.out = at::empty({a.n, a.d}, a.tables.options());
  return a;
}

}  // namespace kvstats
