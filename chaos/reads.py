"""Reading a whole partition straight from one node (no leader, no SDK retries): what that node
stores, with the events it reports. Used for the final read and for scrubbing a corrupted node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc

from broker.v1 import broker_pb2, broker_pb2_grpc, common_pb2

READ_TIMEOUT_S = 60.0
_EVENT_NAMES = {common_pb2.EVENT_TYPE_SKIP_FORWARD: "skip_forward", common_pb2.EVENT_TYPE_RESET: "reset",
                common_pb2.EVENT_TYPE_BADMSG: "badmsg", common_pb2.EVENT_TYPE_GAP: "gap"}


@dataclass
class PartitionRead:
    """(offset, value) of every record, their timestamps (parallel), the events, or the error that
    ended the read."""

    records: list[tuple[int, str]] = field(default_factory=list)
    timestamps_ms: list[int] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def signalled_damage(self) -> bool:
        return self.error is not None or any(e["event"] == "badmsg" for e in self.events)


def read_partition(address: str, topic: str, partition: int, timeout_s: float = READ_TIMEOUT_S) -> PartitionRead:
    """Everything node ``address`` holds of ``topic``/``partition`` now (``stop_at_end``)."""
    out = PartitionRead()
    channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)])
    try:
        req = broker_pb2.SubscribeRequest(topic=topic, partition=partition, stop_at_end=True, max_batch=5000)
        for item in broker_pb2_grpc.BrokerStub(channel).Subscribe(req, timeout=timeout_s):
            if item.HasField("batch"):
                out.records.extend((r.offset, r.value.decode(errors="replace")) for r in item.batch.records)
                out.timestamps_ms.extend(r.timestamp_ms for r in item.batch.records)
            else:
                ev = item.event
                out.events.append({"event": _EVENT_NAMES.get(ev.type, str(ev.type)), "offset_before": ev.offset_before,
                                   "offset_after": ev.offset_after, "detail": ev.detail})
    except grpc.RpcError as err:
        code = err.code().name if isinstance(err, grpc.Call) else "UNKNOWN"
        details = err.details() if isinstance(err, grpc.Call) else str(err)
        out.error = f"{code}: {details}"
    finally:
        channel.close()
    return out
