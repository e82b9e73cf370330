// The op library `kvstats`: schemas declared once, input checks shared by every backend, CPU kernels
// registered here; the CUDA kernels register the same names in csrc/cuda/*.cu. Importing kvstats._C
// only loads this library. Shapes are fixed and small in number: vectors [N, d]; score ops take
// queries [G, n_q, ·] against keys [G, n_k, ·] (G = batch × heads, flattened by kvstats/ops.py).
#include <Python.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "bitpack.h"
#include "kernels.h"

namespace kvstats {

namespace {
// Default from the environment at load (KVSTATS_SHARED_PATH=1), then kvstats.ops.shared_path().
std::atomic<bool> g_shared_path{[] {
  const char* v = std::getenv("KVSTATS_SHARED_PATH");
  return v != nullptr && std::strcmp(v, "1") == 0;
}()};
}  // namespace

bool shared_path_enabled() { return g_shared_path.load(std::memory_order_relaxed); }
void set_shared_path(bool enabled) { g_shared_path.store(enabled, std::memory_order_relaxed); }

math::Stored stored_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return math::Stored::kFloat32;
    case at::kHalf: return math::Stored::kFloat16;
    case at::kBFloat16: return math::Stored::kBFloat16;
    default: return math::Stored::kKeep;
  }
}

math::Rotation rotation_of(const at::Tensor& signs) {
  math::Rotation rot;
  rot.signs = signs.const_data_ptr();
  rot.passes = signs.size(0);
  rot.block = rot.passes > 0 ? signs.size(1) : 0;
  return rot;
}

}  // namespace kvstats

extern "C" {
// _C._set_shared_path(flag) -> the previous flag; _C._shared_path() -> the current one.
static PyObject* py_set_shared_path(PyObject*, PyObject* flag) {
  const int on = PyObject_IsTrue(flag);
  if (on < 0) return nullptr;
  const bool previous = kvstats::shared_path_enabled();
  kvstats::set_shared_path(on != 0);
  return PyBool_FromLong(previous);
}

static PyObject* py_shared_path(PyObject*, PyObject*) { return PyBool_FromLong(kvstats::shared_path_enabled()); }

// _C._sign_decode_blocked(rows, d, fp32) -> whether the CPU sign decode of those rows takes the blocked sum
// (at the current torch thread count): lets the tests check that they exercise it.
static PyObject* py_sign_decode_blocked(PyObject*, PyObject* args) {
  long long rows = 0, d = 0;
  int fp32 = 0;
  if (!PyArg_ParseTuple(args, "LLp", &rows, &d, &fp32)) return nullptr;
  return PyBool_FromLong(kvstats::sign_decode_takes_blocked_sum(fp32 ? at::kFloat : at::kDouble, rows, d));
}

// Importing kvstats._C loads the shared object, which runs the TORCH_LIBRARY static initialisers.
PyObject* PyInit__C(void) {
  static PyMethodDef methods[] = {
      {"_set_shared_path", py_set_shared_path, METH_O, "Switch the CPU ops to the shared (GPU) code path."},
      {"_shared_path", py_shared_path, METH_NOARGS, "Whether the CPU ops take the shared (GPU) code path."},
      {"_sign_decode_blocked", py_sign_decode_blocked, METH_VARARGS,
       "Whether the CPU sign decode of (rows, d, fp32) takes the blocked sum."},
      {nullptr, nullptr, 0, nullptr}};
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
  return PyModule_Create(&module_def);
}
}

