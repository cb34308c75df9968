"""The packed publish form's bytes and the reading of publish answers, for the SDKs (issue 15
item 3). Pure functions, no I/O; ``broker.client.wire.publish_request`` is the one request builder
of the sync and asyncio clients and uses these.

A batch goes out as the bytes of its ``PublishRequest`` joined once from pieces (the request's
small fields, then per record the ``packed_records`` element's head and the record's bytes), sent
through :class:`PublishBytesStub`, which hands them to grpc as they are. Building the message
instead copied every value three more times (into the packed record, into the message, and while
the serializer grew its buffer), on fresh memory each time for a batch of 1 MiB: 3.3 against 0.84 us
per 1 KiB record here (``bench/NOTE.md``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from broker.client.errors import BrokerError
from broker.client.models import OPS, PublishResult, PublishResults
from broker.protowire import ByLength, varint
from broker.v1 import broker_pb2

VALUE_TAG = b"\x2a"  # PublishRecord.value: field 5, length-delimited
KEY_TAG = b"\x22"  # PublishRecord.key: field 4, length-delimited
OP_TAG = b"\x48"  # PublishRecord.op: field 9, varint
OP_NUMBERS = {name: i for i, name in enumerate(OPS)}


PACKED_TAG = b"\x2a"  # PublishRequest.packed_records: field 5, length-delimited
PUBLISH_METHOD = f"/{broker_pb2.DESCRIPTOR.services_by_name['Broker'].full_name}/Publish"
PUBLISH_STREAM_METHOD = f"{PUBLISH_METHOD}Stream"

def _element_head(n: int) -> bytes:
    """The head of a ``packed_records`` element holding a bare value of ``n`` bytes: the element's
    tag and length, then the value's tag and length; the empty value is the empty record."""
    if not n:
        return PACKED_TAG + b"\x00"
    length = varint(n)
    return PACKED_TAG + varint(n + 1 + len(length)) + VALUE_TAG + length


_ELEMENT_HEADS = ByLength(_element_head)
_BYTES_ONLY = frozenset((bytes,))


def pack_value(data: bytes) -> bytes:
    """The serialized ``PublishRecord`` holding only the value ``data``."""
    return VALUE_TAG + varint(len(data)) + data if data else b""


def value_elements(values: Sequence[bytes | str], parts: list[bytes]) -> None:
    """Append to ``parts`` each of ``values`` (str as UTF-8) as a ``packed_records`` element holding
    :func:`pack_value` of it: its head, then the value itself (no per-value copy). For bytes, every
    step is a loop in C (a Python loop here was a fifth of the SDK's CPU for 1 KiB values)."""
    if set(map(type, values)) <= _BYTES_ONLY:
        plain = cast(Sequence[bytes], values)
    else:
        plain = [v if type(v) is bytes else v.encode() if isinstance(v, str) else bytes(v) for v in values]
    pieces: list[bytes] = [b""] * (2 * len(plain))
    pieces[0::2] = map(_ELEMENT_HEADS.__getitem__, map(len, plain))
    pieces[1::2] = plain
    parts += pieces


def record_elements(records: Sequence[bytes], parts: list[bytes]) -> None:
    """Append to ``parts`` each packed record (``PublishRecord`` bytes) as a ``packed_records``
    element: its tag and length, then the record."""
    add = parts.append
    for record in records:
        add(PACKED_TAG + varint(len(record)))
        add(record)


class PublishBytesStub:
    """``Broker.Publish`` taking the request as the bytes of a serialized ``PublishRequest`` (as
    ``wire.PublishCall.data`` joins them): grpc sends them as they are. Made on a sync or an asyncio
    channel alike (``Router.stub``)."""

    def __init__(self, channel: Any) -> None:
        self.Publish = channel.unary_unary(PUBLISH_METHOD, request_serializer=None,
                                           response_deserializer=broker_pb2.PublishResponse.FromString)


_new = object.__new__
_set = object.__setattr__


def _result(partition: int, offset: int, duplicate: bool, timestamp_ms: int, key: str) -> PublishResult:
    """A :class:`PublishResult` without its frozen ``__init__`` (one attribute write, not five:
    about half the time, measured), for the thousands of results of one batch."""
    result = _new(PublishResult)
    _set(result, "__dict__", {"partition": partition, "offset": offset, "duplicate": duplicate,
                              "timestamp_ms": timestamp_ms, "idempotency_key": key})
    return result


def publish_results(response: broker_pb2.PublishResponse, count: int, keys: list[str] | None) -> PublishResults:
    """One result per record from either answer form: per record, or compact (each record's
    partition and one range per partition: offsets counted from the range's base in order).
    The answer is checked now (:class:`BrokerError` INTERNAL when it does not fit the request);
    the results are made when first read (:class:`PublishResults`)."""
    if response.results or not response.ranges:
        if len(response.results) != count:
            raise BrokerError("INTERNAL", f"server answered {len(response.results)} results for {count} records")
        return PublishResults(count, lambda: _per_record_results(response, keys or [""] * count))
    ranges = {r.partition: r for r in response.ranges}
    if len(response.partitions) != count or sum(r.count for r in ranges.values()) != count:
        raise BrokerError("INTERNAL", f"server answered places for {len(response.partitions)} records "
                                      f"({sum(r.count for r in ranges.values())} in ranges) for {count} records")
    missing = set(response.partitions) - ranges.keys()
    if missing:
        raise BrokerError("INTERNAL", f"server answered no range for partitions {sorted(missing)}")
    return PublishResults(count, lambda: _compact_results(response, ranges, keys or [""] * count))


def _per_record_results(response: broker_pb2.PublishResponse, sent: list[str]) -> list[PublishResult]:
    return [_result(r.partition, r.offset, r.duplicate, r.timestamp_ms, k)
            for r, k in zip(response.results, sent, strict=True)]


def _compact_results(response: broker_pb2.PublishResponse, ranges: dict[int, broker_pb2.PartitionRange],
                     sent: list[str]) -> list[PublishResult]:
    following = {p: r.base_offset for p, r in ranges.items()}
    stamps = {p: r.timestamp_ms for p, r in ranges.items()}
    results: list[PublishResult] = []
    append, new, set_dict = results.append, _new, _set
    for partition, key in zip(response.partitions, sent, strict=True):  # _result inlined: the per-record cost
        offset = following[partition]
        following[partition] = offset + 1
        result = new(PublishResult)
        set_dict(result, "__dict__", {"partition": partition, "offset": offset, "duplicate": False,
                                      "timestamp_ms": stamps[partition], "idempotency_key": key})
        append(result)
    return results
