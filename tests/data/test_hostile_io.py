"""Hostile inputs to the I/O layer, property-based (issue 16, items 6, 7 and 10): whatever bytes a cell file or
a capture file holds, and whatever law parameters the generators get, the result is a valid table, a valid
file, finite tensors, or a clear error — never a bare JSONDecodeError, a short table, inf or NaN.

The targeted reproducers live next to the code they test: tests/study/test_sweep.py (cell files, killed driver),
tests/data/test_data_synthetic.py (generators), tests/cli/test_cli.py (model files, --out, --text, cached captures).
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstats.data.io import load_qkv, save_qkv
from kvstats.data.synthetic import generate
from kvstats.study.sweep import BadCellWarning, Sweep, check_cell, grid

_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                     derandomize=True)


def _cell(x: int) -> list[dict]:
    return [{"x": x, "square": x * x}, {"x": x, "square": -x}]


def _damaged(good: str):
    """Bytes a cell file may hold after a crash, a bad copy or a hand edit: any prefix of a good file, any
    JSON value, or random text."""
    payload = json.loads(good)
    return st.one_of(
        st.integers(0, len(good)).map(lambda n: good[:n]),
        st.text(max_size=200),
        st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=4),
                     max_leaves=12).map(json.dumps),
        st.sampled_from(sorted(payload)).map(lambda key: json.dumps({k: v for k, v in payload.items() if k != key})),
        st.integers(0, 5).map(lambda n: json.dumps({**payload, "rows": payload["rows"][:1] * n})),
    )


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    root = tmp_path_factory.mktemp("cells")
    sweep = Sweep("hostile", _cell, grid(x=[1, 2, 3]), version="1")
    table = sweep.run(n_jobs=1, cache_dir=root, progress=False)
    return sweep, root, table, sweep.path(sweep.cells[1], root).read_text()


@_SETTINGS
@given(data=st.data())
def test_any_cell_file_content_gives_the_full_table(stored, data):
    """A damaged cell file is either still the valid cell (the same rows) or reported, moved aside and
    recomputed: the table is always the full, correct one, and nothing else is raised."""
    sweep, root, table, good = stored
    text = data.draw(_damaged(good))
    path = sweep.path(sweep.cells[1], root)
    path.write_text(text, encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = sweep.run(n_jobs=1, cache_dir=root, progress=False)
    bad = [w for w in caught if issubclass(w.category, BadCellWarning)]
    try:
        check_cell(text, study="hostile", version="1", key=sweep.key(sweep.cells[1]), params=sweep.cells[1])
        valid = True
    except ValueError as exc:
        valid = False
        assert path.name in str(exc) or "cell file" in str(exc)
    assert again.equals(table)
    assert (not bad) == valid and again.attrs["sweep"]["computed"] == (0 if valid else 1)
    if bad:
        assert path.name in str(bad[0].message)


@pytest.fixture(scope="module")
def capture_bytes(tmp_path_factory):
    layer = (torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8))
    path = save_qkv(tmp_path_factory.mktemp("cap") / "cap.safetensors", [layer, layer], {"model": "x"})
    return path.read_bytes()


@_SETTINGS
@given(data=st.data())
def test_any_damaged_capture_file_is_a_clear_error(capture_bytes, tmp_path_factory, data):
    """A capture file cut anywhere, or with bytes flipped in its header, opens with the intact capture's layers
    and tensors (dtypes, shapes, values) or raises ValueError naming the file; no other exception. (A flip
    inside a metadata string, e.g. the model's name, can go unseen: the digests cover the tensors, not the header.)"""
    cut = data.draw(st.integers(0, len(capture_bytes) - 1))
    flips = data.draw(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 255)), max_size=3))
    raw = bytearray(capture_bytes[:cut] if data.draw(st.booleans()) else capture_bytes)
    for pos, xor in flips:
        if pos < len(raw):
            raw[pos] ^= xor
    path = tmp_path_factory.mktemp("bad") / "damaged.safetensors"
    path.write_bytes(bytes(raw))
    intact = tmp_path_factory.mktemp("intact") / "intact.safetensors"
    intact.write_bytes(capture_bytes)
    good = load_qkv(intact)
    try:
        f = load_qkv(path)
        assert f.layers == good.layers
        for i in f.layers:
            for part in ("q", "k", "v"):
                got, want = getattr(f.layer(i), part), getattr(good.layer(i), part)
                assert got.dtype == want.dtype and torch.equal(got, want), (i, part)
    except ValueError as exc:
        assert "damaged.safetensors" in str(exc)


