"""Payload encoding: msgpack only (never pickle), with a size cap checked before any write and
again on every read (a record written by hand or by another client must not make a worker or
`runs show` decode gigabytes)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
from duetime.common.errors import InvalidInput, PayloadTooLarge

DEFAULT_MAX_PAYLOAD = 512 * 1024


_local = threading.local()


def pack_payload(args: Sequence[Any], kwargs: Mapping[str, Any], limit: int = DEFAULT_MAX_PAYLOAD
                 ) -> bytes:
    packer = getattr(_local, "packer", None)
    if packer is None:  # one Packer per thread: packb() builds a new one per call
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    try:
        data: bytes = packer.pack([list(args), dict(kwargs)])
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInput(f"payload is not msgpack-serialisable: {exc}") from None
    if len(data) > limit:
        raise PayloadTooLarge(f"payload is {len(data)} bytes, over the {limit}-byte cap")
    return data


def unpack_payload(data: bytes | None, limit: int = DEFAULT_MAX_PAYLOAD
                   ) -> tuple[list[Any], dict[str, Any]]:
    if not data:
        return [], {}
    if len(data) > limit:
        raise PayloadTooLarge(f"stored payload is {len(data)} bytes, over the {limit}-byte cap")
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - msgpack raises ValueError, TypeError, its own
        raise InvalidInput(f"payload is not msgpack: {exc}") from None
    # written by another client or by hand: anything but [list, dict with str keys] would
    # reach the task as its arguments (a TypeError retried as if the task had failed)
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)
            and isinstance(value[1], dict) and all(isinstance(k, str) for k in value[1])):
        raise InvalidInput(f"payload is msgpack but not duetime's [args, kwargs]: "
                           f"{repr(value)[:80]}")
    return value[0], value[1]


def pack_result(value: Any, limit: int = DEFAULT_MAX_PAYLOAD) -> bytes:
    """A task's return value as stored on its run (msgpack, capped like payloads)."""
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    try:
        data: bytes = packer.pack(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInput(f"result is not msgpack-serialisable: {exc}") from None
    if len(data) > limit:
        raise PayloadTooLarge(f"result is {len(data)} bytes, over the {limit}-byte cap")
    return data


def unpack_result(data: bytes, limit: int = DEFAULT_MAX_PAYLOAD) -> Any:
    if len(data) > limit:
        raise PayloadTooLarge(f"stored result is {len(data)} bytes, over the {limit}-byte cap")
    return msgpack.unpackb(data, raw=False, strict_map_key=False)