namespace kvstats {
namespace {

bool is_float_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

at::ScalarType acc_dtype_of(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

void check_bits(int64_t bits, const char* op) {
  TORCH_CHECK_VALUE(bits >= 1 && bits <= 8, op, ": bits must be in [1, 8], got ", bits);
}

void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op, const char* name) {
  TORCH_CHECK_VALUE(a.device() == b.device(), op, ": ", name, " must be on ", a.device(), ", got ", b.device());
}

// signs: [passes, block] of the accumulation dtype `acc`, on `ref`'s device, for vectors of length d.
void check_rotation_signs(const at::Tensor& ref, const at::Tensor& signs, int64_t d, at::ScalarType acc,
                          const char* op) {
  check_same_device(ref, signs, op, "signs");
  TORCH_CHECK_VALUE(signs.dim() == 2, op, ": signs must be [passes, block], got ", signs.sizes());
  TORCH_CHECK_TYPE(signs.scalar_type() == acc, op, ": signs must be ", acc, ", got ", signs.scalar_type());
  const int64_t passes = signs.size(0), block = signs.size(1);
  TORCH_CHECK_VALUE(passes == 0 || passes == 1 || passes == 3, op, ": signs must have 0, 1 or 3 passes, got ", passes);
  if (passes > 0) {
    TORCH_CHECK_VALUE(block >= 1 && block <= kMaxFwhtDim && (block & (block - 1)) == 0 && block <= d &&
                    (passes == 3 || block == d) && 2 * block > d,
                op, ": rotation block ", block, " does not fit d = ", d, " with ", passes, " pass(es)");
  }
}

void check_table(const at::Tensor& ref, const at::Tensor& table, int64_t expected, const char* op,
                 const char* name) {
  check_same_device(ref, table, op, name);
  TORCH_CHECK_VALUE(table.dim() == 1 && table.size(0) == expected, op, ": ", name, " must be 1-D of length ", expected,
              ", got ", table.sizes());
  TORCH_CHECK_TYPE(table.scalar_type() == acc_dtype_of(ref), op, ": ", name, " must be ", acc_dtype_of(ref), ", got ",
              table.scalar_type());
}

void check_packed(const at::Tensor& packed, int64_t rows_dim, int64_t bits, int64_t d, const char* op) {
  TORCH_CHECK_TYPE(packed.scalar_type() == at::kByte, op, ": packed must be uint8, got ", packed.scalar_type());
  TORCH_CHECK_VALUE(packed.dim() == rows_dim, op, ": packed must have ", rows_dim, " dimensions, got ", packed.sizes());
  TORCH_CHECK_VALUE(packed.size(-1) == packed_bytes(d, bits), op, ": packed.size(-1) must be ceil(", d, "*", bits,
              "/8) = ", packed_bytes(d, bits), ", got ", packed.size(-1));
}

}  // namespace

at::ScalarType storage_dtype(const at::Tensor& x, at::ScalarType requested) {
  TORCH_CHECK_TYPE(requested == at::kFloat || requested == at::kHalf || requested == at::kBFloat16 ||
                  requested == at::kDouble,
              "norm/side dtype must be float16, bfloat16, float32 or float64, got ", requested);
  return x.scalar_type() == at::kDouble ? at::kDouble : requested;
}

void check_fwht_input(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.dim() >= 1, "fwht: x must have at least one dimension, got a 0-d tensor");
  TORCH_CHECK_TYPE(is_float_dtype(x.scalar_type()), "fwht: x must be float16, bfloat16, float32 or float64, got ",
              x.scalar_type());
  const int64_t d = x.size(-1);
  TORCH_CHECK_VALUE(d >= 2 && d <= kMaxFwhtDim && (d & (d - 1)) == 0,
              "fwht: the last dimension must be a power of two in [2, ", kMaxFwhtDim, "], got ", d);
}

void check_pack_input(const at::Tensor& codes, int64_t bits) {
  check_bits(bits, "pack_bits");
  TORCH_CHECK_VALUE(codes.dim() == 2, "pack_bits: codes must be [N, d], got ", codes.sizes());
  TORCH_CHECK_TYPE(codes.scalar_type() == at::kByte, "pack_bits: codes must be uint8, got ", codes.scalar_type());
}

void check_unpack_input(const at::Tensor& packed, int64_t bits, int64_t d) {
  check_bits(bits, "unpack_bits");
  TORCH_CHECK_VALUE(d >= 1, "unpack_bits: d must be positive, got ", d);
  check_packed(packed, 2, bits, d, "unpack_bits");
}