@pytest.mark.parametrize("old, new, what", [(b'"F32"', b'"I32"', "not a float type"),
                                            (b'"shape":[1,2,6,8]', b'"shape":[1,2,8,6]', "the metadata states")])
def test_a_capture_header_with_a_flipped_dtype_or_shape_is_refused(capture_bytes, tmp_path, old, new, what):
    # the damage the byte-flip search above found: the header still parses, the tensor is garbage
    assert old in capture_bytes
    path = tmp_path / "flipped.safetensors"
    path.write_bytes(capture_bytes.replace(old, new, 1))
    with pytest.raises(ValueError, match=f"flipped.safetensors: tensor .*{what}"):
        load_qkv(path)


_DTYPES = st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64])


@_SETTINGS
@given(kind=st.sampled_from(["gaussian", "heavy_tail", "low_rank"]), dtype=_DTYPES,
       log_scale=st.floats(-30, 308), log_df=st.floats(-4, 2), log_peak=st.floats(-3, 305),
       outliers=st.sampled_from([None, 2]))
def test_generators_never_return_inf_or_nan(kind, dtype, log_scale, log_df, log_peak, outliers):
    """Any scale in [1e-30, 1e308], df in [1e-4, 100], peak up to 1e305, any dtype: finite Q, K, V, or a
    ValueError naming scale, df or peak."""
    scale = 10.0 ** log_scale
    params = {"scale": scale, "peak": 10.0 ** log_peak, "outlier_channels": outliers}
    if kind == "heavy_tail":
        params["df"] = 10.0 ** log_df
    try:
        q, k, v = generate(kind, 1, 2, 64, 16, 0, n_q=4, dtype=dtype, **params)
    except ValueError as exc:
        assert any(name in str(exc) for name in ("scale=", "df=", "peak=", "do not fit")), str(exc)
        return
    for t in (q, k, v):
        assert bool(torch.isfinite(t).all())


@pytest.mark.parametrize("layers, message", [([], "is empty"), ([0, 0, 1], r"names layers \[0\] more than once")])
def test_capture_metadata_with_no_layer_or_a_repeated_one_is_refused(capture_bytes, tmp_path, layers, message):
    # `layers: []` raised a bare IndexError downstream; a repeated entry weighted that layer twice.
    from safetensors import safe_open
    from safetensors.torch import save_file

    good = tmp_path / "good.safetensors"
    good.write_bytes(capture_bytes)
    with safe_open(str(good), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
        metadata = dict(f.metadata())
    metadata["layers"] = json.dumps(layers)
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, str(bad), metadata=metadata)
    with pytest.raises(ValueError, match=rf"bad\.safetensors: metadata 'layers' {message}"):
        load_qkv(bad)


# ------------------------------------------------------------------------- per-tensor digests (issue 30)
def _header_and_data(raw: bytes) -> tuple[dict, int]:
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), 8 + n


def _with_header(raw: bytes, header: dict) -> bytes:
    n = int.from_bytes(raw[:8], "little")
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n
    return raw[:8] + text + b" " * (n - len(text)) + raw[8 + n:]  # safetensors pads its header with spaces


@_SETTINGS
@given(data=st.data())
def test_a_flipped_data_byte_is_refused_on_read_naming_the_tensor(capture_bytes, tmp_path_factory, data):
    """Any byte of any tensor's data flipped: the file opens (its header is intact), the damaged tensor is
    refused on read naming it, every other tensor reads back equal."""
    header, start = _header_and_data(capture_bytes)
    pos = data.draw(st.integers(start, len(capture_bytes) - 1))
    raw = bytearray(capture_bytes)
    raw[pos] ^= data.draw(st.integers(1, 255))
    damaged = next(name for name, info in header.items() if name != "__metadata__"
                   and start + info["data_offsets"][0] <= pos < start + info["data_offsets"][1])
    path = tmp_path_factory.mktemp("flip") / "flipped.safetensors"
    path.write_bytes(bytes(raw))
    intact = tmp_path_factory.mktemp("intact") / "intact.safetensors"
    intact.write_bytes(capture_bytes)
    f, good = load_qkv(path), load_qkv(intact)
    for layer in f.layers:
        for part, read in (("q", f.queries), ("k", f.keys), ("v", f.values)):
            name = f"layer.{layer}.{part}"
            if name == damaged:
                with pytest.raises(ValueError, match=rf"flipped.safetensors: tensor '{name}' .*does not match its "
                                                     r"stored sha256"):
                    read(layer)
            else:
                want = {"q": good.queries, "k": good.keys, "v": good.values}[part](layer)
                assert torch.equal(read(layer), want)


