// Scores straight from packed codes, shared by the lloyd / turbo_mse, TurboQuant_prod and QJL kernels:
//
//   scores[g, i, j] = mse_w[g, j] · <q[g, i], levels[codes[g, j]]>  +  qjl_w[g, j] · <qs[g, i], signs[g, j]>
//
// either part optional (QJL has only the second, lloyd only the first). Four CPU methods, picked by the
// number of queries n_q per key group and the code width (score_packed):
//
// * fp32, n_q <= 8, codes of <= 4 bits with d a multiple of 8 (and m a multiple of 8), on an AVX2 CPU: the
//   row kernels of code_rows.h (each key's codes expanded eight at a time into levels in registers and
//   multiplied into the queries' accumulators: a decode step). SmolLM2's layer (3 groups of 3 queries,
//   2,048 keys, d = 64, 1 thread): 0.11 ms at 3 and 4 bits, against 0.27 and 0.38 ms for the tables below
//   and 0.13 ms for a dense fp32 q·Kᵀ of the same shape.
// * n_q = 1 (or n_q < kAdcQueries): per-query lookup tables (score_tables.h), one look-up per byte (or
//   code pair) per key, scalar.
// * n_q >= kAdcQueries, codes of <= 4 bits (or none): the queries-innermost tables of score_adc.h. Per
//   block of 16 queries, T[position][field][query] (1 MiB for m = 512 sign bits, 512 KiB for 3-bit codes
//   at d = 128 plus m = 128 signs) is built by the task that uses it and stays in its core's L2; each
//   field of a key (a byte, a 6-bit pair of 3-bit codes) selects a row of 16 partial sums, added with two
//   AVX2 vector adds. Per key and 16 queries that is d·bits/8 (or d/2) + m/8 row additions, against the
//   16·(d + m) multiply-adds of decoding the key and multiplying (4x the flops of a dense q·Kᵀ for QJL at
//   m = 4d, 2x for turbo_prod). The table entries are the per-query tables' entries, so each score is
//   the same sum reordered (no lower precision).
// * wider codes (5–8 bits) or tables above kMaxAdcTableBytes: each task decodes a block of keys to dense
//   rows (levels[codes] · w, ±w) in a buffer that stays in cache and multiplies it by the queries with BLAS.
//
// Measured on a 2-core Zen 4 (1 thread, CPU time, keys [8, 32768, 128], n_q = 64; the machine was shared,
// load 4-8, so only ratios within one process mean much): dense fp32 q·Kᵀ 110-120 ms; with these tables
// qjl (m = 512) 107-111 ms (before: 315-332, ~40 of them a copy in QJLQuantizer._inner), turbo_prod
// (3-bit codes + m = 128) 106-111 ms (GEMM: 187), turbo_mse 55, 71-80, 83, 100-105 ms at 1, 2, 3, 4
// bits (GEMM: 118-129). At 5-8 bits the tables (d look-ups per key after unpacking, or 2 MiB of 8-bit
// tables) took 205-310 ms against GEMM's 125-140, so GEMM stays there. n_q = 2..8 at 4 bits: 12-15 ms
// against the per-query tables' 14-74 ms. With 2 threads (wall time, medians of interleaved calls at the
// same load) qjl and turbo_prod came out at 0.8-1.0x the dense product: the machine's load, not the
// kernel, dominated the spread.
//
// The kvstats_shared backend (shared/, kvstats.ops.shared_path()) scores each (query, key) pair with
// math::score_one instead, the GPU's per-thread loop.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <memory>
#include <vector>

#include "../bitpack.h"
#include "../quant_math.h"
#include "../score_params.h"
#include "code_rows.h"
#include "common_cpu.h"
#include "score_adc.h"
#include "score_tables.h"

