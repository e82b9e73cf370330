// CPU kernel of the sign decode from byte tables: the QJL reconstruction Bᵀ b of packed sign rows,
// out[n] = base[n] + weight[n] · Σ_p T[256·p + packed[n, p]] (quant_math.h: sign_decode_row).
//
// The fast path sums one row at a time in registers: the row's columns in chunks of up to 512 bytes (128
// fp32, sixteen AVX2 vectors), and for each chunk the mb table rows picked by the row's bytes are added
// into the chunk's accumulators, which are then scaled (and added to base) and stored once. No index
// tensor, no intermediate [N, d] sum: per vector, mb table rows are read and d values written.
// That direct sum reads mb table rows per vector from wherever the table lives: at m = 512, d = 128, 32 KiB
// per vector from an 8 MiB table, i.e. from L3. Many fp32 rows with d a multiple of 16 take the blocked
// sum below instead, which reads the same bytes from L2 (measured on a 2-core Zen 4, m = 512, d = 128,
// 262,144 rows: 1.2–1.3× the direct sum's rows/s, interleaved runs; huge pages for the tables and software prefetches of the
// next row's table rows were not faster).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "../prologue/sign_decode.h"
#include "../prologue/turbo_prod.h"
#include "common_cpu.h"

namespace kvstats {
namespace {

// 32 bytes of values as one GCC vector: an AVX2 register, or two SSE registers in the baseline clone.
// (A dependent alias template would drop the vector attribute, hence one typedef per type.)
typedef float VecF32 __attribute__((vector_size(32)));
typedef double VecD32 __attribute__((vector_size(32)));
template <typename acc_t>
using Vec = std::conditional_t<std::is_same_v<acc_t, float>, VecF32, VecD32>;

// v += the vector at p (unaligned). By reference: a vector argument or result would change the ABI of
// the baseline (non-AVX) copy.
template <typename acc_t>
KVSTATS_ALWAYS_INLINE void add_vec(Vec<acc_t>& v, const acc_t* p) {
  Vec<acc_t> t;
  std::memcpy(&t, p, sizeof(t));
  v += t;
}

template <typename acc_t>
constexpr int64_t kLanes = 32 / sizeof(acc_t);

// Columns [c0, c0 + V · kLanes) of one row: V vector accumulators (V = 16: all sixteen AVX2 registers —
// the additions take the table values as memory operands — so a 128-wide fp32 row is summed in one
// pass over its bytes, each table row read as 512 contiguous bytes), then scaled, added to base, stored.
template <int V, typename acc_t>
KVSTATS_ALWAYS_INLINE void sign_decode_chunk(const uint8_t* row, int64_t mb, const acc_t* tables, int64_t d, int64_t c0,
                                             acc_t w, const acc_t* base, acc_t* out) {
  constexpr int64_t L = kLanes<acc_t>;
  Vec<acc_t> acc[V];
#pragma GCC unroll 16
  for (int k = 0; k < V; ++k) acc[k] = Vec<acc_t>{};
  const acc_t* col = tables + c0;
  for (int64_t p = 0; p < mb; ++p) {
    const acc_t* t = col + (p * 256 + row[p]) * d;
#pragma GCC unroll 16
    for (int k = 0; k < V; ++k) add_vec(acc[k], t + k * L);
  }
#pragma GCC unroll 16
  for (int k = 0; k < V; ++k) {
    Vec<acc_t> v = acc[k] * w;
    if (base != nullptr) add_vec(v, base + c0 + k * L);
    std::memcpy(out + c0 + k * L, &v, sizeof(v));
  }
}

// The last columns [c0, d) of one row (fewer than one vector), value by value.
template <typename acc_t>
KVSTATS_ALWAYS_INLINE void sign_decode_tail(const uint8_t* row, int64_t mb, const acc_t* tables, int64_t d, int64_t c0,
                                            acc_t w, const acc_t* base, acc_t* out) {
  for (int64_t j = c0; j < d; ++j) {
    acc_t s = 0;
    for (int64_t p = 0; p < mb; ++p) s += tables[(p * 256 + row[p]) * d + j];
    out[j] = base != nullptr ? base[j] + w * s : w * s;
  }
}

template <typename acc_t>
KVSTATS_ALWAYS_INLINE void sign_decode_rows(const uint8_t* packed, int64_t mb, const acc_t* tables, int64_t d,
                                            const acc_t* weight, const acc_t* base, acc_t* out, int64_t begin,
                                            int64_t end) {
  constexpr int64_t L = kLanes<acc_t>;
  for (int64_t r = begin; r < end; ++r) {
    const uint8_t* row = packed + r * mb;
    const acc_t* b = base == nullptr ? nullptr : base + r * d;
    acc_t* o = out + r * d;
    int64_t c0 = 0;
    for (; c0 + 16 * L <= d; c0 += 16 * L) sign_decode_chunk<16>(row, mb, tables, d, c0, weight[r], b, o);
    for (; c0 + 4 * L <= d; c0 += 4 * L) sign_decode_chunk<4>(row, mb, tables, d, c0, weight[r], b, o);
    for (; c0 + L <= d; c0 += L) sign_decode_chunk<1>(row, mb, tables, d, c0, weight[r], b, o);
    if (c0 < d) sign_decode_tail(row, mb, tables, d, c0, weight[r], b, o);
  }
}

KVSTATS_SIMD_CLONES void sign_decode_rows_f32(const uint8_t* packed, int64_t mb, const float* tables, int64_t d,
                                              const float* weight, const float* base, float* out, int64_t begin,
                                              int64_t end) {
  sign_decode_rows(packed, mb, tables, d, weight, base, out, begin, end);
}

// ---------------------------------------------------------------------------------------- blocked sum
// The table cut into sub-tables of kSliceCols columns (one 64-byte line per entry) by kGroupPositions byte
// positions, 256 KiB each, laid out contiguously once per call: slices[((s · mb + p) · 256 + v) · 16 + j] =
// T[256 · p + v][16 · s + j]. A block of kBlockRows rows is swept through one sub-table at a time, so the
// sub-table stays in L2 while every row of the block reads its entries; a row's partial sums over the
// groups before the last wait in a scratch of kBlockRows lines. Each column is still summed over p = 0, 1,
// … in order, then scaled and added to base as in sign_decode_chunk: the result is bit for bit the direct
// sum's. (Sizes measured on a 2-core Zen 4 with a 1 MiB L2: groups of 16 positions and blocks of 4096 rows,
// against 8–64 positions and 1024–16384 rows.)
constexpr int64_t kSliceCols = 16;
constexpr int64_t kGroupPositions = 16;
constexpr int64_t kBlockRows = 4096;
constexpr int64_t kRowsAtOnce = 4;  // independent rows in flight: four chains of additions per sub-table entry

// The slice layout of tables [mb · 256, d] (fp32, d a multiple of 16): [d / 16, mb, 256, 16].
at::Tensor slice_tables(const at::Tensor& tables, int64_t mb, int64_t d) {
  const int64_t entries = mb * 256, slices = d / kSliceCols;
  at::Tensor out = cpu::empty_output(slices * entries, kSliceCols, tables.options());
  const float* t = tables.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  at::parallel_for(0, entries, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e)
      for (int64_t s = 0; s < slices; ++s)
        std::memcpy(o + (s * entries + e) * kSliceCols, t + e * d + s * kSliceCols, kSliceCols * sizeof(float));
  });
  return out;
}

