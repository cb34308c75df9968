"""What a route's copies are (SPEC §3.4), as the leader's router builds them: the record, where
it lands in the target topic and the idempotency key that makes a retried copy a duplicate.

The route definitions and cursors these copies advance are applied by :mod:`broker.core.routes`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from broker.leader import partitioning
from broker.limits import ID_CHARS_MAX
from broker.v1 import internal_pb2

# The header a copy to another cluster carries: the id of the cluster it was sent from (reserved).
# The echo rule compares the origin only, so a record that a third cluster's route brought into one
# of two clusters mirroring each other both ways went back and forth for good (1,000 copies a side
# after 12 s): a remote route also skips a record whose last hop was the target cluster.
VIA_HEADER = "raftbroker-via"
# What a copy may carry beyond the target's record limit: the source accepted the record within the
# same limit, and the copy to another cluster adds VIA_HEADER (a record 25 bytes under the limit was
# refused by the target for good, and skipped: lost to the mirror)
VIA_SLACK_BYTES = 512


def sent_via(body: bytes, cluster_id: str) -> bytes:
    """``body`` (a stored record body) with :data:`VIA_HEADER` set to ``cluster_id``: protobuf merges
    concatenated messages, and a map's last entry for a key wins."""
    return body + internal_pb2.RecordBody(headers={VIA_HEADER: cluster_id}).SerializeToString()


@dataclass(frozen=True, slots=True)
class Copy:
    """One record to copy: its stored body (origin kept), what places it, and its idempotency key."""

    body: bytes
    partition_key: bytes | None
    source_partition: int
    idempotency_key: str
    source_offset: int = -1  # the router's own copies: where the record is in its source partition


def place(partition_key: bytes | None, source_partition: int, partitions: int) -> int:
    """The target partition of a copy: the partition key hashed like a record key
    (``partition_for_key``), else the source partition modulo the target's partitions, so a
    source partition's records stay together and in order."""
    if partition_key is not None:
        return partitioning.partition_for_key(partition_key, partitions)
    return source_partition % partitions


def idempotency_key(cluster_id: str, route_id: int, source_topic_id: int, partition: int, offset: int) -> str:
    """The key a route's copy of one source record carries: the same on every retry and every
    leader, distinct across clusters, routes, source incarnations and records."""
    tail = f":{route_id}:{source_topic_id}:{partition}:{offset}"
    key = f"route:{cluster_id}{tail}"
    if len(key) > ID_CHARS_MAX:
        key = f"route:{hashlib.sha256(cluster_id.encode()).hexdigest()[:32]}{tail}"
    return key


def origin_cluster(origin: str) -> str:
    """The cluster part of a record's origin ``"<cluster_id>/<node_id>"``."""
    return origin.partition("/")[0]
