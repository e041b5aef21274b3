"""Property tests of the payload codec (common/codec.py): what a producer packs, a worker
unpacks unchanged; anything else -- objects msgpack cannot carry, oversized payloads, bytes
written by hand or by another client -- is one clean `InvalidInput`, never a crash, and never
an "args" that is not a list."""

from __future__ import annotations

import msgpack
import pytest
from duetime.common.codec import pack_payload, unpack_payload
from duetime.common.errors import InvalidInput, PayloadTooLarge
from hypothesis import given, settings
from hypothesis import strategies as st

CI = settings(derandomize=True, max_examples=150, deadline=None)

scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
           | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
args_st = st.lists(values, max_size=5)
kwargs_st = st.dictionaries(st.text(max_size=10), values, max_size=5)


@CI
@given(args_st, kwargs_st)
def test_what_is_packed_unpacks_unchanged(args: list, kwargs: dict) -> None:
    assert unpack_payload(pack_payload(args, kwargs)) == (args, kwargs)
    assert unpack_payload(pack_payload(tuple(args), kwargs)) == (args, kwargs)


unsupported = st.sampled_from([object(), {1, 2}, 2**64, -(2**63) - 1, 1j, ValueError("x")])


@CI
@given(args_st, kwargs_st, unsupported, st.booleans())
def test_what_msgpack_cannot_carry_is_one_clean_error(args: list, kwargs: dict, bad: object,
                                                      in_kwargs: bool) -> None:
    if in_kwargs:
        kwargs = {**kwargs, "bad": bad}
    else:
        args = [*args, bad]
    with pytest.raises(InvalidInput):
        pack_payload(args, kwargs)


@CI
@given(args_st, kwargs_st, st.integers(0, 300))
def test_the_size_cap_holds_exactly(args: list, kwargs: dict, limit: int) -> None:
    size = len(msgpack.packb([args, kwargs], use_bin_type=True))
    if size > limit:
        with pytest.raises(PayloadTooLarge):
            pack_payload(args, kwargs, limit)
        with pytest.raises(PayloadTooLarge):
            unpack_payload(msgpack.packb([args, kwargs], use_bin_type=True), limit)
    else:
        assert unpack_payload(pack_payload(args, kwargs, limit), limit) == (args, kwargs)


def _readable_or_refused(data: bytes) -> None:
    try:
        args, kwargs = unpack_payload(data)
    except InvalidInput:
        return
    assert isinstance(args, list), f"args read as {args!r}"
    assert isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs), \
        f"kwargs read as {kwargs!r}"


@CI
@given(st.binary(max_size=64))
def test_any_bytes_read_as_args_and_kwargs_or_one_clean_error(data: bytes) -> None:
    _readable_or_refused(data)


@CI
@given(values | st.lists(values, min_size=2, max_size=2)
       | st.tuples(values, values).map(list) | st.tuples(args_st, values).map(list))
def test_any_msgpack_value_reads_as_args_and_kwargs_or_one_clean_error(value: object) -> None:
    """Another client (or a hand) wrote valid msgpack that is not `[args, kwargs]`."""
    _readable_or_refused(msgpack.packb(value, use_bin_type=True))
