// CPU kernels of the weighted sums straight from the codes (weighted_sum.h): lloyd and qjl through tables of
// accumulated weights, min-max through per-key reconstruction into query accumulators. The fp32 task loops
// are compiled twice (baseline ISA and AVX2) with KVSTATS_SIMD_CLONES.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../prologue/lloyd.h"
#include "../prologue/minmax.h"
#include "../prologue/qjl.h"
#include "../score_params.h"
#include "../weighted_params.h"
#include "code_rows.h"
#include "common_cpu.h"
#include "weighted_sum.h"

namespace kvstats {
namespace cpu {

KVSTATS_SIMD_CLONES void table_task_f32_1(const TableTask<float>& t) { table_task_nq<float, 1>(t); }
KVSTATS_SIMD_CLONES void table_task_f32_4(const TableTask<float>& t) { table_task_nq<float, 4>(t); }
KVSTATS_SIMD_CLONES void table_task_f32_8(const TableTask<float>& t) { table_task_nq<float, 8>(t); }
KVSTATS_SIMD_CLONES void minmax_task_f32(const MinMaxTask<float>& t) { minmax_task_any<float>(t); }

namespace {

// Chunks of `n` items for `outer` independent blocks: about four tasks per thread (the split changes no
// sum), each at most `max_items` items.
int64_t chunk_size(int64_t n, int64_t outer, int64_t max_items, int64_t min_items) {
  const int64_t want = std::max<int64_t>(1, (4 * at::get_num_threads() + outer - 1) / std::max<int64_t>(outer, 1));
  int64_t size = std::max<int64_t>(min_items, (n + want - 1) / want);
  return std::max<int64_t>(1, std::min(size, max_items));
}

// out [G, nq, d] = Σ_j w[g, i, j] · key_w[g, j] · levels[code[g, j, t]] through the tables (weighted_sum.h).
template <typename acc_t, int NQ>
void weighted_tables(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& key_w, const acc_t* levels,
                     int64_t bits, const at::Tensor& out) {
  const int64_t G = w.size(0), nq = w.size(1), nk = w.size(2), d = out.size(2);
  const FieldLayout L = field_layout(bits, d);
  const int64_t nqb = (nq + NQ - 1) / NQ;
  const acc_t* wp = w.const_data_ptr<acc_t>();
  const acc_t* kp = key_w.const_data_ptr<acc_t>();
  const uint8_t* pp = packed.const_data_ptr<uint8_t>();
  acc_t* op = out.mutable_data_ptr<acc_t>();
  // coef[g, b, j, q] = w[g, b·NQ + q, j] · key_w[g, j] (math::weighted_key_coefficient), 0 past nq.
  std::vector<acc_t> coef(static_cast<size_t>(G * nqb * nk * NQ));
  at::parallel_for(0, G * nqb, 1, [&](int64_t begin, int64_t end) {
    for (int64_t gb = begin; gb < end; ++gb) {
      const int64_t g = gb / nqb, q0 = (gb % nqb) * NQ, nqr = std::min<int64_t>(NQ, nq - q0);
      acc_t* c = coef.data() + gb * nk * NQ;
      for (int64_t j = 0; j < nk; ++j) {
        for (int64_t q = 0; q < NQ; ++q)
          c[j * NQ + q] = q < nqr ? math::weighted_key_coefficient(wp[(g * nq + q0 + q) * nk + j], kp[g * nk + j])
                                  : acc_t(0);
      }
    }
  });
  const int64_t per_field = L.E * NQ * static_cast<int64_t>(sizeof(acc_t));
  // Chunks of a multiple of 8 fields (their codes start on a byte: row_fields).
  const int64_t fc = (chunk_size(L.F, G * nqb, std::max<int64_t>(8, kWeightedTableBytes / per_field), 8) + 7) / 8 * 8;
  const int64_t nfc = (L.F + fc - 1) / fc;
  at::parallel_for(0, G * nqb * nfc, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> table(static_cast<size_t>(fc * L.E * NQ));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t gb = task / nfc, g = gb / nqb, q0 = (gb % nqb) * NQ;
      TableTask<acc_t> t;
      t.L = L;
      t.nk = nk;
      t.f0 = (task % nfc) * fc;
      t.f1 = std::min(L.F, t.f0 + fc);
      t.codes = pp + g * nk * L.nb;
      t.coef = coef.data() + gb * nk * NQ;
      t.levels = levels;
      t.table = table.data();
      t.out = op + (g * nq + q0) * d;
      t.nq = std::min<int64_t>(NQ, nq - q0);
      table_task<acc_t, NQ>(t);
    }
  });
}

template <typename acc_t>
void weighted_levels(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& key_w, const acc_t* levels,
                     int64_t bits, const at::Tensor& out) {
  const int64_t nq = w.size(1);
  if constexpr (std::is_same_v<acc_t, float>) {
    if (rows_apply(nq, bits, out.size(2))) {  // a decode step's few queries: code_rows.h
      auto p = weighted_params<float>(math::WeightedKind::kLevels, w, packed, bits, out);
      p.key_w = key_w.const_data_ptr<float>();
      p.levels = levels;
      row_weighted_f32(p);
      return;
    }
  }
  if (nq == 1) {
    weighted_tables<acc_t, 1>(w, packed, key_w, levels, bits, out);
  } else if (nq <= 4) {
    weighted_tables<acc_t, 4>(w, packed, key_w, levels, bits, out);
  } else {
    weighted_tables<acc_t, 8>(w, packed, key_w, levels, bits, out);
  }
}

at::Tensor lloyd_weighted_sum_cpu(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm,
                                  const at::Tensor& levels, int64_t bits, int64_t d) {
  const LloydWeightedSumArgs a = lloyd_weighted_sum_prologue(w, packed, norm, levels, bits, d);
  if (a.out.numel() == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES(a.w.scalar_type(), "lloyd_weighted_sum_cpu", [&] {
    weighted_levels<scalar_t>(a.w, a.packed, a.norm, a.levels.const_data_ptr<scalar_t>(), bits, a.out);
  });
  return a.out;
}

at::Tensor qjl_weighted_sum_cpu(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& norm, double scale,
                                int64_t m) {
  const QjlWeightedSumArgs a = qjl_weighted_sum_prologue(w, packed, norm, scale, m, &qjl_weights_cpu);
  if (a.out.numel() == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES(a.w.scalar_type(), "qjl_weighted_sum_cpu", [&] {
    // Signs are 1-bit codes whose levels are −1 and +1 (math::sign_value of a unit weight).
    const scalar_t signs[2] = {math::sign_value<scalar_t>(0u, scalar_t(1)), math::sign_value<scalar_t>(1u, scalar_t(1))};
    weighted_levels<scalar_t>(a.w, a.packed, a.key_w, signs, 1, a.out);
  });
  return a.out;
}

at::Tensor minmax_weighted_sum_cpu(const at::Tensor& w, const at::Tensor& packed, const at::Tensor& lo,
                                   const at::Tensor& scale, int64_t group, int64_t bits, int64_t d) {
  const MinMaxWeightedSumArgs a = minmax_weighted_sum_prologue(w, packed, lo, scale, group, bits, d);
  const int64_t G = a.w.size(0), nq = a.w.size(1), nk = a.w.size(2), nb = a.packed.size(2), ng = d / group;
  if (a.out.numel() == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES(a.w.scalar_type(), "minmax_weighted_sum_cpu", [&] {
    const scalar_t* wp = a.w.const_data_ptr<scalar_t>();
    const uint8_t* pp = a.packed.const_data_ptr<uint8_t>();
    const scalar_t* lp = a.lo.const_data_ptr<scalar_t>();
    const scalar_t* sp = a.step.const_data_ptr<scalar_t>();
    scalar_t* op = a.out.mutable_data_ptr<scalar_t>();
    const int64_t nqb = (nq + kWeightedMinMaxQueries - 1) / kWeightedMinMaxQueries;
    const int64_t ndc = (d + kWeightedDimChunk - 1) / kWeightedDimChunk;
    at::parallel_for(0, G * nqb * ndc, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> acc(static_cast<size_t>(kWeightedMinMaxQueries * kWeightedDimChunk));
      for (int64_t task = begin; task < end; ++task) {
        const int64_t gb = task / ndc, g = gb / nqb, q0 = (gb % nqb) * kWeightedMinMaxQueries;
        MinMaxTask<scalar_t> t;
        t.d = d;
        t.bits = bits;
        t.nb = nb;
        t.group = group;
        t.nk = nk;
        t.t0 = (task % ndc) * kWeightedDimChunk;
        t.t1 = std::min(d, t.t0 + kWeightedDimChunk);
        t.nq = std::min(kWeightedMinMaxQueries, nq - q0);
        t.codes = pp + g * nk * nb;
        t.lo = lp + g * nk * ng;
        t.step = sp + g * nk * ng;
        t.w = wp + (g * nq + q0) * nk;
        t.w_stride = nk;
        t.acc = acc.data();
        t.out = op + (g * nq + q0) * d;
        minmax_task<scalar_t>(t);
      }
    });
  });
  return a.out;
}

}  // namespace
}  // namespace cpu

TORCH_LIBRARY_IMPL(kvstats, CPU, m) {
  m.impl("lloyd_weighted_sum", &cpu::lloyd_weighted_sum_cpu);
  m.impl("qjl_weighted_sum", &cpu::qjl_weighted_sum_cpu);
  m.impl("minmax_weighted_sum", &cpu::minmax_weighted_sum_cpu);
}

}  // namespace kvstats