namespace kvstats {
namespace cpu {

constexpr int64_t kGemmQueries = 8;
// Fewest queries per group for the queries-innermost tables (score_adc.h), the widest codes they take,
// and the most bytes one block's tables may take (beyond a core's L2 the look-ups miss).
constexpr int64_t kAdcQueries = 2;
constexpr int64_t kAdcMaxBits = 4;
constexpr int64_t kMaxAdcTableBytes = int64_t{2} << 20;
// Keys per task: the decoded block (kScoreBlock × (d + m) values) and its scores stay in L2.
constexpr int64_t kScoreBlock = 256;
// Most memory the per-query lookup tables of one call may take (above: the GEMM path).
constexpr int64_t kMaxTableBytes = int64_t{16} << 20;

// The packed keys of G groups of nk keys. codes: [G, nk, ceil(d·bits/8)] (nullptr: no MSE part);
// signs: [G, nk, ceil(m/8)] (nullptr: no sign part); weights [G, nk].
template <typename acc_t>
struct PackedKeys {
  int64_t G = 0, nk = 0;
  const uint8_t* codes = nullptr;
  const acc_t* mse_w = nullptr;
  const acc_t* levels = nullptr;
  int64_t bits = 0, d = 0;
  const uint8_t* signs = nullptr;
  const acc_t* qjl_w = nullptr;
  int64_t m = 0;
};

// Keys with an MSE part: packed [G, nk, ceil(d·bits/8)] uint8, w [G, nk] and levels [2^bits] in acc_t.
template <typename acc_t>
PackedKeys<acc_t> code_keys(const at::Tensor& packed, const at::Tensor& w, const at::Tensor& levels, int64_t bits,
                            int64_t d) {
  PackedKeys<acc_t> k;
  k.G = packed.size(0);
  k.nk = packed.size(1);
  k.codes = packed.const_data_ptr<uint8_t>();
  k.mse_w = w.const_data_ptr<acc_t>();
  k.levels = levels.const_data_ptr<acc_t>();
  k.bits = bits;
  k.d = d;
  return k;
}

// Adds the sign part: signs [G, nk, ceil(m/8)] uint8, w [G, nk] in acc_t.
template <typename acc_t>
PackedKeys<acc_t> with_signs(PackedKeys<acc_t> k, const at::Tensor& signs, const at::Tensor& w, int64_t m) {
  k.G = signs.size(0);
  k.nk = signs.size(1);
  k.signs = signs.const_data_ptr<uint8_t>();
  k.qjl_w = w.const_data_ptr<acc_t>();
  k.m = m;
  return k;
}

// q: [G, nq, d] (undefined without MSE part), qs: [G, nq, m] (undefined without sign part), both
// contiguous in acc_t; out: [G, nq, nk].
template <typename acc_t>
void score_packed_tables(const PackedKeys<acc_t>& k, const at::Tensor& q, const at::Tensor& qs, at::Tensor& out) {
  const int64_t nq = out.size(1), d = k.d, m = k.m;
  const int64_t mb = k.signs ? packed_bytes(m, 1) : 0;
  const CodeTable ct(k.codes ? d : 0, k.codes ? k.bits : 1);
  const int64_t code_size = k.codes ? ct.size : 0;
  const int64_t stride = code_size + mb * 256;  // per (g, i): the codes' table, then the signs' byte table
  std::vector<acc_t> tables(k.G * nq * stride);
  const acc_t* qp = k.codes ? q.const_data_ptr<acc_t>() : nullptr;
  const acc_t* qsp = k.signs ? qs.const_data_ptr<acc_t>() : nullptr;
  at::parallel_for(0, k.G * nq, 1, [&](int64_t begin, int64_t end) {
    for (int64_t gi = begin; gi < end; ++gi) {
      acc_t* t = tables.data() + gi * stride;
      if (k.codes) build_code_table(ct, qp + gi * d, k.levels, t);
      if (k.signs) build_sign_table(qsp + gi * m, m, mb, t + code_size);
    }
  });
  acc_t* op = out.mutable_data_ptr<acc_t>();
  // One loop per layout (code_sum is a distinct lambda type), so each inner loop is specialised and inlined.
  auto run = [&](auto code_sum) {
    const int64_t nk = k.nk, nb = ct.nb, blocks = (nk + kScoreBlock - 1) / kScoreBlock;
    const uint8_t* codes = k.codes;
    const uint8_t* signs = k.signs;
    const acc_t* mse_w = k.mse_w;
    const acc_t* qjl_w = k.qjl_w;
    at::parallel_for(0, k.G * blocks, 1, [&](int64_t begin, int64_t end) {
      std::vector<uint8_t> scratch(d);
      for (int64_t gb = begin; gb < end; ++gb) {
        const int64_t g = gb / blocks, j0 = (gb % blocks) * kScoreBlock, j1 = std::min(nk, j0 + kScoreBlock);
        for (int64_t i = 0; i < nq; ++i) {
          const acc_t* t = tables.data() + (g * nq + i) * stride;
          acc_t* o = op + (g * nq + i) * nk;
          // Two simple passes over the block (codes, then signs) run faster than one loop doing both.
          for (int64_t j = j0; j < j1; ++j)
            o[j] = codes ? mse_w[g * nk + j] * code_sum(t, codes + (g * nk + j) * nb, scratch.data()) : acc_t(0);
          if (signs)
            for (int64_t j = j0; j < j1; ++j)
              o[j] += qjl_w[g * nk + j] * table_sum(t + code_size, signs + (g * nk + j) * mb, mb);
        }
      }
    });
  };
  switch (ct.layout) {
    case CodeTable::Layout::kByte:
      run([&](const acc_t* t, const uint8_t* row, uint8_t*) { return table_sum(t, row, ct.nb); });
      break;
    case CodeTable::Layout::kPair3:
      run([&](const acc_t* t, const uint8_t* row, uint8_t*) { return pair3_sum(ct, t, row); });
      break;
    case CodeTable::Layout::kCode:
      run([&](const acc_t* t, const uint8_t* row, uint8_t* c) { return per_code_sum(ct, t, row, c); });
      break;
  }
}

template <typename acc_t>
void score_packed_gemm(const PackedKeys<acc_t>& k, const at::Tensor& q, const at::Tensor& qs, at::Tensor& out) {
  const int64_t nq = out.size(1), d = k.d, m = k.m;
  const int64_t nb = k.codes ? packed_bytes(d, k.bits) : 0, mb = k.signs ? packed_bytes(m, 1) : 0;
  const int64_t blocks = (k.nk + kScoreBlock - 1) / kScoreBlock;
  const auto opts = out.options();
  parallel_for_tls(0, k.G * blocks, 1, [&](int64_t begin, int64_t end) {
    at::Tensor dense = k.codes ? at::empty({kScoreBlock, d}, opts) : at::Tensor();
    at::Tensor dense_signs = k.signs ? at::empty({kScoreBlock, m}, opts) : at::Tensor();
    at::Tensor tile = at::empty({nq, kScoreBlock}, opts);
    std::vector<uint8_t> codes(d);
    for (int64_t gb = begin; gb < end; ++gb) {
      const int64_t g = gb / blocks, j0 = (gb % blocks) * kScoreBlock;
      const int64_t rows = std::min(kScoreBlock, k.nk - j0);
      at::Tensor scores = tile.narrow(1, 0, rows);
      if (k.codes) {
        acc_t* dp = dense.mutable_data_ptr<acc_t>();
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t key = g * k.nk + j0 + r;
          unpack_row(k.codes + key * nb, d, k.bits, codes.data());
          for (int64_t t = 0; t < d; ++t) dp[r * d + t] = math::level_value(k.levels, codes[t], k.mse_w[key]);
        }
        at::mm_out(scores, q[g], dense.narrow(0, 0, rows).t());
      }
      if (k.signs) {
        acc_t* sp = dense_signs.mutable_data_ptr<acc_t>();
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t key = g * k.nk + j0 + r;
          decode_sign_row(k.signs + key * mb, m, k.qjl_w[key], sp + r * m);
        }
        const at::Tensor sign_part = dense_signs.narrow(0, 0, rows).t();
        if (k.codes) {
          scores.addmm_(qs[g], sign_part);
        } else {
          at::mm_out(scores, qs[g], sign_part);
        }
      }
      out[g].narrow(1, j0, rows).copy_(scores);
    }
  });
}

