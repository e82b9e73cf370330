// Lanes: the threads that cooperate on one row. A row program is written for a group of `Lanes`: lane i
// of n handles elements i, i + n, ...; `sync()` is a barrier and `sum`/`max` are reductions whose result
// every lane receives. CUDA instantiates them with the threads of a block (cuda/device_utils.cuh:
// BlockLanes); the CPU's shared backend (shared/) with the one serial lane below.
#pragma once

#include "../bitpack.h"

namespace kvstats {
namespace math {

// ----------------------------------------------------------------------------- serial lanes (CPU)
// One lane: the CPU's shared path runs the row programs above exactly as one GPU thread block would,
// with the block's threads replaced by a sequential loop.
struct SerialLanes {
  KVSTATS_HD int64_t id() const { return 0; }
  KVSTATS_HD int64_t count() const { return 1; }
  KVSTATS_HD void sync() const {}
  template <typename T>
  KVSTATS_HD T sum(T v) const {
    return v;
  }
  template <typename T>
  KVSTATS_HD T max(T v) const {
    return v;
  }
};

}  // namespace math
}  // namespace kvstats
