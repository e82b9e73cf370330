// CPU kernels of the QJL sketch: encode (norm, S x by GEMM per block of rows, signs packed 8 per byte)
// and scores straight from the packed signs (score_codes.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "../bitpack.h"
#include "../checks/qjl.h"
#include "../kernels.h"
#include "common_cpu.h"
#include "score_codes.h"

namespace kvstats {

std::tuple<at::Tensor, at::Tensor> qjl_encode_cpu(const at::Tensor& x, const at::Tensor& sketch,
                                                  at::ScalarType norm_dtype) {
  check_qjl_encode_input(x, sketch);
  const at::Tensor sk = sketch.contiguous();
  const int64_t n = x.size(0), d = x.size(1), m = sk.size(0), mb = packed_bytes(m, 1);
  const int64_t blocks = (n + cpu::kSketchBlock - 1) / cpu::kSketchBlock;
  at::Tensor packed = at::empty({n, mb}, x.options().dtype(at::kByte));
  at::Tensor norm = at::empty({n}, sk.options());
  AT_DISPATCH_FLOATING_TYPES(sk.scalar_type(), "qjl_encode_cpu", [&] {
    uint8_t* pp = packed.mutable_data_ptr<uint8_t>();
    scalar_t* np = norm.mutable_data_ptr<scalar_t>();
    // Per task: a block of rows in the sketch's dtype and its projection; nothing of size n is allocated.
    // The workers run ATen ops (conversion, BLAS), so they take the caller's thread-local state.
    cpu::parallel_for_tls(0, blocks, 1, [&](int64_t begin, int64_t end) {
      at::Tensor proj = at::empty({std::min(n, cpu::kSketchBlock), m}, sk.options());
      std::vector<scalar_t> buf(d);
      for (int64_t b = begin; b < end; ++b) {
        const int64_t r0 = b * cpu::kSketchBlock, k = std::min(cpu::kSketchBlock, n - r0);
        const at::Tensor y = x.narrow(0, r0, k).to(sk.scalar_type()).contiguous();
        const scalar_t* yp = y.const_data_ptr<scalar_t>();
        // ‖x‖ without overflow (scaled by 2^-e before squaring): math::load_scaled, as the GPU.
        for (int64_t r = 0; r < k; ++r) np[r0 + r] = math::load_scaled(yp + r * d, d, buf.data(), math::SerialLanes{}).norm();
        cpu::sketch_signs_block<scalar_t>(y, sk, proj, pp + r0 * mb);
      }
    });
  });
  return {packed, norm.to(storage_dtype(x, norm_dtype))};
}

at::Tensor qjl_scores_cpu(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm,
                          double scale) {
  check_qjl_scores_input(q_sketch, packed, norm);
  const at::Tensor qc = q_sketch.contiguous(), pc = packed.contiguous();
  const at::Tensor wc = cpu::qjl_weights(norm, qc.scalar_type(), scale);
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "qjl_scores_cpu", [&] {
    const auto keys = cpu::with_signs(cpu::PackedKeys<scalar_t>{}, pc, wc, qc.size(2));
    out = cpu::score_packed(keys, at::Tensor(), qc, qc.size(1), qc.options());
  });
  return out;
}

TORCH_LIBRARY_IMPL(kvstats, CPU, m) {
  m.impl("qjl_encode", &qjl_encode_cpu);
  m.impl("qjl_scores", &qjl_scores_cpu);
}

}  // namespace kvstats
