// The op library's schemas, declared once: both namespaces that implement them call define_ops — `kvstats`
// (the CPU fast kernels, cpu/, and the CUDA kernels, cuda/) and `kvstats_shared` (the GPU's row programs run on
// the CPU, shared/). Each family's schemas sit beside its checks and prologues in prologue/<family>.h
// (decode_attention's in decode_attention.h), as each family's fakes sit in its module of kvstats/quant/ops.
// Shapes are fixed and small in number: vectors [N, d]; score ops take queries [G, n_q, ·] against keys
// [G, n_k, ·] (G = batch × heads, flattened by kvstats/quant/ops). Adding an op: docs/kernels.md.
#pragma once

#include <torch/library.h>

#include "decode_attention.h"
#include "prologue/fwht.h"
#include "prologue/lloyd.h"
#include "prologue/minmax.h"
#include "prologue/pack.h"
#include "prologue/qjl.h"
#include "prologue/sign_decode.h"
#include "prologue/turbo_prod.h"

namespace kvstats {

inline void define_ops(torch::Library& m) {
  define_fwht_ops(m);
  define_pack_ops(m);
  define_lloyd_ops(m);
  define_qjl_ops(m);
  define_turbo_prod_ops(m);
  define_sign_decode_ops(m);
  define_minmax_ops(m);
  define_decode_attention_ops(m);
}

}  // namespace kvstats