// Keys per task of the many-query kernel (consecutive tasks of one thread share a block's tables).
constexpr int64_t kAdcChunk = 2048;

// The packed keys' table layout for score_adc.h.
template <typename acc_t>
AdcLayout adc_layout(const PackedKeys<acc_t>& k) {
  return AdcLayout(k.codes != nullptr, k.d, k.bits, k.signs != nullptr, k.m);
}

// Bytes of one block's tables (kAdcBlock queries).
template <typename acc_t>
int64_t adc_table_bytes(const PackedKeys<acc_t>& k) {
  return adc_layout(k).entries() * kAdcBlock * static_cast<int64_t>(sizeof(acc_t));
}

// Many queries: blocks of kAdcBlock queries (a last block of <= kAdcShortBlock queries in a short
// block), tables per (group, block) built by the first task of a thread that needs them (score_adc.h).
// The workers take tasks from a shared counter, in order, rather than a fixed half each: on a loaded
// machine a descheduled thread then delays the call by one task, not by its whole share. Each score is
// computed by one task from the same tables whichever thread runs it, so the result does not depend on
// the schedule.
template <typename acc_t>
void score_packed_adc(const PackedKeys<acc_t>& k, const at::Tensor& q, const at::Tensor& qs, at::Tensor& out) {
  const int64_t nq = out.size(1), d = k.codes ? k.d : 0, m = k.signs ? k.m : 0, nk = k.nk;
  const AdcLayout layout = adc_layout(k);
  const int64_t blocks = (nq + kAdcBlock - 1) / kAdcBlock, chunks = (nk + kAdcChunk - 1) / kAdcChunk;
  const acc_t* qp = k.codes ? q.const_data_ptr<acc_t>() : nullptr;
  const acc_t* qsp = k.signs ? qs.const_data_ptr<acc_t>() : nullptr;
  acc_t* op = out.mutable_data_ptr<acc_t>();
  const int64_t tasks = k.G * blocks * chunks;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), tasks), 1, [&](int64_t, int64_t) {
    // The tables 64-byte aligned (score_adc.h): a row of 16 fp32 is then one cache line.
    const size_t table_bytes = layout.entries() * kAdcBlock * sizeof(acc_t);
    std::vector<acc_t> storage(layout.entries() * kAdcBlock + 64 / sizeof(acc_t));
    void* aligned = storage.data();
    size_t space = storage.size() * sizeof(acc_t);
    acc_t* table = static_cast<acc_t*>(std::align(64, table_bytes, aligned, space));
    std::vector<acc_t> qT(d * kAdcBlock), qsT(m * kAdcBlock), buf(kAdcKeyBlock * kAdcBlock);
    std::vector<uint8_t> scratch(kAdcKeyBlock * d);
    int64_t built = -1;
    for (int64_t task = next.fetch_add(1); task < tasks; task = next.fetch_add(1)) {
      const int64_t gb = task / chunks, g = gb / blocks, first = (gb % blocks) * kAdcBlock;
      const int64_t rows = std::min(kAdcBlock, nq - first), nqb = rows <= kAdcShortBlock ? kAdcShortBlock : kAdcBlock;
      if (gb != built) {  // this block's queries, transposed (zero columns past the last query), and tables
        auto transpose = [&](const acc_t* src, int64_t width, std::vector<acc_t>& dst) {
          for (int64_t r = 0; r < nqb; ++r)
            for (int64_t c = 0; c < width; ++c)
              dst[c * nqb + r] = r < rows ? src[(g * nq + first + r) * width + c] : acc_t(0);
        };
        if (qp) transpose(qp, d, qT);
        if (qsp) transpose(qsp, m, qsT);
        adc_build_tables<acc_t>(layout, nqb, qT.data(), qsT.data(), k.levels, table);
        built = gb;
      }
      AdcTask<acc_t> t;
      t.layout = &layout;
      t.nqb = nqb;
      t.rows = rows;
      t.table = table;
      t.codes = k.codes ? k.codes + g * nk * layout.ct.nb : nullptr;
      t.signs = k.signs ? k.signs + g * nk * layout.mb : nullptr;
      t.mse_w = k.codes ? k.mse_w + g * nk : nullptr;
      t.qjl_w = k.signs ? k.qjl_w + g * nk : nullptr;
      t.j0 = (task % chunks) * kAdcChunk;
      t.j1 = std::min(nk, t.j0 + kAdcChunk);
      t.out = op + (g * nq + first) * nk;
      t.nk = nk;
      t.buf = buf.data();
      t.scratch = scratch.data();
      adc_score_chunk<acc_t>(t);
    }
  });
}

