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
  if (nq >= 8) {
    // Many queries: unpack a chunk of keys to ±norm·scale rows and multiply by BLAS (bounded chunk).
    constexpr int64_t kChunk = 4096;
    for (int64_t j0 = 0; j0 < nk; j0 += kChunk) {
      const int64_t rows = std::min(kChunk, nk - j0);
      const at::Tensor bits = at::empty({G * rows, m}, pc.options());
      const at::Tensor chunk = pc.narrow(1, j0, rows).reshape({G * rows, mb}).contiguous();
      const uint8_t* cp = chunk.const_data_ptr<uint8_t>();
      uint8_t* bp = bits.mutable_data_ptr<uint8_t>();
      at::parallel_for(0, G * rows, 64, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) cpu::unpack_row(cp + r * mb, m, 1, bp + r * m);
      });
      const at::Tensor signs = (bits.to(qc.scalar_type()) * 2 - 1).reshape({G, rows, m});
      out.narrow(2, j0, rows).copy_(at::matmul(qc, signs.transpose(1, 2)) * wc.narrow(1, j0, rows).unsqueeze(1));
    }
    return out;
  }
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