def test_swapped_k_and_v_offsets_of_one_shape_are_refused(capture_bytes, tmp_path):
    # k and v have one shape, so the header checks pass; only the digests see that k now reads v's bytes
    header, _ = _header_and_data(capture_bytes)
    k, v = header["layer.1.k"]["data_offsets"], header["layer.1.v"]["data_offsets"]
    header["layer.1.k"]["data_offsets"], header["layer.1.v"]["data_offsets"] = v, k
    path = tmp_path / "swapped.safetensors"
    path.write_bytes(_with_header(capture_bytes, header))
    f = load_qkv(path)
    torch.testing.assert_close(f.keys(0), load_qkv_bytes(capture_bytes, tmp_path).keys(0))
    for read in (f.keys, f.values):
        with pytest.raises(ValueError, match=r"swapped.safetensors: tensor 'layer.1.[kv]' .*sha256"):
            read(1)


def load_qkv_bytes(raw: bytes, folder) -> object:
    path = folder / "intact.safetensors"
    path.write_bytes(raw)
    return load_qkv(path)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(format=json.dumps("kvstats-qkv/1")), r"format 'kvstats-qkv/1' is an older kvstats capture: "
                                                             r"it has no per-tensor digests"),
    (lambda m: m.pop("tensor_sha256"), r"metadata 'tensor_sha256' must give one sha256 per stored tensor"),
    (lambda m: m.update(tensor_sha256=json.dumps({"layer.0.k": "0" * 64})),
     r"metadata 'tensor_sha256' must give one sha256 per stored tensor \(6\), got dict for \['layer.0.k'\]"),
])
def test_a_capture_without_its_digests_is_refused(capture_bytes, tmp_path, edit, message):
    header, _ = _header_and_data(capture_bytes)
    edit(header["__metadata__"])
    path = tmp_path / "old.safetensors"
    path.write_bytes(_with_header(capture_bytes, header))
    with pytest.raises(ValueError, match=rf"old\.safetensors: {message}"):
        load_qkv(path)


def test_the_stored_digest_is_the_sha256_of_the_tensor_bytes(capture_bytes, tmp_path):
    # oracle: hashlib over the raw little-endian bytes safetensors wrote, sliced by the header's offsets
    import hashlib

    header, start = _header_and_data(capture_bytes)
    digests = json.loads(header["__metadata__"]["tensor_sha256"])
    assert set(digests) == {n for n in header if n != "__metadata__"}
    for name, info in header.items():
        if name != "__metadata__":
            lo, hi = info["data_offsets"]
            assert digests[name] == hashlib.sha256(capture_bytes[start + lo:start + hi]).hexdigest()


# ------------------------------------------------------------------ capture headers validated (issue 43, item 6)
def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


_RULES = [{"layer": 0, "scaling": 0.35, "softcap": None, "sliding_window": None},
          {"layer": 1, "scaling": 0.35, "softcap": 30.0, "sliding_window": 8}]
_DOCS = [{"source": "a", "text_sha256": _sha("a"), "start": 0, "stop": 6},
         {"source": "b", "text_sha256": _sha("b"), "start": 6, "stop": 12}]


@pytest.fixture(scope="module")
def documents_capture(tmp_path_factory):
    """A valid capture of two documents (12 tokens, layers 0 and 1) with per-layer attention rules."""
    gen = torch.Generator().manual_seed(0)
    layer = lambda: tuple(torch.randn(1, h, 12, 8, generator=gen) for h in (4, 2, 2))  # noqa: E731
    return save_qkv(tmp_path_factory.mktemp("docs") / "docs.safetensors", [layer(), layer()],
                    {"model": "x", "attn_scaling": 0.35, "attention": _RULES, "documents": _DOCS, "dtype": "float32"})


