"""The knobs of one benchmark run: the full run of ``make bench`` and the tiny one of the smoke test."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

SYSTEMS = ("raftbroker-disk-3", "raftbroker-fsync-3", "raftbroker-disk-1", "nats", "nats-dedup", "rabbitmq-quorum",
           "rabbitmq-stream", "redis")
WORKLOADS = ("publish", "queue", "latency", "failover", "recovery")


@dataclass(frozen=True)
class BenchConfig:
    """Counts, rates and limits; every workload runs ``reps`` times per system.

    A publish repetition is ``publish_records`` records or ``publish_cap_s`` seconds, whichever comes
    first (the full run: 1,000,000 records or 10 s); every record has its own random payload drawn from
    a generator seeded with ``payload_seed``.
    """

    reps: int = 3
    record_sizes: tuple[int, ...] = (100, 1024)
    publish_records: int = 1_000_000
    publish_cap_s: float = 10.0  # a slower system publishes (and reads) fewer records; the table says how many
    payload_seed: int = 20261124
    latency_rate_per_s: float = 2000.0
    latency_duration_s: float = 5.0
    latency_warmup_s: float = 1.0
    latency_size_bytes: int = 100
    queue_records: int = 30_000  # stored first, then drained as a work queue (per-record acks)
    queue_concurrency: int = 64  # records delivered and not yet acknowledged at a time
    queue_cap_s: float = 10.0
    queue_size_bytes: int = 100
    failover_interval_s: float = 0.01
    failover_before_s: float = 1.0
    failover_timeout_s: float = 15.0
    recovery_records: int = 1_000_000
    recovery_fill_cap_s: float = 20.0
    recovery_timeout_s: float = 180.0
    systems: tuple[str, ...] = SYSTEMS
    workloads: tuple[str, ...] = WORKLOADS
    profile_s: float = 8.0  # py-spy on the raftbroker leader during an extra publish run; 0: skip

    def __post_init__(self) -> None:
        if self.reps < 1 or self.publish_records < 1 or self.publish_cap_s <= 0:
            raise ValueError("reps and publish_records must be >= 1 and publish_cap_s > 0")
        if self.queue_records < 1 or self.queue_concurrency < 1 or self.queue_cap_s <= 0:
            raise ValueError("queue_records and queue_concurrency must be >= 1 and queue_cap_s > 0")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


FULL = BenchConfig()
SMOKE = replace(
    FULL, reps=1, record_sizes=(100,), publish_records=2_000, publish_cap_s=10.0, latency_rate_per_s=200.0,
    latency_duration_s=1.0, latency_warmup_s=0.2, failover_before_s=0.3, failover_timeout_s=15.0,
    recovery_records=2_000, recovery_fill_cap_s=10.0, recovery_timeout_s=30.0, queue_records=1_000,
    systems=("raftbroker-disk-3", "redis"), profile_s=0.0,
)
