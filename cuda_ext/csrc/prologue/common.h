// What every op's prologue shares: the input rules (code widths, devices, float dtypes, rotations, tables,
// packed rows), the dtype a stored scalar is kept in, and the rotation and stored-dtype rounding as the row
// programs take them.
//
// An op's prologue (prologue/<family>.h: `<op>_prologue`) is the host side every backend (cpu/, shared/,
// cuda/) runs before its kernel: the checks, then the inputs made contiguous (tables and per-key scalars in
// the accumulation dtype) and the outputs allocated, returned as one `<Op>Args` struct whose `params<...>()`
// fills the kernel's math:: parameter struct. It is the C++ twin of the op's fake in kvstats/quant/ops/: the
// same checks, the same output shapes. Each check raises as torch's TORCH_CHECK_VALUE (ValueError) or
// TORCH_CHECK_TYPE (TypeError), naming the op and the argument.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include "../bitpack.h"
#include "../quant_math.h"

namespace kvstats {

// Largest head dimension the Walsh–Hadamard kernels accept (2^15).
constexpr int64_t kMaxFwhtDim = 32768;

inline bool is_float_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

inline at::ScalarType acc_dtype_of(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

inline void check_bits(int64_t bits, const char* op) {
  TORCH_CHECK_VALUE(bits >= 1 && bits <= 8, op, ": bits must be in [1, 8], got ", bits);
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op, const char* name) {
  TORCH_CHECK_VALUE(a.device() == b.device(), op, ": ", name, " must be on ", a.device(), ", got ", b.device());
}

// signs: [passes, block] of the accumulation dtype `acc`, on `ref`'s device, for vectors of length d.
inline void check_rotation_signs(const at::Tensor& ref, const at::Tensor& signs, int64_t d, at::ScalarType acc,
                                 const char* op) {
  check_same_device(ref, signs, op, "signs");
  TORCH_CHECK_VALUE(signs.dim() == 2, op, ": signs must be [passes, block], got ", signs.sizes());
  TORCH_CHECK_TYPE(signs.scalar_type() == acc, op, ": signs must be ", acc, ", got ", signs.scalar_type());
  const int64_t passes = signs.size(0), block = signs.size(1);
  TORCH_CHECK_VALUE(passes == 0 || passes == 1 || passes == 3, op, ": signs must have 0, 1 or 3 passes, got ", passes);
  if (passes > 0) {
    TORCH_CHECK_VALUE(block >= 1 && block <= kMaxFwhtDim && (block & (block - 1)) == 0 && block <= d &&
                    (passes == 3 || block == d) && 2 * block > d,
                op, ": rotation block ", block, " does not fit d = ", d, " with ", passes, " pass(es)");
  }
}

inline void check_table(const at::Tensor& ref, const at::Tensor& table, int64_t expected, const char* op,
                        const char* name) {
  check_same_device(ref, table, op, name);
  TORCH_CHECK_VALUE(table.dim() == 1 && table.size(0) == expected, op, ": ", name, " must be 1-D of length ", expected,
              ", got ", table.sizes());
  TORCH_CHECK_TYPE(table.scalar_type() == acc_dtype_of(ref), op, ": ", name, " must be ", acc_dtype_of(ref), ", got ",
              table.scalar_type());
}

inline void check_packed(const at::Tensor& packed, int64_t rows_dim, int64_t bits, int64_t d, const char* op) {
  TORCH_CHECK_TYPE(packed.scalar_type() == at::kByte, op, ": packed must be uint8, got ", packed.scalar_type());
  TORCH_CHECK_VALUE(packed.dim() == rows_dim, op, ": packed must have ", rows_dim, " dimensions, got ", packed.sizes());
  TORCH_CHECK_VALUE(packed.size(-1) == packed_bytes(d, bits), op, ": packed.size(-1) must be ceil(", d, "*", bits,
              "/8) = ", packed_bytes(d, bits), ", got ", packed.size(-1));
}

// The dtype a stored scalar (a norm, a min-max offset) is kept in: the requested one, fp64 for fp64 input.
inline at::ScalarType storage_dtype(const at::Tensor& x, at::ScalarType requested) {
  TORCH_CHECK_TYPE(requested == at::kFloat || requested == at::kHalf || requested == at::kBFloat16 ||
                  requested == at::kDouble,
              "norm/side dtype must be float16, bfloat16, float32 or float64, got ", requested);
  return x.scalar_type() == at::kDouble ? at::kDouble : requested;
}

// The keys of a weighted-sum op (the score ops' keys, the weights w [G, n_q, n_k] in place of the queries):
// packed [G, n_k, ceil(d·bits/8)] uint8 and a per-key [G, n_k] float (`key_name`; minmax passes lo's sizes
// without its last axis as `key_sizes`). Mirrors check_weighted_keys in kvstats/quant/ops/_library.py.
inline void check_weighted_keys(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& key,
                                at::IntArrayRef key_sizes, int64_t bits, int64_t d, const char* op,
                                const char* key_name) {
  TORCH_CHECK_VALUE(w.dim() == 3, op, ": w must be [G, n_q, n_k], got ", w.sizes());
  TORCH_CHECK_TYPE(w.scalar_type() == at::kFloat || w.scalar_type() == at::kDouble, op,
                   ": w must be float32 or float64, got ", w.scalar_type());
  check_packed(packed, 3, bits, d, op);
  check_same_device(w, packed, op, "packed");
  check_same_device(w, key, op, key_name);
  TORCH_CHECK_VALUE(packed.size(0) == w.size(0) && packed.size(1) == w.size(2), op,
                    ": packed must be [G, n_k, ·] = [", w.size(0), ", ", w.size(2), ", ·] for w ", w.sizes(),
                    ", got ", packed.sizes());
  TORCH_CHECK_VALUE(key_sizes.size() == 2 && key_sizes[0] == packed.size(0) && key_sizes[1] == packed.size(1), op,
                    ": ", key_name, " must be [G, n_k] = ", packed.sizes().slice(0, 2), ", got ", key_sizes);
  TORCH_CHECK_TYPE(is_float_dtype(key.scalar_type()), op, ": ", key_name, " must be a float tensor, got ",
                   key.scalar_type());
}

// How a stored scalar of dtype `t` is rounded (math::round_to_stored).
inline math::Stored stored_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return math::Stored::kFloat32;
    case at::kHalf: return math::Stored::kFloat16;
    case at::kBFloat16: return math::Stored::kBFloat16;
    default: return math::Stored::kKeep;
  }
}

// The randomized-Hadamard rotation of signs [P, B] (P passes of B signs) as the row programs take it.
inline math::Rotation rotation_of(const at::Tensor& signs) {
  math::Rotation rot;
  rot.signs = signs.const_data_ptr();
  rot.passes = signs.size(0);
  rot.block = rot.passes > 0 ? signs.size(1) : 0;
  return rot;
}

// t as the kernels read a table or a per-row scalar: contiguous, in `dtype` (t itself when it already is).
inline at::Tensor contiguous_in(const at::Tensor& t, at::ScalarType dtype) { return t.to(dtype).contiguous(); }

}  // namespace kvstats