// Sixteen columns of R rows (R ≤ kRowsAtOnce) over the positions [p0, p1) of one sub-table: each row's sum
// starts from 0 (first group) or its scratch line, and goes back to the scratch line or, after the last
// group, is scaled, added to base and stored.
template <int R>
KVSTATS_ALWAYS_INLINE void blocked_rows(const uint8_t* packed, int64_t mb, const float* slice, int64_t p0, int64_t p1,
                                        bool first, bool last, int64_t s, int64_t d, const float* weight,
                                        const float* base, float* out, float* scratch, int64_t r) {
  constexpr int64_t L = kLanes<float>;
  Vec<float> acc[R][2];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    if (first) {
      acc[i][0] = acc[i][1] = Vec<float>{};
    } else {
      std::memcpy(&acc[i][0], scratch + i * kSliceCols, sizeof(acc[i][0]));
      std::memcpy(&acc[i][1], scratch + i * kSliceCols + L, sizeof(acc[i][1]));
    }
  }
  const uint8_t* rows = packed + r * mb;
  for (int64_t p = p0; p < p1; ++p) {
    const float* entries = slice + p * 256 * kSliceCols;
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const float* t = entries + rows[i * mb + p] * kSliceCols;
      add_vec(acc[i][0], t);
      add_vec(acc[i][1], t + L);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    if (!last) {
      std::memcpy(scratch + i * kSliceCols, &acc[i][0], sizeof(acc[i][0]));
      std::memcpy(scratch + i * kSliceCols + L, &acc[i][1], sizeof(acc[i][1]));
      continue;
    }
    const int64_t c0 = s * kSliceCols;
    const float w = weight[r + i];
    for (int h = 0; h < 2; ++h) {
      Vec<float> v = acc[i][h] * w;
      if (base != nullptr) add_vec(v, base + (r + i) * d + c0 + h * L);
      std::memcpy(out + (r + i) * d + c0 + h * L, &v, sizeof(v));
    }
  }
}

