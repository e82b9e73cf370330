// Small helpers shared by the CPU kernels.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <sys/mman.h>

#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../bitpack.h"
#include "../quant_math.h"

// KVSTATS_SIMD_CLONES on a (non-template) fp32 row function: the compiler emits it twice, for the
// baseline ISA the extension is built for and for AVX2, and the loader picks the one the CPU runs
// (GCC/Clang target_clones, an ifunc). The hot loops are plain C++ written so that they vectorise;
// without FMA in the clone's target no multiply-add is contracted, so both copies round alike.
#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define KVSTATS_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef KVSTATS_SIMD_CLONES
#define KVSTATS_SIMD_CLONES
#endif

// On the row steps that the SIMD twins wrap: forces them inline into each clone, so that the AVX2 clone
// compiles their loops for AVX2 instead of calling the baseline copy (GCC stops inlining them on its
// own once a row step grows).
#if defined(__GNUC__)
#define KVSTATS_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define KVSTATS_ALWAYS_INLINE inline
#endif

namespace kvstats {
namespace cpu {

// at::parallel_for whose workers run with the caller's thread-local state (inference mode, autograd
// and dispatch-key state). OpenMP workers do not inherit it, and an ATen op inside a worker (a BLAS
// product into a slice of an output allocated under torch.inference_mode()) would otherwise fail with
// "Inplace update to inference tensor outside InferenceMode".
template <typename F>
inline void parallel_for_tls(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const at::ThreadLocalState state;
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) {
    const at::ThreadLocalStateGuard guard(state);
    f(b, e);
  });
}

// Advice for a new output that the kernel writes once, in full (the decode outputs, allocated by the op's
// prologue). Large outputs come fresh from the kernel (glibc serves them with mmap), and faulting them in 4 KiB
// at a time cost more than the decode itself (a 128 MiB output on a 2-core Zen 4: 2.2 M rows/s of d = 128 for
// empty + fill, against 9.4 M with the advice). So its 2 MiB-aligned interior is advised to be backed by
// transparent huge pages (Linux, THP in "madvise" or "always" mode; a hint — when refused, the ordinary pages
// serve). Every byte is written by the caller, so no memory is committed that would not be anyway.
inline void advise_huge_pages(const at::Tensor& out) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = uintptr_t{1} << 21;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(out.data_ptr());
  const uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t last = (begin + out.nbytes()) & ~(kHugePage - 1);
  if (last > first) (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#endif
}

// A new [rows, cols] scratch that the kernel writes once, in full, on huge pages (advise_huge_pages).
inline at::Tensor empty_output(int64_t rows, int64_t cols, const at::TensorOptions& options) {
  at::Tensor out = at::empty({rows, cols}, options);
  advise_huge_pages(out);
  return out;
}

// sum_j v[j]^2 with eight independent partial sums (vectorises; fixed order, so deterministic).
template <typename acc_t>
KVSTATS_ALWAYS_INLINE acc_t sum_squares(const acc_t* v, int64_t d) {
  acc_t part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= d; j += 8)
    for (int t = 0; t < 8; ++t) part[t] += v[j + t] * v[j + t];
  for (; j < d; ++j) part[j % 8] += v[j] * v[j];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// max_j |v[j]| with eight independent partial maxima (vectorises).
template <typename acc_t>
KVSTATS_ALWAYS_INLINE acc_t max_abs(const acc_t* v, int64_t d) {
  acc_t part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= d; j += 8)
    for (int t = 0; t < 8; ++t) {
      const acc_t a = math::abs_of(v[j + t]);
      part[t] = a > part[t] ? a : part[t];
    }
  for (; j < d; ++j) {
    const acc_t a = math::abs_of(v[j]);
    part[j % 8] = a > part[j % 8] ? a : part[j % 8];
  }
  acc_t m = part[0];
  for (int t = 1; t < 8; ++t) m = part[t] > m ? part[t] : m;
  return m;
}

// codes[j] = number of thresholds strictly below u[j] (torch.bucketize, right=False). Few cells: count
// against every threshold (compare + add over the whole row, vectorised); many: binary search per code.
template <typename acc_t>
inline void cell_indices(const acc_t* u, int64_t d, const acc_t* thresholds, int64_t bits, uint8_t* codes) {
  if (bits <= 5) {
    const int64_t n_thresholds = (int64_t{1} << bits) - 1;
    for (int64_t j = 0; j < d; ++j) codes[j] = 0;
    for (int64_t k = 0; k < n_thresholds; ++k) {
      const acc_t t = thresholds[k];
      for (int64_t j = 0; j < d; ++j) codes[j] += static_cast<uint8_t>(t < u[j]);
    }
  } else {
    for (int64_t j = 0; j < d; ++j) codes[j] = static_cast<uint8_t>(math::cell_index(u[j], thresholds, bits));
  }
}

// Pack d codes (masked to `bits` bits) of one vector into ceil(d*bits/8) bytes, eight codes at a time.
inline void pack_row(const uint8_t* codes, int64_t d, int64_t bits, uint8_t* out) {
  const uint8_t mask = static_cast<uint8_t>((1u << bits) - 1u);
  const int64_t full = d / 8;
  uint8_t group[8];
  for (int64_t c = 0; c < full; ++c) {
    for (int t = 0; t < 8; ++t) group[t] = codes[8 * c + t] & mask;
    pack_group8(group, bits, out + c * bits);
  }
  if (full * 8 < d) {
    auto code_at = [&](int64_t i) { return static_cast<uint32_t>(codes[i] & mask); };
    for (int64_t k = full * bits; k < packed_bytes(d, bits); ++k) out[k] = pack_byte(code_at, d, bits, k);
  }
}