void check_lloyd_encode_input(const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds,
                              int64_t bits) {
  check_bits(bits, "lloyd_encode");
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) >= 2, "lloyd_encode: x must be [N, d] with d >= 2, got ", x.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(x.scalar_type()), "lloyd_encode: x must be a float tensor, got ", x.scalar_type());
  check_rotation_signs(x, signs, x.size(1), acc_dtype_of(x), "lloyd_encode");
  check_table(x, thresholds, (int64_t{1} << bits) - 1, "lloyd_encode", "thresholds");
}

void check_lloyd_decode_input(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                              const at::Tensor& levels, int64_t bits, int64_t d) {
  check_bits(bits, "lloyd_decode");
  TORCH_CHECK_VALUE(d >= 2, "lloyd_decode: d must be >= 2, got ", d);
  check_packed(packed, 2, bits, d, "lloyd_decode");
  check_same_device(packed, norm, "lloyd_decode", "norm");
  TORCH_CHECK_VALUE(norm.dim() == 1 && norm.size(0) == packed.size(0), "lloyd_decode: norm must be [", packed.size(0),
              "], got ", norm.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(norm.scalar_type()), "lloyd_decode: norm must be a float tensor, got ", norm.scalar_type());
  TORCH_CHECK_TYPE(levels.scalar_type() == at::kFloat || levels.scalar_type() == at::kDouble,
              "lloyd_decode: levels must be float32 or float64, got ", levels.scalar_type());
  check_same_device(packed, levels, "lloyd_decode", "levels");
  TORCH_CHECK_VALUE(levels.dim() == 1 && levels.size(0) == (int64_t{1} << bits), "lloyd_decode: levels must have ",
              (int64_t{1} << bits), " entries, got ", levels.sizes());
  check_rotation_signs(packed, signs, d, levels.scalar_type(), "lloyd_decode");
}

void check_lloyd_scores_input(const at::Tensor& q, const at::Tensor& packed, const at::Tensor& norm,
                              const at::Tensor& levels, int64_t bits) {
  check_bits(bits, "lloyd_scores");
  TORCH_CHECK_VALUE(q.dim() == 3, "lloyd_scores: q must be [G, n_q, d], got ", q.sizes());
  TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "lloyd_scores: q must be float32 or float64, got ", q.scalar_type());
  check_packed(packed, 3, bits, q.size(2), "lloyd_scores");
  check_same_device(q, packed, "lloyd_scores", "packed");
  check_same_device(q, norm, "lloyd_scores", "norm");
  TORCH_CHECK_VALUE(packed.size(0) == q.size(0), "lloyd_scores: packed.size(0) must equal q.size(0) = ", q.size(0),
              ", got ", packed.size(0));
  TORCH_CHECK_VALUE(norm.dim() == 2 && norm.size(0) == packed.size(0) && norm.size(1) == packed.size(1),
              "lloyd_scores: norm must be [G, n_k] = ", packed.sizes().slice(0, 2), ", got ", norm.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(norm.scalar_type()), "lloyd_scores: norm must be a float tensor, got ", norm.scalar_type());
  check_table(q, levels, int64_t{1} << bits, "lloyd_scores", "levels");
}

void check_qjl_encode_input(const at::Tensor& x, const at::Tensor& sketch) {
  TORCH_CHECK_VALUE(x.dim() == 2, "qjl_encode: x must be [N, d], got ", x.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(x.scalar_type()), "qjl_encode: x must be a float tensor, got ", x.scalar_type());
  check_same_device(x, sketch, "qjl_encode", "sketch");
  TORCH_CHECK_VALUE(sketch.dim() == 2 && sketch.size(1) == x.size(1), "qjl_encode: sketch must be [m, ", x.size(1),
              "], got ", sketch.sizes());
  TORCH_CHECK_TYPE(sketch.scalar_type() == acc_dtype_of(x), "qjl_encode: sketch must be ", acc_dtype_of(x), ", got ",
              sketch.scalar_type());
}