KVSTATS_SIMD_CLONES void sign_decode_blocked_f32(const uint8_t* packed, int64_t mb, const float* slices, int64_t d,
                                                 const float* weight, const float* base, float* out, float* scratch,
                                                 int64_t begin, int64_t end) {
  const int64_t n_slices = d / kSliceCols;
  for (int64_t r0 = begin; r0 < end; r0 += kBlockRows) {
    const int64_t r1 = std::min(end, r0 + kBlockRows);
    for (int64_t s = 0; s < n_slices; ++s) {
      const float* slice = slices + s * mb * 256 * kSliceCols;
      for (int64_t p0 = 0; p0 < mb; p0 += kGroupPositions) {
        const int64_t p1 = std::min(mb, p0 + kGroupPositions);
        const bool first = p0 == 0, last = p1 == mb;
        int64_t r = r0;
        for (; r + kRowsAtOnce <= r1; r += kRowsAtOnce)
          blocked_rows<kRowsAtOnce>(packed, mb, slice, p0, p1, first, last, s, d, weight, base, out,
                                    scratch + (r - r0) * kSliceCols, r);
        for (; r < r1; ++r)
          blocked_rows<1>(packed, mb, slice, p0, p1, first, last, s, d, weight, base, out,
                          scratch + (r - r0) * kSliceCols, r);
      }
    }
  }
}

template <typename acc_t>
void sign_decode_range(const uint8_t* packed, int64_t mb, const acc_t* tables, int64_t d, const acc_t* weight,
                       const acc_t* base, acc_t* out, int64_t begin, int64_t end) {
  if constexpr (std::is_same_v<acc_t, float>) {
    sign_decode_rows_f32(packed, mb, tables, d, weight, base, out, begin, end);
  } else {
    sign_decode_rows(packed, mb, tables, d, weight, base, out, begin, end);
  }
}

}  // namespace

// fp32 (the fp64 path keeps the direct sum), widths of whole slices, and a full block of rows for every
// thread (at least two blocks): enough rows to repay laying out the table, and no thread left idle that the
// direct sum (a grain of 4096 / d rows) would have used.
bool sign_decode_takes_blocked_sum(at::ScalarType dtype, int64_t n, int64_t d) {
  return dtype == at::kFloat && d % kSliceCols == 0 && n >= kBlockRows * std::max<int64_t>(2, at::get_num_threads());
}

// The rule above as a probe for the tests (that they exercise the blocked sum): not an op of the contract.
bool sign_decode_blocked_probe(int64_t rows, int64_t d, bool fp32) {
  return sign_decode_takes_blocked_sum(fp32 ? at::kFloat : at::kDouble, rows, d);
}

at::Tensor sign_decode_cpu(const at::Tensor& packed, const at::Tensor& tables, const at::Tensor& weight,
                           const std::optional<at::Tensor>& base) {
  const SignDecodeArgs a = sign_decode_prologue(packed, tables, weight, base);
  const int64_t n = a.n, mb = a.mb, d = a.d;
  cpu::advise_huge_pages(a.out);
  if (sign_decode_takes_blocked_sum(a.tables.scalar_type(), n, d)) {
    const at::Tensor slices = slice_tables(a.tables, mb, d);
    const uint8_t* pp = a.packed.const_data_ptr<uint8_t>();
    const float* sp = slices.const_data_ptr<float>();
    const float* wp = a.weight.const_data_ptr<float>();
    const float* bp = a.base.defined() ? a.base.const_data_ptr<float>() : nullptr;
    float* op = a.out.mutable_data_ptr<float>();
    at::parallel_for(0, n, kBlockRows, [&](int64_t begin, int64_t end) {
      std::vector<float> scratch(kBlockRows * kSliceCols);
      sign_decode_blocked_f32(pp, mb, sp, d, wp, bp, op, scratch.data(), begin, end);
    });
    return a.out;
  }
  AT_DISPATCH_FLOATING_TYPES(a.tables.scalar_type(), "sign_decode_cpu", [&] {
    const uint8_t* pp = a.packed.const_data_ptr<uint8_t>();
    const scalar_t* tp = a.tables.const_data_ptr<scalar_t>();
    const scalar_t* wp = a.weight.const_data_ptr<scalar_t>();
    const scalar_t* bp = a.base.defined() ? a.base.const_data_ptr<scalar_t>() : nullptr;
    scalar_t* op = a.out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, std::max<int64_t>(1, 4096 / d), [&](int64_t begin, int64_t end) {
      sign_decode_range(pp, mb, tp, d, wp, bp, op, begin, end);
    });
  });
  return a.out;
}

