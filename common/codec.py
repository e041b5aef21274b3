"""Payload encoding: msgpack only (never pickle), with a size cap checked before any write and
again on every read (a record written by hand or by another client must not make a worker or
`runs show` decode gigabytes)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

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
    # reach the task as its arguments (a TypeError retried as if the task had failed). msgpack
    # makes exact lists and dicts: checked by type, and the keys only when there are some
    # (every run's path: most payloads have no keyword arguments)
    if type(value) is list and len(value) == 2:
        args, kwargs = value
        if type(args) is list and type(kwargs) is dict \
                and (not kwargs or all(type(k) is str for k in kwargs)):
            return args, kwargs
    raise InvalidInput(f"payload is msgpack but not duetime's [args, kwargs]: "
                       f"{repr(value)[:80]}")


# Results are msgpack with a few extension types, so what a task commonly returns comes back
# as it was returned (payloads stay plain msgpack: a task's arguments are what its caller
# wrote). Results stored before these existed are plain msgpack and read as before; an
# extension code this version does not know reads as a msgpack.ExtType, never as an error.
EXT_DATETIME, EXT_DATE, EXT_DECIMAL, EXT_UUID = 1, 2, 3, 4
EXT_NOT_STORED = 100  # the result was not stored: the worker's reason, UTF-8


@dataclass(frozen=True)
class NotStored:
    """Stored in place of a task's result that could not be stored (not encodable, too
    large): the run succeeded, and `wait` says why there is no result instead of None."""

    reason: str


def _encode(value: Any) -> msgpack.ExtType:
    if isinstance(value, datetime):  # before date: a datetime is a date too
        return msgpack.ExtType(EXT_DATETIME, value.isoformat().encode())
    if isinstance(value, date):
        return msgpack.ExtType(EXT_DATE, value.isoformat().encode())
    if isinstance(value, Decimal):
        return msgpack.ExtType(EXT_DECIMAL, str(value).encode())
    if isinstance(value, UUID):
        return msgpack.ExtType(EXT_UUID, value.bytes)
    raise TypeError(f"cannot store a {type(value).__name__} (results are msgpack: None, bool, "
                    "int, float, str, bytes, lists, dicts, datetime, date, Decimal, UUID)")


def _decode(code: int, data: bytes) -> Any:
    if code == EXT_DATETIME:
        return datetime.fromisoformat(data.decode())
    if code == EXT_DATE:
        return date.fromisoformat(data.decode())
    if code == EXT_DECIMAL:
        return Decimal(data.decode())
    if code == EXT_UUID:
        return UUID(bytes=data)
    if code == EXT_NOT_STORED:
        return NotStored(data.decode(errors="replace"))
    return msgpack.ExtType(code, data)


def pack_result(value: Any, limit: int = DEFAULT_MAX_PAYLOAD) -> bytes:
    """A task's return value as stored on its run (msgpack with the extension types above,
    capped like payloads)."""
    packer = getattr(_local, "result_packer", None)
    if packer is None:
        packer = _local.result_packer = msgpack.Packer(use_bin_type=True, default=_encode)
    try:
        data: bytes = packer.pack(value)
    except (TypeError, ValueError, OverflowError) as exc:
        packer.reset()  # a failed pack may leave a partial buffer behind
        raise InvalidInput(f"result is not msgpack-serialisable: {exc}") from None
    if len(data) > limit:
        raise PayloadTooLarge(f"result is {len(data)} bytes, over the {limit}-byte cap")
    return data


def pack_not_stored(reason: str) -> bytes:
    """The marker stored in place of a result that could not be stored, with the reason."""
    return msgpack.packb(msgpack.ExtType(EXT_NOT_STORED, reason[:500].encode()))  # type: ignore[no-any-return]


def unpack_result(data: bytes, limit: int = DEFAULT_MAX_PAYLOAD) -> Any:
    """The stored result; a NotStored when the worker stored the reason instead."""
    if len(data) > limit:
        raise PayloadTooLarge(f"stored result is {len(data)} bytes, over the {limit}-byte cap")
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_decode)


# Checkpoints (`current_run().checkpoint(state)`, `Continue(state=...)`): the msgpack of the
# results, extension types included, capped small: a checkpoint is written many times per
# run and travels with the run record, so it is a position, not a data set.
CHECKPOINT_MAX_BYTES = 64 * 1024


def pack_checkpoint(state: Any, limit: int = CHECKPOINT_MAX_BYTES) -> bytes:
    """A checkpoint state as stored on its run: CheckpointTooLarge over the cap, InvalidInput
    when msgpack cannot carry it; checked in the task, before anything is sent."""
    from duetime.common.errors import CheckpointTooLarge

    try:
        data = pack_result(state, limit=1 << 62)
    except InvalidInput as exc:
        raise InvalidInput(str(exc).replace("result", "checkpoint state", 1)) from None
    if len(data) > limit:
        raise CheckpointTooLarge(f"checkpoint state is {len(data):,} bytes of msgpack, over the "
                                 f"{limit:,}-byte cap ({limit // 1024} KiB): store a position "
                                 "(an offset, a cursor, a few ids), not the data itself")
    return data


def unpack_checkpoint(data: bytes, limit: int = CHECKPOINT_MAX_BYTES) -> Any:
    """A stored checkpoint state; InvalidInput when it is not readable (written by hand)."""
    if len(data) > limit:
        raise PayloadTooLarge(f"stored checkpoint is {len(data)} bytes, over the {limit}-byte cap")
    try:
        return unpack_result(data, limit)
    except Exception as exc:  # noqa: BLE001 - msgpack raises ValueError, TypeError, its own
        raise InvalidInput(f"checkpoint is not msgpack: {exc!r}") from None
