"""Payload encoding: msgpack only (never pickle), with a size cap checked before any write."""

from __future__ import annotations

from typing import Any

import msgpack

from common.errors import InvalidInput, PayloadTooLarge

DEFAULT_MAX_PAYLOAD = 512 * 1024


def pack_payload(args: tuple | list, kwargs: dict, limit: int = DEFAULT_MAX_PAYLOAD) -> bytes:
    try:
        data = msgpack.packb([list(args), dict(kwargs)], use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInput(f"payload is not msgpack-serialisable: {exc}") from None
    if len(data) > limit:
        raise PayloadTooLarge(f"payload is {len(data)} bytes, over the {limit}-byte cap")
    return data


def unpack_payload(data: bytes | None) -> tuple[list[Any], dict[str, Any]]:
    if not data:
        return [], {}
    args, kwargs = msgpack.unpackb(data, raw=False, strict_map_key=False)
    return args, kwargs