// The MSE part of each block of rows is decoded into out (lloyd_decode's row steps), and the sign part
// added to it in place while the block is in cache: the output is written once, no [N, d] intermediate.
// Many fp32 rows add the sign part by the blocked sum, over blocks of kTurboProdBlockRows rows (their
// decoded rows, 512 KiB at d = 128, and one 256 KiB sub-table share L2; measured against 256–2048 rows:
// 1.04–1.07× the direct sum's rows/s on a 2-core Zen 4, bit for bit the same output).
constexpr int64_t kTurboProdBlockRows = 1024;
at::Tensor turbo_prod_decode_cpu(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                                 const at::Tensor& levels, int64_t bits, int64_t d, const at::Tensor& signs_packed,
                                 const at::Tensor& tables, const at::Tensor& weight) {
  const TurboProdDecodeArgs a =
      turbo_prod_decode_prologue(packed, norm, signs, levels, bits, d, signs_packed, tables, weight);
  const int64_t n = a.n, mb = a.mb;
  cpu::advise_huge_pages(a.out);
  const math::Rotation rot = a.rotation();
  if (sign_decode_takes_blocked_sum(a.levels.scalar_type(), n, d)) {
    const at::Tensor slices = slice_tables(a.tables, mb, d);
    const uint8_t* pp = a.packed.const_data_ptr<uint8_t>();
    const float* np = a.norm.const_data_ptr<float>();
    const float* lp = a.levels.const_data_ptr<float>();
    const uint8_t* spp = a.signs_packed.const_data_ptr<uint8_t>();
    const float* slp = slices.const_data_ptr<float>();
    const float* wp = a.weight.const_data_ptr<float>();
    float* op = a.out.mutable_data_ptr<float>();
    at::parallel_for(0, n, kBlockRows, [&](int64_t begin, int64_t end) {
      std::vector<uint8_t> codes(d);
      std::vector<float> scratch(kTurboProdBlockRows * kSliceCols);  // blocks of kTurboProdBlockRows rows
      for (int64_t r0 = begin; r0 < end; r0 += kTurboProdBlockRows) {
        const int64_t r1 = std::min(end, r0 + kTurboProdBlockRows);
        cpu::lloyd_decode_rows(pp, np, lp, bits, d, rot, op, r0, r1, codes.data());
        sign_decode_blocked_f32(spp, mb, slp, d, wp, op, op, scratch.data(), r0, r1);
      }
    });
    return a.out;
  }
  AT_DISPATCH_FLOATING_TYPES(a.levels.scalar_type(), "turbo_prod_decode_cpu", [&] {
    const uint8_t* pp = a.packed.const_data_ptr<uint8_t>();
    const scalar_t* np = a.norm.const_data_ptr<scalar_t>();
    const scalar_t* lp = a.levels.const_data_ptr<scalar_t>();
    const uint8_t* spp = a.signs_packed.const_data_ptr<uint8_t>();
    const scalar_t* tp = a.tables.const_data_ptr<scalar_t>();
    const scalar_t* wp = a.weight.const_data_ptr<scalar_t>();
    scalar_t* op = a.out.mutable_data_ptr<scalar_t>();
    constexpr int64_t kBlock = 64;  // rows decoded, then summed with their signs, while in L1/L2
    at::parallel_for(0, n, std::max<int64_t>(kBlock, 4096 / d), [&](int64_t begin, int64_t end) {
      std::vector<uint8_t> codes(d);
      for (int64_t r0 = begin; r0 < end; r0 += kBlock) {
        const int64_t r1 = std::min(end, r0 + kBlock);
        cpu::lloyd_decode_rows(pp, np, lp, bits, d, rot, op, r0, r1, codes.data());
        sign_decode_range(spp, mb, tp, d, wp, static_cast<const scalar_t*>(op), op, r0, r1);
      }
    });
  });
  return a.out;
}

TORCH_LIBRARY_IMPL(kvstats, CPU, m) {
  m.impl("sign_decode", &sign_decode_cpu);
  m.impl("turbo_prod_decode", &turbo_prod_decode_cpu);
}

// torch.ops.kvstats._sign_decode_blocked(rows, d, fp32): whether the CPU sign decode of those rows takes the
// blocked sum at the current torch thread count (a probe for the tests, outside the schema list).
TORCH_LIBRARY_FRAGMENT(kvstats, m) {
  m.def("_sign_decode_blocked(int rows, int d, bool fp32) -> bool", &sign_decode_blocked_probe);
}

}  // namespace kvstats
