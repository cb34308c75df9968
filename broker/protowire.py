"""Protobuf's base-128 varint, for the few places that write protobuf bytes by hand to skip a
message object per record: the SDK's packed publish form (``broker.client.packing``), the leader's
append command (``broker.leader.topic_log``) and its packed reads (``broker.leader.packed_reads``);
:class:`ByLength`, the field heads of a whole batch made in C; and :class:`Received`, a request
with the bytes it came as. Shared by the SDK and the server, so it imports nothing of either."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Received(Generic[M]):
    """A request as the server received it: the parsed ``message`` and its ``data`` (a handler that
    needs the bytes reads them instead of serializing the message again)."""

    message: M
    data: bytes


def receiving(parse: Callable[[bytes], M]) -> Callable[[bytes], Received[M]]:
    """A gRPC request deserializer that keeps the bytes beside the message ``parse`` makes."""

    def deserialize(data: bytes) -> Received[M]:
        return Received(parse(data), data)

    return deserialize

ONE_BYTE = [bytes((n,)) for n in range(0x80)]  # the varint of every n below 128


def varint(n: int) -> bytes:
    """The varint of ``n`` (0 <= n < 2**64). Two and three bytes (lengths, offsets below 2 million)
    take no loop."""
    if n < 0x80:
        return ONE_BYTE[n]
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    if n < 0x200000:
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


LENGTHS_KEPT = 1 << 16  # distinct lengths a :class:`ByLength` keeps (a batch seldom has more than a few)


class ByLength(dict[int, bytes]):
    """The bytes that ``make`` gives for a length, made once per length and kept (up to
    :data:`LENGTHS_KEPT` of them): ``map(heads.__getitem__, map(len, values))`` heads every value of
    a batch in C, with a Python call only for a length not seen before. For the heads of
    length-delimited fields, where a loop calling :func:`varint` per record was the largest Python
    cost of a 1,000-record publish on both the SDK's side and the leader's."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[int], bytes]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, n: int) -> bytes:
        made = self._make(n)
        if len(self) < LENGTHS_KEPT:
            self[n] = made
        return made
