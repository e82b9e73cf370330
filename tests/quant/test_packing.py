"""Bit packing: round trips, exact sizes, and the layout against numpy's packbits (independent oracle)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstats.quant.packing import pack_bits, pack_signs, packed_nbytes, unpack_bits, unpack_signs


def numpy_pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Oracle: each code's `bits` low bits LSB first, concatenated, cut into bytes LSB first."""
    as_bits = np.unpackbits(codes.astype(np.uint8)[..., None], axis=-1, bitorder="little")[..., :bits]
    stream = as_bits.reshape(*codes.shape[:-1], -1)
    return np.packbits(stream, axis=-1, bitorder="little")


@given(
    bits=st.integers(1, 8),
    d=st.integers(1, 300),
    lead=st.lists(st.integers(1, 3), max_size=2),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=80, deadline=None)
def test_round_trip_layout_and_size(bits, d, lead, seed):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**bits, size=(*lead, d))
    packed = pack_bits(torch.from_numpy(codes), bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (*lead, packed_nbytes(d, bits)) == (*lead, -(-d * bits // 8))
    np.testing.assert_array_equal(packed.numpy(), numpy_pack(codes, bits))
    np.testing.assert_array_equal(unpack_bits(packed, bits, d).numpy(), codes)


def test_signs_are_lsb_first_and_zero_counts_as_positive():
    x = torch.tensor([[1.0, -2.0, 0.0, -0.5, 3.0, -1.0, -1.0, 2.0, -7.0]])
    packed = pack_signs(x)
    # bits LSB first: + - + - + - - + | -  -> 0b10010101 = 0x95, then 0b0
    assert packed.tolist() == [[0x95, 0x00]]
    assert unpack_signs(packed, 9).tolist() == [[1, -1, 1, -1, 1, -1, -1, 1, -1]]


@pytest.mark.parametrize("bits", [0, 9])
def test_rejects_bits_out_of_range(bits):
    with pytest.raises(ValueError, match=f"bits must be in \\[1, 8\\], got {bits}"):
        pack_bits(torch.zeros(4, dtype=torch.int64), bits)


def test_unpack_rejects_wrong_length():
    with pytest.raises(ValueError, match="packed.shape\\[-1\\] must be ceil"):
        unpack_bits(torch.zeros(3, dtype=torch.uint8), 3, 16)


@given(bits=st.sampled_from([1, 2, 4, 8]), d=st.integers(1, 130), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_whole_codes_per_byte_unpack_any_bytes_as_the_bit_stream_does(bits, d, seed):
    """The fast path of 1/2/4/8 bits against the bit-at-a-time stream on arbitrary bytes (padding bits set too),
    and codes beyond 2^bits packed by their low bits, as the stream packs them."""
    from kvstats.quant.packing import _pack_stream, _unpack_stream

    rng = np.random.default_rng(seed)
    raw = torch.from_numpy(rng.integers(0, 256, size=(3, packed_nbytes(d, bits)), dtype=np.uint8))
    assert torch.equal(unpack_bits(raw, bits, d), _unpack_stream(raw, bits, d))
    wide = torch.from_numpy(rng.integers(0, 1 << 12, size=(3, d)))
    assert torch.equal(pack_bits(wide, bits), _pack_stream(wide, bits))
