// The fp32 many-query score kernels (score_adc.h), each compiled twice (baseline ISA and AVX2) with
// KVSTATS_SIMD_CLONES; the loader picks the copy the CPU runs.
#include "score_adc.h"

namespace kvstats {
namespace cpu {

KVSTATS_SIMD_CLONES void adc_build_f32(const AdcLayout& L, int64_t nqb, const float* qT, const float* qsT,
                                       const float* levels, float* table) {
  adc_build_any<float>(L, nqb, qT, qsT, levels, table);
}

KVSTATS_SIMD_CLONES void adc_run_f32(const AdcTask<float>& t) { adc_run_any<float>(t); }

}  // namespace cpu
}  // namespace kvstats
