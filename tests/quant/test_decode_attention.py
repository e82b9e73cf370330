"""decode_attention: one decode step of attention from the codes in one call (kvstats.ops.decode_attention,
cuda_ext/csrc/decode_attention.cpp), and the cache's decode step that runs it (KVStatsLayer._attend_fused).

* Against a float64 oracle built from the codes' definitions alone (k̂ = Πᵀ(‖k‖·levels[idx] + c·γ·Sᵀb), dense
  softmax attention in float64), within a bound derived from fp32 summation: every K and V part the op reads
  (Lloyd codes with and without the rotation, Lloyd + QJL signs, signs alone), code widths 1–6 (row and table
  kernels), 1–9 queries per group, soft capping, sinks, codes ahead of the quantized keys, an empty window.
* The fused kernel equals the same ops called one by one (decode_attention_unfused), bit for bit, on the fast
  kernels and on the shared backend (the CUDA registration's ops), and does not depend on the thread count.
* Bad arguments are refused by name, alike by the kernel, the shared backend, the reference and on meta tensors.
* The cache: a decode step takes the op where it can (kv, kqv, qkqv), and returns the general path's outputs and
  weights bit for bit (GQA 1, 3 and 8, batch 2, fp16/bf16/fp32/fp64, W = 0, sinks, soft capping); it falls back
  to the separate ops (the same numbers) with a mask, a sliding window, dropout, a quantizer the op cannot read or
  a subclass with an estimator of its own; greedy generation of a tiny Llama gives the same logits either way.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from kvstats.quant import ops
from kvstats.quant.codebooks import beta_codebook
from kvstats.quant.ops import CodeParts
from kvstats.quant.rotations import RandomizedHadamard

pytestmark = [pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvstats._C not built"),
              pytest.mark.usefixtures("one_thread")]

EPS = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}


def _parts(kind: str, groups: int, n_k: int, d: int, bits: int, m: int, seed: int, dtype, rotate: bool) -> CodeParts:
    """Random codes of one side: ``lloyd`` (Lloyd codes), ``prod`` (Lloyd codes + QJL signs, turbo_prod) or ``qjl``
    (signs alone); norms stored in fp16 for odd seeds (the kernels widen them)."""
    gen = torch.Generator().manual_seed(seed)
    norm_dtype = torch.float16 if seed % 2 else dtype
    fields = {"rotation": RandomizedHadamard(d, seed).signs_matrix(torch.device("cpu"), dtype)[0] if rotate else None}
    if kind in ("lloyd", "prod"):
        codes = torch.randint(0, 1 << bits, (groups * n_k, d), generator=gen, dtype=torch.uint8)
        fields.update(packed=ops.pack_bits_reference(codes, bits).reshape(groups, n_k, -1),
                      norm=(torch.rand(groups, n_k, generator=gen, dtype=torch.float64) + 0.5).to(norm_dtype),
                      levels=torch.tensor(beta_codebook(d, bits).levels, dtype=dtype), bits=bits)
    if kind in ("prod", "qjl"):
        signs = torch.randint(0, 2, (groups * n_k, m), generator=gen, dtype=torch.uint8)
        fields.update(sketch=torch.randn(m, d, generator=gen, dtype=torch.float64).to(dtype) / math.sqrt(d),
                      signs=ops.pack_bits_reference(signs, 1).reshape(groups, n_k, -1),
                      sign_norm=(torch.rand(groups, n_k, generator=gen, dtype=torch.float64) * 0.3).to(norm_dtype),
                      sign_scale=math.sqrt(math.pi / 2) / m)
    return CodeParts(**fields)


def _dense(p: CodeParts, d: int) -> torch.Tensor:
    """x̂ [G, n_k, d] in float64 from the definitions: Πᵀ(‖x‖·levels[idx] + c·γ·Sᵀ b), Π = H·diag(s)/√d."""
    x = 0.0
    if p.packed is not None:
        g, n_k, nb = p.packed.shape
        idx = ops.unpack_bits_reference(p.packed.reshape(-1, nb), p.bits, d).reshape(g, n_k, d).long()
        x = p.levels.double()[idx] * p.norm.double().unsqueeze(-1)
    if p.sketch is not None:
        g, n_k, mb = p.signs.shape
        m = p.sketch.shape[0]
        b = ops.unpack_bits_reference(p.signs.reshape(-1, mb), 1, m).reshape(g, n_k, m).double() * 2 - 1
        x = x + p.sign_scale * p.sign_norm.double().unsqueeze(-1) * (b @ p.sketch.double())
    if p.rotation is not None:  # Πᵀ y = diag(s) H y / √d; rows: (y H / √d) · s
        h = torch.from_numpy(scipy.linalg.hadamard(d).astype(np.float64) / math.sqrt(d))
        x = (x @ h) * p.rotation.double()
    return x


def _oracle(q, win_k, win_v, n_code, scaling, softcap, sinks, k: CodeParts, v: CodeParts):
    """(out, weights, logit bound): float64 attention over the decoded keys and values, and a bound on the fp32
    logit error, scaling · (terms + 2) · eps · Σ|q_t · k_t| (each score sums d terms, or d + m with signs)."""
    d = q.shape[-1]
    q64 = q.double()
    keys, values = [win_k.double()], [win_v.double()]
    if n_code:
        keys.insert(0, _dense(k, d)[:, :n_code])
        values.insert(0, _dense(v, d)[:, :n_code])
    k_all, v_all = torch.cat(keys, 1), torch.cat(values, 1)
    logits = q64 @ k_all.transpose(-1, -2) * scaling
    terms = d + (k.sketch.shape[0] if k.sketch is not None else 0)
    bound = scaling * (terms + 2) * EPS[q.dtype] * (q64.abs() @ k_all.abs().transpose(-1, -2)).amax().item()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if sinks is not None:
        weights = torch.softmax(torch.cat([logits, sinks.double().unsqueeze(-1)], -1), -1)[..., :-1]
    else:
        weights = torch.softmax(logits, -1)
    return weights @ v_all, weights, bound, v_all.abs().amax().item()


def _case(k_kind, v_kind, bits, nq, d, dtype, *, n_k=37, ahead=3, window=5, softcap=None, sinks=False, seed=0):
    gen = torch.Generator().manual_seed(1000 + seed)
    groups, m = 3, d + 8
    rotate = d & (d - 1) == 0
    q = (torch.randn(groups, nq, d, generator=gen, dtype=torch.float64) * 2).to(dtype)
    win_k = torch.randn(groups, window, d, generator=gen, dtype=torch.float64).to(dtype)
    win_v = torch.randn(groups, window, d, generator=gen, dtype=torch.float64).to(dtype)
    k = _parts(k_kind, groups, n_k, d, bits, m, 10 + seed, dtype, rotate)
    v = _parts(v_kind, groups, n_k, d, bits, m, 20 + seed, dtype, rotate and seed % 2 == 0)
    s = torch.randn(groups, nq, generator=gen, dtype=torch.float64).to(dtype) if sinks else None
    return (q, win_k, win_v, n_k - ahead, d ** -0.5, softcap, s), k, v


KINDS = [("lloyd", "lloyd"), ("lloyd", "prod"), ("prod", "prod"), ("qjl", "qjl"), ("prod", "qjl"), ("qjl", "lloyd")]


@pytest.mark.parametrize("k_kind,v_kind", KINDS)
@pytest.mark.parametrize("bits,nq,d,dtype", [(1, 1, 16, torch.float32), (2, 3, 64, torch.float32),
                                             (3, 8, 24, torch.float32), (4, 3, 64, torch.float32),
                                             (6, 9, 32, torch.float32), (3, 3, 16, torch.float64)])
def test_the_op_matches_a_float64_oracle_from_the_codes_definitions(k_kind, v_kind, bits, nq, d, dtype):
    """Weights within 2·B + 8·eps of the oracle's (B: the logit bound; softmax moves a weight by at most w·2·max|δl|)
    and the output within that times Σ|v| plus the fp32 rounding of its own sums."""
    seed = bits * 7 + nq
    for extra in ({}, {"softcap": 5.0, "sinks": True}, {"ahead": 0, "window": 0}):
        args, k, v = _case(k_kind, v_kind, bits, nq, d, dtype, seed=seed, **extra)
        out, weights = ops.decode_attention(*args, *k, *v)
        o_ref, w_ref, bound, v_max = _oracle(*args, k, v)
        eps = EPS[dtype]
        w_tol = 2 * bound + 8 * eps
        keys = w_ref.shape[-1]
        assert (weights.double() - w_ref).abs().max().item() <= w_tol, extra
        o_tol = keys * w_tol * v_max + (keys + 4) * eps * v_max * 4
        assert (out.double() - o_ref).abs().max().item() <= o_tol, extra
        assert out.dtype == dtype and weights.shape == (3, nq, args[3] + args[1].shape[1])


@pytest.mark.parametrize("k_kind,v_kind", KINDS)
@pytest.mark.parametrize("shared", [False, True])
def test_the_fused_kernel_is_the_separate_ops_bit_for_bit(k_kind, v_kind, shared):
    """The composition in C++ calls the ops the unfused path calls, in its order: the same numbers on the fast kernels
    and on the shared backend (whose ops are the ones the CUDA registration calls)."""
    for bits, nq, d, extra in ((4, 3, 64, {}), (3, 8, 16, {"softcap": 20.0}), (1, 1, 32, {"sinks": True}),
                               (5, 9, 24, {"ahead": 0}), (2, 2, 64, {"ahead": 0, "window": 0})):
        args, k, v = _case(k_kind, v_kind, bits, nq, d, torch.float32, seed=bits, **extra)
        with ops.shared_path(shared):
            fused = torch.ops.kvstats_shared.decode_attention.default if shared else \
                torch.ops.kvstats.decode_attention.default
            got = fused(*args, *k, *v)
            want = ops.decode_attention_unfused(*args, k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (bits, nq, d, extra)


def test_the_result_does_not_depend_on_the_thread_count():
    args, k, v = _case("prod", "prod", 3, 3, 64, torch.float32, n_k=700)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(ops.decode_attention(*args, *k, *v))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.slow
def test_opcheck_and_inference_mode():
    args, k, v = _case("lloyd", "prod", 4, 3, 64, torch.float32, sinks=True, softcap=10.0)
    torch.library.opcheck(torch.ops.kvstats.decode_attention.default, (*args, *k, *v))
    with torch.inference_mode():
        inside = ops.decode_attention(*args, *k, *v)
    outside = ops.decode_attention(*args, *k, *v)
    assert torch.equal(inside[0], outside[0]) and torch.equal(inside[1], outside[1])


def _bad_cases():
    """(what to change, the message): each malformed argument of a well-formed call."""
    (q, win_k, win_v, n_code, scaling, softcap, sinks), k, v = _case("prod", "prod", 3, 3, 16, torch.float32)
    good = [q, win_k, win_v, n_code, scaling, softcap, sinks, *k, *v]

    def with_(**changes):
        names = ["q", "win_k", "win_v", "n_code", "scaling", "softcap", "sinks"] + \
                [f"k_{f}" for f in CodeParts._fields] + [f"v_{f}" for f in CodeParts._fields]
        return [changes.get(n, a) for n, a in zip(names, good)]

    return [
        (with_(q=q[0]), ValueError, r"q must be \[G, n_q, d\]"),
        (with_(q=q.half(), win_k=win_k.half(), win_v=win_v.half()), TypeError,
         "q must be (torch.)?float32 or (torch.)?float64"),
        (with_(win_k=win_k[:, :, :8]), ValueError, r"win_k must be \[3, w, 16\]"),
        (with_(win_v=win_v.double()), TypeError, "win_v must be torch.float32|win_v must be Float"),
        (with_(win_v=win_v[:, :2]), ValueError, "win_k and win_v must hold the same tokens"),
        (with_(n_code=-1), ValueError, "n_code must be >= 0"),
        (with_(n_code=40), ValueError, r"k_packed must be \[3, n_k >= n_code = 40"),
        (with_(scaling=float("nan")), ValueError, "scaling must be finite"),
        (with_(scaling=1e300), ValueError, r"scaling must be finite in (torch\.float32|Float).*got 1e\+300"),
        (with_(softcap=-1.0), ValueError, "softcap must be a finite positive number"),
        (with_(sinks=torch.zeros(3, 2)), ValueError, r"sinks must be \[3, 3\]"),
        (with_(k_norm=None), ValueError, "k_packed, k_norm and k_levels must be given together"),
        (with_(v_signs=None), ValueError, "v_sketch, v_signs and v_sign_norm must be given together"),
        (with_(k_packed=None, k_norm=None, k_levels=None, k_sketch=None, k_signs=None, k_sign_norm=None),
         ValueError, "n_code = 34 keys need the k codes"),
        (with_(k_rotation=torch.ones(8)), ValueError, r"k_rotation must be \[16\]"),
        (with_(v_sketch=torch.randn(24, 8)), ValueError, r"v_sketch must be \[m, 16\]"),
        (with_(v_signs=v.signs[:, :35], v_sign_norm=v.sign_norm[:, :35]), ValueError,
         "v_packed and v_signs must hold the same keys"),
        (with_(win_k=win_k[:, :0], win_v=win_v[:, :0], n_code=0), ValueError, "a step needs at least one key"),
        (with_(k_levels=k.levels[:4]), ValueError, r"k_levels must be 1-D of length 2\^k_bits = 8"),
        (with_(k_levels=k.levels.double()), TypeError, "k_levels must be"),
        (with_(v_bits=0), ValueError, r"v_bits must be in \[1, 8\], got 0"),
        (with_(k_norm=k.norm[:, :5]), ValueError, r"k_norm must be \[3, 37\] \(one per key of k_packed\)"),
        (with_(v_sign_norm=v.sign_norm.long()), TypeError, "v_sign_norm must be a float tensor"),
        (with_(k_packed=k.packed.float()), TypeError, "k_packed must be (torch.)?uint8|k_packed must be Byte"),
        (with_(v_signs=v.signs[..., :1]), ValueError, r"v_signs must be \[3, n_k >= n_code = 34, 3\]"),
        (with_(k_sign_scale=float("inf")), ValueError, "k_sign_scale must be finite"),
    ]


@pytest.mark.parametrize("path", ["kernel", "shared", "reference", "unfused"])
def test_non_finite_sinks_and_overflowing_steps_are_refused_not_returned(path):
    """What the meta path cannot see (values): sinks that are not finite, and a step whose logits overflow fp32 from
    finite inputs — refused by name instead of a NaN output (the cache refused such outputs; direct callers got
    them)."""
    (q, win_k, win_v, n_code, scaling, softcap, _), k, v = _case("prod", "prod", 3, 3, 16, torch.float32,
                                                                 sinks=True)
    call = {"kernel": torch.ops.kvstats.decode_attention.default,
            "shared": torch.ops.kvstats_shared.decode_attention.default,
            "reference": ops.decode_attention_reference,
            "unfused": lambda *a: ops.decode_attention_unfused(*a[:7], CodeParts(*a[7:16]), CodeParts(*a[16:]))}[path]
    for bad in (float("inf"), float("-inf"), float("nan")):
        sinks = torch.zeros(3, 3)
        sinks[1, 2] = bad
        with pytest.raises(ValueError, match=r"sinks must be finite, got (-?inf|nan)"):
            call(q, win_k, win_v, n_code, scaling, softcap, sinks, *k, *v)
    with pytest.raises(ValueError, match="the output is not finite"):  # |q·k| ~ 1e37, scaled by 1e30: beyond fp32
        call(q * 1e18, win_k * 1e18, win_v, n_code, 1e30, None, None, *k, *v)


@pytest.mark.parametrize("path", ["kernel", "shared", "reference", "meta"])
def test_bad_arguments_are_refused_by_name_on_every_path(path):
    for args, error, message in _bad_cases():
        with pytest.raises(error, match=message):
            if path == "kernel":
                torch.ops.kvstats.decode_attention.default(*args)
            elif path == "shared":
                torch.ops.kvstats_shared.decode_attention.default(*args)
            elif path == "reference":
                ops.decode_attention_reference(*args)
            else:
                ops.decode_attention(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])


# ---------------------------------------------------------------------------------------------------- the cache

transformers = pytest.importorskip("transformers", reason="the [models] extra (transformers) is not installed")

from kvstats.hf.cache import KVStatsCache, KVStatsLayer, cache_kwargs, use_estimator_attention  # noqa: E402
from kvstats.hf.logit_rules import LogitRules  # noqa: E402
from kvstats.quant.schemes import Scheme, scheme  # noqa: E402


@pytest.fixture
def fused_calls(monkeypatch):
    """The decode steps that ran the fused op (each call's key count)."""
    import kvstats.hf.code_attention as code_attention

    calls = []
    real = ops.decode_attention

    def counting(*args):
        calls.append(args[3])
        return real(*args)

    monkeypatch.setattr(code_attention.ops, "decode_attention", counting)
    return calls


def _steps(layers, hq, hkv, d, dtype, batch=1, prefill=9, steps=6, rules=None, mask=None, seed=0):
    """Feed every layer the same prefill and decode steps; return each step's (out, weights) per layer."""
    g = torch.Generator().manual_seed(seed)
    outs = [[] for _ in layers]
    with torch.inference_mode():
        k = torch.randn(batch, hkv, prefill, d, generator=g).to(dtype)
        v = torch.randn(batch, hkv, prefill, d, generator=g).to(dtype)
        q = torch.randn(batch, hq, prefill, d, generator=g).to(dtype)
        for layer in layers:
            layer.update(k, v)
            layer.attend(q, None, d ** -0.5, rules=rules)
        for _ in range(steps):
            k1, v1 = (torch.randn(batch, hkv, 1, d, generator=g).to(dtype) for _ in range(2))
            q1 = (torch.randn(batch, hq, 1, d, generator=g) * 2).to(dtype)
            for i, layer in enumerate(layers):
                layer.update(k1, v1)
                m = None if mask is None else mask(layer.cumulative_length)
                outs[i].append(layer.attend(q1, m, d ** -0.5, rules=rules))
    return outs


def _qjl_keys(d: int) -> Scheme:
    """QJL keys (m = 2d sign bits, no outlier channels) and turbo_prod values: the op's sign-only K part."""
    from kvstats.quant.quantizers import quantizer

    return Scheme("qjl_k", 3, quantizer("qjl", bits=2, dim=d, seed=5), scheme("kqv", bits=3, dim=d, seed=6).v, 0)


@pytest.mark.parametrize("name", ["kv", "kqv", "qkqv", "qjl_k"])
@pytest.mark.parametrize("hq,hkv,batch,dtype,window,d", [
    (4, 4, 1, torch.float32, 3, 16), (6, 2, 2, torch.float32, 2, 64), (8, 1, 1, torch.float16, 0, 32),
    (3, 1, 1, torch.bfloat16, 4, 16), (4, 2, 1, torch.float64, 1, 16),
    (4, 1, 1, torch.float32, 2, 256)])  # Gemma 3 270M's heads: 4 queries on one KV head of d = 256
def test_a_decode_step_runs_the_fused_op_and_equals_the_separate_ops(name, hq, hkv, batch, dtype, window, d,
                                                                     fused_calls, monkeypatch):
    """Every decode step with codes takes the op and returns what the same cache returns with the op withheld (the
    quantizers' plans: the decode step before the op), bit for bit, with and without soft capping; and the general
    path (a recording layer: blocked, per-column choice of codes or exact states) within fp32 rounding (their BLAS
    products have other shapes)."""
    def make(record=False):
        s = _qjl_keys(d) if name == "qjl_k" else scheme(name, bits=3, dim=d, seed=2)
        return KVStatsLayer(s, window, 1, record=record)

    for rules in (None, LogitRules(softcap=8.0)):
        fused_calls.clear()
        fused, general = _steps([make(), make(record=True)], hq, hkv, d, dtype, batch, rules=rules)
        assert len(fused_calls) == len(fused)
        with monkeypatch.context() as patch:
            patch.setattr(Scheme, "decode_parts", lambda self, cache, dtype: None)
            plain = _steps([make()], hq, hkv, d, dtype, batch, rules=rules)[0]
        assert len(fused_calls) == len(fused)  # none more
        tol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 1e-2)
        for (o1, w1), (o2, w2), (o3, w3) in zip(fused, plain, general):
            assert o1.dtype == dtype and torch.equal(o1, o2) and torch.equal(w1, w2)
            torch.testing.assert_close(o1, o3, rtol=tol, atol=tol)
            torch.testing.assert_close(w1, w3, rtol=tol, atol=tol)


