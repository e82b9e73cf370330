// fp32 row helpers shared by several CPU kernels, each compiled twice (baseline ISA and AVX2) with
// KVSTATS_SIMD_CLONES; the loader picks the copy the CPU runs.
#include "common_cpu.h"

namespace kvstats {
namespace cpu {

KVSTATS_SIMD_CLONES void pack_signs_f32(const float* proj, int64_t m, uint8_t* out) { pack_signs(proj, m, out); }

KVSTATS_SIMD_CLONES void decode_signs_f32(const uint8_t* row, int64_t m, float w, float* out) {
  decode_signs(row, m, w, out);
}

}  // namespace cpu
}  // namespace kvstats
