"""Reading a whole partition straight from one node (no leader, no SDK retries): what that node
stores, with the events it reports. Used for the final read and for scrubbing a corrupted node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.client import BrokerError, Event, NodeProbe

READ_TIMEOUT_S = 60.0


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
    with NodeProbe(address, timeout_s=timeout_s) as probe:
        try:
            for item in probe.read_partition(topic, partition, max_batch=5000):
                if isinstance(item, Event):
                    out.events.append({"event": item.type, "offset_before": item.offset_before,
                                       "offset_after": item.offset_after, "detail": item.detail})
                else:
                    out.records.append((item.offset, item.value.decode(errors="replace")))
                    out.timestamps_ms.append(item.timestamp_ms)
        except BrokerError as err:
            out.error = f"{err.code}: {err.message}"
    return out