def test_with_sinks_the_fused_step_equals_the_separate_ops(monkeypatch, fused_calls):
    """Records refuse sinks, so here the reference is the same cache with the op's parts withheld (the plans)."""
    sinks = torch.randn(6, generator=torch.Generator().manual_seed(4))
    rules = LogitRules(softcap=12.0, sinks=sinks)
    fused = _steps([KVStatsLayer(scheme("kqv", bits=4, dim=64, seed=1), 2, 1)], 6, 2, 64, torch.float32, 2,
                   rules=rules)[0]
    assert fused_calls
    monkeypatch.setattr(Scheme, "decode_parts", lambda self, cache, dtype: None)
    fused_calls.clear()
    plain = _steps([KVStatsLayer(scheme("kqv", bits=4, dim=64, seed=1), 2, 1)], 6, 2, 64, torch.float32, 2,
                   rules=rules)[0]
    assert not fused_calls
    for (o1, w1), (o2, w2) in zip(fused, plain):
        assert torch.equal(o1, o2) and torch.equal(w1, w2)


def test_the_cache_falls_back_where_the_op_cannot_stand_for_the_plans(fused_calls):
    """A mask, a sliding window, codes the op does not read (min-max, QJL with outlier channels, a three-pass
    rotation at d = 24), and quantizers or schemes with an estimator of their own run the separate ops."""
    from kvstats.quant.quantizers.lloyd import TurboMSE

    def steps(layer, **kw):
        fused_calls.clear()
        _steps([layer], 4, 2, layer.scheme.dim, torch.float32, **kw)
        return len(fused_calls)

    assert steps(KVStatsLayer(scheme("kqv", bits=3, dim=16, seed=0), 2, 1)) > 0  # the control
    assert steps(KVStatsLayer(scheme("kqv", bits=3, dim=16, seed=0), 2, 1),
                 mask=lambda seq: torch.ones(1, 1, 1, seq, dtype=torch.bool)) == 0
    assert steps(KVStatsLayer(scheme("kqv", bits=3, dim=16, seed=0), 2, 1), rules=LogitRules(sliding_window=4)) == 0
    assert steps(KVStatsLayer(scheme("minmax", bits=3, dim=16, seed=0), 2, 1)) == 0
    assert steps(KVStatsLayer(scheme("kqv", bits=3, dim=24, seed=0), 2, 1)) == 0  # 24: three Hadamard passes

    class OwnInner(TurboMSE):
        def _inner(self, query, code):
            return super()._inner(query, code)

    class OwnScores(Scheme):
        def own_scores(self, queries, cache):
            return super().own_scores(queries, cache)

    base = scheme("kqv", bits=3, dim=16, seed=0)
    assert OwnInner(3, 16, 0).decode_parts(base.k.encode(torch.randn(1, 2, 5, 16)), torch.float32) is None
    assert steps(KVStatsLayer(Scheme("own", 3, OwnInner(3, 16, 0), base.v, 0), 2, 1)) == 0
    assert steps(KVStatsLayer(OwnScores("own", 3, base.k, base.v, 0), 2, 1)) == 0
    assert steps(KVStatsLayer(scheme("qjl_cache", bits=3, dim=16, seed=0), 2, 1)) == 0  # min-max values


