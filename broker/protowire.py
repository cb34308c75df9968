"""Protobuf's base-128 varint, for the few places that write protobuf bytes by hand to skip a
message object per record: the SDK's packed publish form (``broker.client.packing``) and the
leader's packed reads (``broker.leader.packed_reads``); and :class:`Received`, a request with the
bytes it came as. Shared by the SDK and the server, so it imports nothing of either."""

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
