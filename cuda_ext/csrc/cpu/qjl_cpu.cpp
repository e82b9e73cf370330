// CPU kernels of the QJL sketch: encode (norm, S x by GEMM in bounded chunks, signs packed 8 per byte)
// and scores straight from the packed signs via per-byte tables (score_tables.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "../bitpack.h"
#include "../kernels.h"
#include "common_cpu.h"
#include "score_tables.h"

namespace kvstats {

std::tuple<at::Tensor, at::Tensor> qjl_encode_cpu(const at::Tensor& x, const at::Tensor& sketch,
                                                  at::ScalarType norm_dtype) {
  check_qjl_encode_input(x, sketch);
  const at::Tensor sk = sketch.contiguous();
  const at::Tensor xa = x.to(sk.scalar_type()).contiguous();
  const int64_t n = xa.size(0), m = sk.size(0), mb = packed_bytes(m, 1);
  at::Tensor packed = at::empty({n, mb}, xa.options().dtype(at::kByte));
  at::Tensor norm = at::linalg_vector_norm(xa, 2, {1});
  AT_DISPATCH_FLOATING_TYPES(sk.scalar_type(), "qjl_encode_cpu", [&] {
    for (int64_t c0 = 0; c0 < n; c0 += cpu::kChunkRows) {
      const int64_t rows = std::min(cpu::kChunkRows, n - c0);
      const at::Tensor proj = at::matmul(xa.narrow(0, c0, rows), sk.t()).contiguous();
      const scalar_t* jp = proj.const_data_ptr<scalar_t>();
      uint8_t* pp = packed.mutable_data_ptr<uint8_t>() + c0 * mb;
      cpu::pack_sign_rows(jp, rows, m, pp);
    }
  });
  return {packed, norm.to(storage_dtype(x, norm_dtype))};
}

at::Tensor qjl_scores_cpu(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm,
                          double scale) {
  check_qjl_scores_input(q_sketch, packed, norm);
  const at::Tensor qc = q_sketch.contiguous(), pc = packed.contiguous();
  const at::Tensor wc = (norm.to(qc.scalar_type()) * scale).contiguous();
  const int64_t G = qc.size(0), nq = qc.size(1), m = qc.size(2), nk = pc.size(1), mb = pc.size(2);
  at::Tensor out = at::empty({G, nq, nk}, qc.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "qjl_scores_cpu", [&] {
    const scalar_t* qp = qc.const_data_ptr<scalar_t>();
    const uint8_t* pp = pc.const_data_ptr<uint8_t>();
    const scalar_t* wp = wc.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    std::vector<scalar_t> tables(G * nq * mb * 256);
    at::parallel_for(0, G * nq, 1, [&](int64_t begin, int64_t end) {
      for (int64_t gi = begin; gi < end; ++gi) cpu::build_sign_table(qp + gi * m, m, mb, tables.data() + gi * mb * 256);
    });
    constexpr int64_t kBlock = 256;
    const int64_t blocks = (nk + kBlock - 1) / kBlock;
    at::parallel_for(0, G * blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t gb = begin; gb < end; ++gb) {
        const int64_t g = gb / blocks, j0 = (gb % blocks) * kBlock, j1 = std::min(nk, j0 + kBlock);
        for (int64_t i = 0; i < nq; ++i) {
          const scalar_t* t = tables.data() + (g * nq + i) * mb * 256;
          for (int64_t j = j0; j < j1; ++j)
            op[(g * nq + i) * nk + j] = wp[g * nk + j] * cpu::table_sum(t, pp + (g * nk + j) * mb, mb);
        }
      }
    });
  });
  return out;
}

}  // namespace kvstats