@pytest.mark.parametrize("name,family", [("kqv", "llama"), ("qkqv", "llama"), ("kqv", "gemma3_270m")])
def test_greedy_generation_gives_the_same_logits_with_and_without_the_fused_step(name, family, monkeypatch,
                                                                                 fused_calls):
    """llama: the tiny GQA Llama of the cache's tests (4 query heads, 2 KV heads, d = 16, two layers); gemma3_270m:
    Gemma 3 270M's attention (one KV head of d = 256, QK-norm, three layers with a 16-token sliding window, which run
    the separate ops, then a global one, which runs the op), generating past the window."""
    if family == "llama":
        from tests.helpers.llama import _tiny

        model, new_tokens, fused_layers = _tiny(), 10, 2
    else:
        from tests.helpers.architectures import _tiny

        model, new_tokens, fused_layers = _tiny(family), 24, 1
    model = use_estimator_attention(model)
    ids = torch.randint(1, 100, (1, 12), generator=torch.Generator().manual_seed(1))

    def generate():
        cache = KVStatsCache.from_config(model.config, name, 3, full_precision_window=2)
        with torch.inference_mode():
            return model.generate(ids, max_new_tokens=new_tokens, do_sample=False, output_logits=True,
                                  return_dict_in_generate=True, **cache_kwargs(model, cache))

    fused = generate()
    # the layers without a window, each step after the window filled (new_tokens - 2); a sliding layer never
    assert fused_layers * (new_tokens - 2) <= len(fused_calls) <= fused_layers * new_tokens
    monkeypatch.setattr(Scheme, "decode_parts", lambda self, cache, dtype: None)
    plain = generate()
    assert torch.equal(fused.sequences, plain.sequences)
    assert all(torch.equal(a, b) for a, b in zip(fused.logits, plain.logits))
