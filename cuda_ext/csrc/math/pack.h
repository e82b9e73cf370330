// Packing one row of codes, split over the lanes (layout: bitpack.h).
#pragma once

#include <cstdint>

#include "../bitpack.h"
#include "scalar.h"

namespace kvstats {
namespace math {

// ----------------------------------------------------------------------------------------- packing
// Bytes [0, ceil(d·bits/8)) of a packed row from code_at(i), split over the lanes (no two lanes write
// one byte, so no atomics).
KVSTATS_HD_TEMPLATE
template <typename CodeAt, typename Lanes>
KVSTATS_HD void pack_row(const CodeAt& code_at, int64_t d, int64_t bits, uint8_t* out, const Lanes& lanes) {
  const int64_t nb = packed_bytes(d, bits);
  for (int64_t k = lanes.id(); k < nb; k += lanes.count()) out[k] = pack_byte(code_at, d, bits, k);
}

}  // namespace math
}  // namespace kvstats