def _edited(path, folder, edit):
    """The capture at ``path`` with ``edit(metadata)`` applied to its decoded header (tensors and digests kept:
    a file save_qkv would refuse)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
        meta = {k: json.loads(v) for k, v in f.metadata().items()}
    edit(meta)
    bad = folder / "bad.safetensors"
    save_file(tensors, str(bad), metadata={k: json.dumps(v) for k, v in meta.items()})
    return bad


def _set(*path_and_value):
    """An edit setting ``meta[k0][k1]... = value``."""
    *keys, value = path_and_value

    def edit(meta):
        target = meta
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value
    return edit


_DOC_RANGE = r"metadata 'documents'\[{}\] must have ints 0 <= 'start' < 'stop' <= n_tokens = 12"
_A, _D = "metadata 'attention'", "metadata 'documents'"
_HOSTILE_HEADERS = {
    # documents: inside the stored tokens, disjoint, distinct texts
    "doc past the tokens": (_set("documents", 1, "stop", 20), _DOC_RANGE.format(1) + ", got start=6, stop=20"),
    "doc empty": (_set("documents", 0, "stop", 0), _DOC_RANGE.format(0)),
    "doc start a str": (_set("documents", 0, "start", "0"), _DOC_RANGE.format(0) + ", got start='0'"),
    "doc start a bool": (_set("documents", 0, "start", False), _DOC_RANGE.format(0) + ", got start=False"),
    "doc start negative": (_set("documents", 0, "start", -2), _DOC_RANGE.format(0)),
    "docs overlap": (_set("documents", 0, "stop", 8), _D + r"\[0\] and \[1\] overlap \(tokens 0..8 and 6..12\)"),
    "one text twice": (_set("documents", 1, "text_sha256", _sha("a")),
                       _D + r"\[0\] and \[1\] have one text_sha256: one text listed twice"),
    "doc without its text": (_set("documents", 1, "text_sha256", None),
                             _D + r"\[1\]\['text_sha256'\] must be the sha256 of its text .*several documents"),
    "doc text not a digest": (_set("documents", 0, "text_sha256", "abc"), _D + r"\[0\]\['text_sha256'\]"),
    "docs empty": (_set("documents", []), _D + r" must be a non-empty list"),
    "doc not an object": (_set("documents", 0, 5), _D + r"\[0\] must be an object"),
    "doc source a number": (_set("documents", 0, "source", 3), _D + r"\[0\]\['source'\] must be None or a str"),
    # attention rules: typed and in range
    "softcap 0": (_set("attention", 1, "softcap", 0),
                  _A + r"\[1\]\['softcap'\] must be None \(no soft cap\) or a finite number > 0, got 0"),
    "softcap -5": (_set("attention", 1, "softcap", -5.0), _A + r"\[1\]\['softcap'\] .*got -5.0"),
    "softcap nan": (_set("attention", 0, "softcap", float("nan")), _A + r"\[0\]\['softcap'\] .*got nan"),
    "scaling true": (_set("attention", 0, "scaling", True), _A + r"\[0\]\['scaling'\] must be a finite number > 0, "
                                                                 r"got True"),
    "scaling a str": (_set("attention", 0, "scaling", "0.35"), _A + r"\[0\]\['scaling'\] .*got '0.35'"),
    "scaling inf": (_set("attention", 1, "scaling", float("inf")), _A + r"\[1\]\['scaling'\] .*got inf"),
    "no scaling": (lambda m: m["attention"][0].pop("scaling"), _A + r"\[0\]\['scaling'\] .*got None"),
    "window 0": (_set("attention", 1, "sliding_window", 0), _A + r"\[1\]\['sliding_window'\] must be None"),
    "window a float": (_set("attention", 1, "sliding_window", 8.5), _A + r"\[1\]\['sliding_window'\]"),
    "window true": (_set("attention", 1, "sliding_window", True), _A + r"\[1\]\['sliding_window'\]"),
    "rule layer a str": (_set("attention", 0, "layer", "0"), _A + r"\[0\]\['layer'\] must be a layer index"),
    "rule layer twice": (_set("attention", 1, "layer", 0), _A + r"\[1\]\['layer'\] .* named once, got 0"),
    "rule layer outside": (_set("attention", 1, "layer", 2), _A + r"\[1\]\['layer'\] .*\[0, 2\)"),
    "sinks": (_set("attention", 0, "sinks", [0.5]), _A + r"\[0\] holds \['sinks'\], rules kvstats does not implement"),
    "rules not a list": (_set("attention", {"layer": 0}), _A + r" must be a list"),
    "rule not an object": (_set("attention", 0, "x"), _A + r"\[0\] must be an object"),
    "attn_scaling true": (_set("attn_scaling", True), r"metadata 'attn_scaling' must be a finite number > 0"),
    "attn_scaling 0": (_set("attn_scaling", 0), r"metadata 'attn_scaling' .*got 0"),
    "attn_scaling null": (_set("attn_scaling", None), r"metadata 'attn_scaling' .*got None"),
    # shapes, model, dtype
    "batch true": (_set("batch", True), r"metadata must give positive ints \('batch'"),
    "n_layers short": (_set("n_layers", 1), r"metadata 'n_layers' must be an int above every stored layer index "
                                            r"\(max 1\), got 1"),
    "q_heads null": (_set("q_heads", None), r"metadata 'q_heads' is None \(no queries\) but tensors "
                                            r"\['layer.0.q', 'layer.1.q'\] are stored"),
    "model a number": (_set("model", 5), r"metadata 'model' must be a non-empty str, got 5"),
    "dtype not the tensors'": (_set("dtype", "float16"), r"tensor 'layer.0.k' has dtype F32, the metadata 'dtype' "
                                                         r"states 'float16'"),
    "dtype unknown": (_set("dtype", 7), r"metadata 'dtype' must be None or one of"),
    "text digest": (_set("text_sha256", "abc"), r"metadata 'text_sha256' must be None or a sha256"),
}


@pytest.mark.parametrize("case", sorted(_HOSTILE_HEADERS))
def test_a_capture_header_out_of_range_is_refused_naming_file_and_field(documents_capture, tmp_path, case):
    """Every header field a reader relies on is checked on open: each of these was accepted before (documents past
    the tokens, one text twice, softcap 0, ``scaling: true``, ...) or crashed later with a bare TypeError."""
    edit, message = _HOSTILE_HEADERS[case]
    assert load_qkv(documents_capture).metadata["documents"] == _DOCS  # the intact file opens
    bad = _edited(documents_capture, tmp_path, edit)
    with pytest.raises(ValueError, match=rf"bad\.safetensors: {message}"):
        load_qkv(bad)


def test_a_capture_without_documents_or_rules_still_opens(documents_capture, tmp_path):
    # absent (or null) documents: one text; absent rules: attn_scaling, else 1/sqrt(d); one document needs no digest
    def edit(meta):
        del meta["attention"], meta["attn_scaling"]
        meta["documents"] = None
    assert load_qkv(_edited(documents_capture, tmp_path, edit)).layers == [0, 1]
    one = _edited(documents_capture, tmp_path, _set("documents", [{"source": None, "start": 0, "stop": 12}]))
    assert load_qkv(one).metadata["documents"][0]["stop"] == 12


def test_the_unit_builder_never_sees_a_document_past_the_stored_tokens(documents_capture, tmp_path):
    # a 6-token document claimed as 6..20: windows of 4 at tokens 6, 10 and 14 were built, of 4, 2 and 0 tokens
    from kvstats.evaluation.units import capture_units

    bad = _edited(documents_capture, tmp_path, _set("documents", 1, "stop", 20))
    with pytest.raises(ValueError, match=r"bad\.safetensors: metadata 'documents'\[1\]"):
        capture_units(bad, window=4)
    assert capture_units(documents_capture, window=4).documents == (0, 1)  # one window of 4 in each 6-token text


def test_save_qkv_refuses_metadata_that_load_would_refuse_before_writing(tmp_path):
    layer = tuple(torch.randn(1, h, 12, 8, generator=torch.Generator().manual_seed(1)) for h in (4, 2, 2))
    out = tmp_path / "twice.safetensors"
    twice = [{**_DOCS[0]}, {**_DOCS[1], "text_sha256": _DOCS[0]["text_sha256"]}]
    with pytest.raises(ValueError, match=r"twice\.safetensors \(not written\): metadata 'documents'\[0\] and \[1\] "
                                         r"have one text_sha256"):
        save_qkv(out, [layer], {"model": "x", "documents": twice})
    with pytest.raises(ValueError, match=r"'attention'\[0\]\['softcap'\]"):
        save_qkv(out, [layer], {"model": "x", "attention": [{"layer": 0, "scaling": 0.3, "softcap": -5}]})
    assert not out.exists() and not list(tmp_path.iterdir())