// A decode step's few queries (code_rows.h): the packed keys as one score launch.
inline void score_packed_rows(const PackedKeys<float>& k, const at::Tensor& q, const at::Tensor& qs, at::Tensor& out) {
  math::ScoreParams<float> p = score_params<float>(out);
  p.q = k.codes ? q.const_data_ptr<float>() : nullptr;
  p.codes = k.codes;
  p.mse_w = k.mse_w;
  p.levels = k.levels;
  p.bits = k.bits;
  p.d = k.d;
  p.qs = k.signs ? qs.const_data_ptr<float>() : nullptr;
  p.signs = k.signs;
  p.qjl_w = k.qjl_w;
  p.m = k.m;
  row_scores_f32(p);
}

// Bytes the per-query lookup tables of score_packed_tables would take.
template <typename acc_t>
int64_t table_bytes(const PackedKeys<acc_t>& k, int64_t nq) {
  const int64_t code_size = k.codes ? CodeTable(k.d, k.bits).size : 0;
  const int64_t sign_size = k.signs ? packed_bytes(k.m, 1) * 256 : 0;
  return k.G * nq * (code_size + sign_size) * static_cast<int64_t>(sizeof(acc_t));
}

// Fills out [G, nq, nk] (the op's prologue allocates it) from the packed keys; picks per-query tables,
// queries-innermost tables or GEMM by the number of queries, the code width and the tables' size (see the top
// of this file).
template <typename acc_t>
void score_packed(const PackedKeys<acc_t>& k, const at::Tensor& q, const at::Tensor& qs, at::Tensor out) {
  if (out.numel() == 0) return;
  const int64_t nq = out.size(1);
  if constexpr (std::is_same_v<acc_t, float>) {
    if ((!k.codes || rows_apply(nq, k.bits, k.d)) && (!k.signs || rows_apply(nq, 1, k.m))) {
      score_packed_rows(k, q, qs, out);
      return;
    }
  }
  if (nq >= kAdcQueries && (!k.codes || k.bits <= kAdcMaxBits) &&
             adc_table_bytes(k) <= kMaxAdcTableBytes) {
    score_packed_adc(k, q, qs, out);
  } else if (nq >= kGemmQueries || table_bytes(k, nq) > kMaxTableBytes) {
    score_packed_gemm(k, q, qs, out);
  } else {
    score_packed_tables(k, q, qs, out);
  }
}

}  // namespace cpu
}  // namespace kvstats