// Unpack the d codes of one packed vector of ceil(d*bits/8) bytes.
inline void unpack_row(const uint8_t* in, int64_t d, int64_t bits, uint8_t* codes) {
  const int64_t full = d / 8, nb = packed_bytes(d, bits);
  for (int64_t c = 0; c < full; ++c) unpack_group8(in + c * bits, bits, codes + 8 * c);
  for (int64_t i = full * 8; i < d; ++i) codes[i] = static_cast<uint8_t>(unpack_code(in, nb, bits, i));
}

// Rows per task of the sketch kernels (QJL, TurboQuant_prod): one block's projection, rows x m values,
// stays in a core's L2 between the BLAS product that writes it and the sign packing that reads it.
constexpr int64_t kSketchBlock = 256;

// Signs of proj[0..m) (bit 1 for >= 0, as the reference's `>= 0`) packed 8 per byte into out.
template <typename acc_t>
inline void pack_signs(const acc_t* proj, int64_t m, uint8_t* out) {
  const int64_t full = m / 8;
  for (int64_t c = 0; c < full; ++c) {
    uint32_t byte = 0;
    for (int t = 0; t < 8; ++t) byte |= math::sign_bit(proj[8 * c + t]) << t;
    out[c] = static_cast<uint8_t>(byte);
  }
  if (full * 8 < m) {
    uint32_t byte = 0;
    for (int64_t i = full * 8; i < m; ++i) byte |= math::sign_bit(proj[i]) << (i - full * 8);
    out[full] = static_cast<uint8_t>(byte);
  }
}

// The fp32 instance with an AVX2 clone (simd_rows.cpp).
void pack_signs_f32(const float* proj, int64_t m, uint8_t* out);

// The eight ±1 values of each byte of packed signs (bit t of v set: +1 at t), for decoding 8 at a time.
template <typename acc_t>
inline const std::array<std::array<acc_t, 8>, 256>& sign_patterns() {
  static const auto table = [] {
    std::array<std::array<acc_t, 8>, 256> t{};
    for (int v = 0; v < 256; ++v)
      for (int b = 0; b < 8; ++b) t[v][b] = math::sign_value<acc_t>((v >> b) & 1, acc_t(1));
    return t;
  }();
  return table;
}

// out[0..m) = w · (±1 signs of one packed row).
template <typename acc_t>
inline void decode_signs(const uint8_t* row, int64_t m, acc_t w, acc_t* out) {
  const auto& pattern = sign_patterns<acc_t>();
  const int64_t full = m / 8;
  for (int64_t p = 0; p < full; ++p)
    for (int t = 0; t < 8; ++t) out[8 * p + t] = pattern[row[p]][t] * w;
  for (int64_t i = full * 8; i < m; ++i) out[i] = pattern[row[full]][i - full * 8] * w;
}

// The fp32 instance with an AVX2 clone (simd_rows.cpp).
void decode_signs_f32(const uint8_t* row, int64_t m, float w, float* out);

template <typename acc_t>
inline void decode_sign_row(const uint8_t* row, int64_t m, acc_t w, acc_t* out) {
  if constexpr (std::is_same_v<acc_t, float>) {
    decode_signs_f32(row, m, w, out);
  } else {
    decode_signs(row, m, w, out);
  }
}

template <typename acc_t>
inline void pack_sign_row(const acc_t* proj, int64_t m, uint8_t* out) {
  if constexpr (std::is_same_v<acc_t, float>) {
    pack_signs_f32(proj, m, out);
  } else {
    pack_signs(proj, m, out);
  }
}

// out[r] = packed signs of S y_r for the k rows y of one block ([k, d] contiguous, sketch's dtype);
// proj is the task's scratch [>= k, m]. Runs inside a parallel task (parallel_for_tls), so BLAS runs
// single-threaded.
template <typename acc_t>
inline void sketch_signs_block(const at::Tensor& y, const at::Tensor& sketch, at::Tensor& proj, uint8_t* out) {
  const int64_t k = y.size(0), m = sketch.size(0), mb = packed_bytes(m, 1);
  at::Tensor p = proj.narrow(0, 0, k);
  at::mm_out(p, y, sketch.t());
  const acc_t* pp = p.const_data_ptr<acc_t>();
  for (int64_t r = 0; r < k; ++r) pack_sign_row(pp + r * m, m, out + r * mb);
}

// x̂ = Πᵀ(norm · levels[codes]) of the packed rows [begin, end) into out (rows of d values): the CPU fast
// path of lloyd_decode. codes: d bytes of scratch. Instantiated for float and double (lloyd_cpu.cpp).
template <typename scalar_t>
void lloyd_decode_rows(const uint8_t* packed, const scalar_t* norm, const scalar_t* levels, int64_t bits, int64_t d,
                       const math::Rotation& rot, scalar_t* out, int64_t begin, int64_t end, uint8_t* codes);

}  // namespace cpu
}  // namespace kvstats