void check_qjl_scores_input(const at::Tensor& q_sketch, const at::Tensor& packed, const at::Tensor& norm) {
  TORCH_CHECK_VALUE(q_sketch.dim() == 3, "qjl_scores: q_sketch must be [G, n_q, m], got ", q_sketch.sizes());
  TORCH_CHECK_TYPE(q_sketch.scalar_type() == at::kFloat || q_sketch.scalar_type() == at::kDouble,
              "qjl_scores: q_sketch must be float32 or float64, got ", q_sketch.scalar_type());
  check_packed(packed, 3, 1, q_sketch.size(2), "qjl_scores");
  check_same_device(q_sketch, packed, "qjl_scores", "packed");
  check_same_device(q_sketch, norm, "qjl_scores", "norm");
  TORCH_CHECK_VALUE(packed.size(0) == q_sketch.size(0), "qjl_scores: packed.size(0) must equal q_sketch.size(0) = ",
              q_sketch.size(0), ", got ", packed.size(0));
  TORCH_CHECK_VALUE(norm.dim() == 2 && norm.size(0) == packed.size(0) && norm.size(1) == packed.size(1),
              "qjl_scores: norm must be [G, n_k] = ", packed.sizes().slice(0, 2), ", got ", norm.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(norm.scalar_type()), "qjl_scores: norm must be a float tensor, got ", norm.scalar_type());
}

void check_turbo_prod_encode_input(const at::Tensor& x, const at::Tensor& signs, const at::Tensor& thresholds,
                                   const at::Tensor& levels, int64_t bits, const at::Tensor& sketch) {
  check_lloyd_encode_input(x, signs, thresholds, bits);
  check_qjl_encode_input(x, sketch);
  TORCH_CHECK_VALUE(levels.dim() == 1 && levels.size(0) == (int64_t{1} << bits),
                    "turbo_prod_encode: levels must be 1-D of length ", int64_t{1} << bits, ", got ", levels.sizes());
  TORCH_CHECK_TYPE(levels.scalar_type() == thresholds.scalar_type(), "turbo_prod_encode: levels must be ",
                   thresholds.scalar_type(), ", got ", levels.scalar_type());
}

void check_turbo_prod_scores_input(const at::Tensor& q, const at::Tensor& q_sketch, const at::Tensor& packed,
                                   const at::Tensor& norm, const at::Tensor& levels, int64_t bits,
                                   const at::Tensor& signs_packed, const at::Tensor& gamma) {
  check_lloyd_scores_input(q, packed, norm, levels, bits);
  check_qjl_scores_input(q_sketch, signs_packed, gamma);
  TORCH_CHECK_VALUE(q_sketch.size(0) == q.size(0) && q_sketch.size(1) == q.size(1) && signs_packed.size(1) == packed.size(1),
              "turbo_prod_scores: q_sketch [G, n_q, m] and signs_packed [G, n_k, m/8] must match q and packed");
  TORCH_CHECK_TYPE(q_sketch.scalar_type() == q.scalar_type(), "turbo_prod_scores: q_sketch must have q's dtype");
}

void check_sign_decode_input(const at::Tensor& packed, const at::Tensor& tables, const at::Tensor& weight,
                             const std::optional<at::Tensor>& base) {
  TORCH_CHECK_TYPE(packed.scalar_type() == at::kByte, "sign_decode: packed must be uint8, got ", packed.scalar_type());
  TORCH_CHECK_VALUE(packed.dim() == 2 && packed.size(1) >= 1, "sign_decode: packed must be [N, mb] with mb >= 1, got ",
                    packed.sizes());
  check_same_device(packed, tables, "sign_decode", "tables");
  TORCH_CHECK_TYPE(tables.scalar_type() == at::kFloat || tables.scalar_type() == at::kDouble,
                   "sign_decode: tables must be float32 or float64, got ", tables.scalar_type());
  TORCH_CHECK_VALUE(tables.dim() == 2 && tables.size(0) == packed.size(1) * 256 && tables.size(1) >= 1,
                    "sign_decode: tables must be [256 * packed.size(1), d] = [", packed.size(1) * 256, ", d], got ",
                    tables.sizes());
  check_same_device(packed, weight, "sign_decode", "weight");
  TORCH_CHECK_TYPE(is_float_dtype(weight.scalar_type()), "sign_decode: weight must be a float tensor, got ",
                   weight.scalar_type());
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == packed.size(0), "sign_decode: weight must be [",
                    packed.size(0), "], got ", weight.sizes());
  if (base.has_value()) {
    check_same_device(packed, *base, "sign_decode", "base");
    TORCH_CHECK_TYPE(base->scalar_type() == tables.scalar_type(), "sign_decode: base must be ", tables.scalar_type(),
                     ", got ", base->scalar_type());
    TORCH_CHECK_VALUE(base->dim() == 2 && base->size(0) == packed.size(0) && base->size(1) == tables.size(1),
                      "sign_decode: base must be [", packed.size(0), ", ", tables.size(1), "], got ", base->sizes());
  }
}

