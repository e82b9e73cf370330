// Declarations shared by ops.cpp (schemas, input checks, CPU registration) and the CUDA files.
// Every kernel validates its inputs with the check_* functions below before touching memory.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "quant_math.h"

namespace kvstats {

// The CPU's shared path (kvstats.ops.shared_path(), or KVSTATS_SHARED_PATH=1 at load): when on, every
// CPU op runs the row programs of quant_math.h with one serial lane — the GPU's code path — instead of
// its CPU fast path (SIMD twins, counting cell search, lookup tables, GEMM scores).
bool shared_path_enabled();
void set_shared_path(bool enabled);

// How a stored scalar of dtype `t` is rounded (quant_math.h).
math::Stored stored_of(at::ScalarType t);

// The randomized-Hadamard rotation of signs [P, B] (P passes of B signs) as the row programs take it.
math::Rotation rotation_of(const at::Tensor& signs);

// The plain-encode fields of math::LloydEncodeParams for rows [row0, row0 + rows) (rows < 0: to the end) of
// the contiguous x [n, d], writing into packed [n, ceil(d·bits/8)] and norm [n] (x's accumulation dtype);
// the TurboQuant_prod fields are left to the caller. One filling for the CPU and CUDA encodes.
template <typename scalar_t, typename acc_t>
math::LloydEncodeParams<scalar_t, acc_t> lloyd_encode_params(const at::Tensor& x, const at::Tensor& signs,
                                                             const at::Tensor& thresholds, int64_t bits,
                                                             const at::Tensor& packed, const at::Tensor& norm,
                                                             int64_t row0 = 0, int64_t rows = -1) {
  math::LloydEncodeParams<scalar_t, acc_t> p;
  p.d = x.size(1);
  p.n = rows < 0 ? x.size(0) - row0 : rows;
  p.bits = bits;
  p.x = x.const_data_ptr<scalar_t>() + row0 * p.d;
  p.rotation = rotation_of(signs);
  p.thresholds = thresholds.const_data_ptr<acc_t>();
  p.packed = packed.mutable_data_ptr<uint8_t>() + row0 * packed.size(1);
  p.norm = norm.mutable_data_ptr<acc_t>() + row0;
  return p;
}

// Whether the CPU sign_decode / turbo_prod_decode of n rows of width d in `dtype` sums the sign part by the
// blocked sum (sign_decode_cpu.cpp) rather than the direct one; both give the same bits.
bool sign_decode_takes_blocked_sum(at::ScalarType dtype, int64_t n, int64_t d);

// Largest head dimension the Walsh–Hadamard kernels accept (2^15).
constexpr int64_t kMaxFwhtDim = 32768;

// ------------------------------------------------------------------------------ shared input checks
void check_fwht_input(const at::Tensor& x);
void check_pack_input(const at::Tensor& codes, int64_t bits);
void check_unpack_input(const at::Tensor& packed, int64_t bits, int64_t d);
// x [N, d]; signs [P, B] of x's accumulation dtype with P in {0, 1, 3}; thresholds [2^bits - 1].
void check_lloyd_encode_input(const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds,
                              int64_t bits);
void check_lloyd_decode_input(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                              const at::Tensor& levels, int64_t bits, int64_t d);
void check_lloyd_scores_input(const at::Tensor& q, const at::Tensor& packed, const at::Tensor& norm,
                              const at::Tensor& levels, int64_t bits);
void check_qjl_encode_input(const at::Tensor& x, const at::Tensor& sketch);
void check_qjl_scores_input(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm);
void check_turbo_prod_encode_input(const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds,
                                   const at::Tensor& levels, int64_t bits, const at::Tensor& sketch);
void check_turbo_prod_scores_input(const at::Tensor& q, const at::Tensor& q_sketch, const at::Tensor& packed,
                                   const at::Tensor& norm, const at::Tensor& levels, int64_t bits,
                                   const at::Tensor& signs_packed, const at::Tensor& gamma);
// packed [N, mb] uint8; tables [mb * 256, d] float32/64; weight [N] float; base undefined or [N, d] of
// the tables' dtype; all on packed's device.
void check_sign_decode_input(const at::Tensor& packed, const at::Tensor& tables, const at::Tensor& weight,
                             const std::optional<at::Tensor>& base);
// lloyd_decode's inputs, and sign_decode's for signs_packed [N, mb], tables [mb * 256, d] of levels' dtype.
void check_turbo_prod_decode_input(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                                   const at::Tensor& levels, int64_t bits, int64_t d, const at::Tensor& signs_packed,
                                   const at::Tensor& tables, const at::Tensor& weight);
void check_minmax_encode_input(const at::Tensor& x, int64_t group, int64_t bits);
void check_minmax_decode_input(const at::Tensor& packed, const at::Tensor& lo, const at::Tensor& scale,
                               int64_t group, int64_t bits, int64_t d);
// Rounds a stored scalar (a norm, a min-max offset) to the precision it is kept in.
at::ScalarType storage_dtype(const at::Tensor& x, at::ScalarType requested);

// ------------------------------------------------------------------------------------- CPU kernels
at::Tensor fwht_cpu(const at::Tensor& x);
at::Tensor pack_bits_cpu(const at::Tensor& codes, int64_t bits);
at::Tensor unpack_bits_cpu(const at::Tensor& packed, int64_t bits, int64_t d);
std::tuple<at::Tensor, at::Tensor> lloyd_encode_cpu(const at::Tensor& x, const at::Tensor& signs,
                                                    const at::Tensor& thresholds, int64_t bits,
                                                    at::ScalarType norm_dtype);
at::Tensor lloyd_decode_cpu(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                            const at::Tensor& levels, int64_t bits, int64_t d);
at::Tensor lloyd_scores_cpu(const at::Tensor& q, const at::Tensor& packed, const at::Tensor& norm,
                            const at::Tensor& levels, int64_t bits);
std::tuple<at::Tensor, at::Tensor> qjl_encode_cpu(const at::Tensor& x, const at::Tensor& sketch,
                                                  at::ScalarType norm_dtype);
at::Tensor qjl_scores_cpu(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm,
                          double scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> turbo_prod_encode_cpu(
    const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds, const at::Tensor& levels,
    int64_t bits, const at::Tensor& sketch, at::ScalarType norm_dtype);
at::Tensor turbo_prod_scores_cpu(const at::Tensor& q, const at::Tensor& q_sketch, const at::Tensor& packed,
                                 const at::Tensor& norm, const at::Tensor& levels, int64_t bits,
                                 const at::Tensor& signs_packed, const at::Tensor& gamma, double scale);
at::Tensor sign_decode_cpu(const at::Tensor& packed, const at::Tensor& tables, const at::Tensor& weight,
                           const std::optional<at::Tensor>& base);
at::Tensor turbo_prod_decode_cpu(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                                 const at::Tensor& levels, int64_t bits, int64_t d, const at::Tensor& signs_packed,
                                 const at::Tensor& tables, const at::Tensor& weight);
std::tuple<at::Tensor, at::Tensor, at::Tensor> minmax_encode_cpu(const at::Tensor& x, int64_t group, int64_t bits,
                                                                 at::ScalarType side_dtype);
at::Tensor minmax_decode_cpu(const at::Tensor& packed, const at::Tensor& lo, const at::Tensor& scale,
                             int64_t group, int64_t bits, int64_t d);

}  // namespace kvstats
