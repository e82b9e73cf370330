"""Hostile inputs to the I/O layer, property-based (issue 16, items 6, 7 and 10): whatever bytes a cell file or
a capture file holds, and whatever law parameters the generators get, the result is a valid table, a valid
file, finite tensors, or a clear error — never a bare JSONDecodeError, a short table, inf or NaN.

The targeted reproducers live next to the code they test: tests/test_sweep.py (cell files, killed driver),
tests/test_data_synthetic.py (generators), tests/test_cli.py (model files, --out, --text, cached captures).
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
from kvstats.run.sweep import BadCellWarning, Sweep, check_cell, grid

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
    inside a metadata string, e.g. the model's name, can go unseen: the format has no checksum.)"""
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