void check_turbo_prod_decode_input(const at::Tensor& packed, const at::Tensor& norm, const at::Tensor& signs,
                                   const at::Tensor& levels, int64_t bits, int64_t d, const at::Tensor& signs_packed,
                                   const at::Tensor& tables, const at::Tensor& weight) {
  check_lloyd_decode_input(packed, norm, signs, levels, bits, d);
  check_sign_decode_input(signs_packed, tables, weight, std::nullopt);
  check_same_device(packed, signs_packed, "turbo_prod_decode", "signs_packed");
  TORCH_CHECK_VALUE(signs_packed.size(0) == packed.size(0), "turbo_prod_decode: signs_packed must have ",
                    packed.size(0), " rows (as packed), got ", signs_packed.size(0));
  TORCH_CHECK_TYPE(tables.scalar_type() == levels.scalar_type(), "turbo_prod_decode: tables must be ",
                   levels.scalar_type(), " (as levels), got ", tables.scalar_type());
  TORCH_CHECK_VALUE(tables.size(1) == d, "turbo_prod_decode: tables must have d = ", d, " columns, got ",
                    tables.size(1));
}

void check_minmax_encode_input(const at::Tensor& x, int64_t group, int64_t bits) {
  check_bits(bits, "minmax_encode");
  TORCH_CHECK_VALUE(x.dim() == 2, "minmax_encode: x must be [N, d], got ", x.sizes());
  TORCH_CHECK_TYPE(is_float_dtype(x.scalar_type()), "minmax_encode: x must be a float tensor, got ", x.scalar_type());
  TORCH_CHECK_VALUE(group >= 1 && x.size(1) % group == 0, "minmax_encode: group must divide d = ", x.size(1), ", got ",
              group);
}

void check_minmax_decode_input(const at::Tensor& packed, const at::Tensor& lo, const at::Tensor& scale,
                               int64_t group, int64_t bits, int64_t d) {
  check_bits(bits, "minmax_decode");
  TORCH_CHECK_VALUE(group >= 1 && d % group == 0, "minmax_decode: group must divide d = ", d, ", got ", group);
  check_packed(packed, 2, bits, d, "minmax_decode");
  for (const at::Tensor* t : {&lo, &scale}) {
    check_same_device(packed, *t, "minmax_decode", "lo/scale");
    TORCH_CHECK_VALUE(t->dim() == 2 && t->size(0) == packed.size(0) && t->size(1) == d / group,
                "minmax_decode: lo and scale must be [", packed.size(0), ", ", d / group, "], got ", t->sizes());
    TORCH_CHECK_TYPE(is_float_dtype(t->scalar_type()), "minmax_decode: lo and scale must be float tensors, got ", t->scalar_type());
  }
}

