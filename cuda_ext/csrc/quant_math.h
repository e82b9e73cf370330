// The arithmetic of every kvstats kernel, written once for the CPU and the GPU.
//
// Everything here is KVSTATS_HD (`__host__ __device__` under nvcc, plain `inline` otherwise): the CPU
// kernels (csrc/cpu) and the CUDA kernels (csrc/cuda) both include this header and call it, so the CPU
// test suite runs the very lines the GPU runs. What stays in the backend files is the mapping only:
// threads, blocks, shared memory and warp reductions on CUDA; loops, SIMD twins and OpenMP on the CPU.
//
// Row programs (encode_lloyd_row, decode_lloyd_row, fwht_row, ...) are written for a group of `Lanes`
// that cooperate on one row: lane i of n handles elements i, i + n, ...; `sync()` is a barrier and
// `sum`/`max` are reductions whose result every lane receives. CUDA instantiates them with the threads
// of a block (csrc/cuda/device_utils.cuh: BlockLanes); the CPU's shared path with one serial lane
// (math/lanes.h: SerialLanes), which is the GPU's code path run on the CPU (the kvstats_shared backend,
// kvstats.ops.shared_path()).
//
// One header per concern in math/; this one includes them all.
#pragma once

#include "math/scalar.h"
#include "math/lanes.h"
#include "math/signs.h"
#include "math/minmax.h"
#include "math/wht.h"
#include "math/pack.h"
#include "math/lloyd.h"
#include "math/scores.h"
#include "math/weighted.h"