TORCH_LIBRARY(kvstats, m) {
  // Orthonormal Walsh–Hadamard transform along the last axis: y = x · H_d / sqrt(d).
  m.def("fwht(Tensor x) -> Tensor");
  // Dense bit packing of codes [N, d] (uint8 < 2^bits) into [N, ceil(d*bits/8)], and back.
  m.def("pack_bits(Tensor codes, int bits) -> Tensor");
  m.def("unpack_bits(Tensor packed, int bits, int d) -> Tensor");
  // Rotation + Lloyd–Max: (packed cell indices of (Pi x)/|x|, |x| in norm_dtype).
  m.def("lloyd_encode(Tensor x, Tensor signs, Tensor thresholds, int bits, ScalarType norm_dtype) -> (Tensor, Tensor)");
  // x_hat = Pi^T (|x| * levels[idx]), in the accumulation dtype.
  m.def("lloyd_decode(Tensor packed, Tensor norm, Tensor signs, Tensor levels, int bits, int d) -> Tensor");
  // scores[g, i, j] = norm[g, j] * sum_t q[g, i, t] * levels[idx[g, j, t]]   (q already rotated).
  m.def("lloyd_scores(Tensor q, Tensor packed, Tensor norm, Tensor levels, int bits) -> Tensor");
  // QJL: (packed sign(S x), |x| in norm_dtype).
  m.def("qjl_encode(Tensor x, Tensor sketch, ScalarType norm_dtype) -> (Tensor, Tensor)");
  // scores[g, i, j] = scale * norm[g, j] * <q_sketch[g, i], b[g, j]>, b = +-1 signs.
  m.def("qjl_scores(Tensor q_sketch, Tensor packed, Tensor norm, float scale) -> Tensor");
  // TurboQuant_prod: (packed (bits)-bit MSE indices, |x|, packed sign(S r), gamma = |r|), r the rotated residual.
  m.def(
      "turbo_prod_encode(Tensor x, Tensor signs, Tensor thresholds, Tensor levels, int bits, Tensor sketch, "
      "ScalarType norm_dtype) -> (Tensor, Tensor, Tensor, Tensor)");
  // lloyd_scores(q, ...) + qjl_scores(q_sketch, ...) in one pass over the keys.
  m.def(
      "turbo_prod_scores(Tensor q, Tensor q_sketch, Tensor packed, Tensor norm, Tensor levels, int bits, "
      "Tensor signs_packed, Tensor gamma, float scale) -> Tensor");
  // Sign decode from byte tables: out[n] = base[n] + weight[n] * sum_p tables[256 p + packed[n, p]]
  // (base absent: 0); B^T b of QJL signs with tables = kvstats.ops.sign_tables(B).
  m.def("sign_decode(Tensor packed, Tensor tables, Tensor weight, Tensor? base) -> Tensor");
  // TurboQuant_prod decode in one pass: sign_decode(signs_packed, tables, weight, lloyd_decode(packed, ...)),
  // tables of S·Pi, so that the sum is Pi^T(|x|·levels[idx] + weight·S^T b).
  m.def(
      "turbo_prod_decode(Tensor packed, Tensor norm, Tensor signs, Tensor levels, int bits, int d, "
      "Tensor signs_packed, Tensor tables, Tensor weight) -> Tensor");
  // Min-max: (packed codes, lo [N, d/group], scale [N, d/group]) in side_dtype.
  m.def("minmax_encode(Tensor x, int group, int bits, ScalarType side_dtype) -> (Tensor, Tensor, Tensor)");
  m.def("minmax_decode(Tensor packed, Tensor lo, Tensor scale, int group, int bits, int d) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvstats, CPU, m) {
  m.impl("fwht", &fwht_cpu);
  m.impl("pack_bits", &pack_bits_cpu);
  m.impl("unpack_bits", &unpack_bits_cpu);
  m.impl("lloyd_encode", &lloyd_encode_cpu);
  m.impl("lloyd_decode", &lloyd_decode_cpu);
  m.impl("lloyd_scores", &lloyd_scores_cpu);
  m.impl("qjl_encode", &qjl_encode_cpu);
  m.impl("qjl_scores", &qjl_scores_cpu);
  m.impl("turbo_prod_encode", &turbo_prod_encode_cpu);
  m.impl("turbo_prod_scores", &turbo_prod_scores_cpu);
  m.impl("sign_decode", &sign_decode_cpu);
  m.impl("turbo_prod_decode", &turbo_prod_decode_cpu);
  m.impl("minmax_encode", &minmax_encode_cpu);
  m.impl("minmax_decode", &minmax_decode_cpu);
}

}  // namespace kvstats
