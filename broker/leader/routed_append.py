"""Appending routed copies: stored record bodies go into a topic verbatim, so they keep their origin.

This is the router's side door to the log, never reachable from the public ``Publish`` RPC (which
always stamps this node's origin): the local router calls it directly, and a remote cluster's
router calls it through the ``Mirror`` service. It checks what ``TopicLog.publish`` checks (limits,
the target's schema and dedup fields) and then submits the same ``AppendCommand``, each copy with
its idempotency key, so a copy retried after a failover is stored once.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from broker.clock import Clock
from broker.core.applied import Appended, Rejected
from broker.core.errors import FailedPrecondition, InvalidArgument, TopicNotFound
from broker.core.state_machine import BrokerStateMachine
from broker.core.topics import validate_name
from broker.leader import memory_topics, schemas
from broker.leader.route_copies import VIA_SLACK_BYTES, Copy, origin_cluster, place
from broker.leader.submitter import CommandSubmitter
from broker.limits import ID_CHARS_MAX, Limits
from broker.v1 import internal_pb2


class TrustedAppender:
    """Appends :class:`Copy` batches all-or-nothing on the leader; see the module docstring."""

    def __init__(self, state: BrokerStateMachine, submitter: CommandSubmitter, limits: Limits, cluster_id: str,
                 clock: Clock) -> None:
        self._state = state
        self._submitter = submitter
        self._limits = limits
        self._cluster_id = cluster_id
        self._schemas = schemas.SchemaCache()
        self._clock = clock

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    def append(self, topic: str, copies: Sequence[Copy], *, foreign: bool = False) -> Appended:
        """Append ``copies`` to ``topic``; ``foreign``: they come from another cluster, whose
        records must carry an origin that is not this cluster (a mirror never echoes)."""
        self._submitter.ensure_leader()
        validate_name(topic)
        meta = self._state.topic(topic)
        if meta is None:
            raise TopicNotFound(topic)
        if meta.config.durability == internal_pb2.DURABILITY_EPHEMERAL:  # the target's state, not the records':
            # a route backs off and says so (as INVALID_ARGUMENT it skipped every record, silently)
            raise FailedPrecondition(f"topic {topic!r} is ephemeral: routes copy only into stored topics")
        if not copies:
            raise InvalidArgument("an append needs at least one record")
        if len(copies) > self._limits.batch_records_max:
            raise InvalidArgument(f"batch of {len(copies)} records is over the limit of "
                                  f"{self._limits.batch_records_max}")
        bodies = [self._check(i, c, foreign) for i, c in enumerate(copies)]
        total = sum(len(c.body) for c in copies)
        if total > self._limits.batch_bytes_max:
            raise InvalidArgument(f"batch of {total} bytes is over the limit of {self._limits.batch_bytes_max} bytes")
        cmd = internal_pb2.Command()
        append = cmd.append
        append.topic, append.topic_id = topic, meta.topic_id
        append.partitions.extend(place(c.partition_key, c.source_partition, meta.config.partitions) for c in copies)
        append.bodies.extend(c.body for c in copies)
        append.idempotency_keys.extend(c.idempotency_key for c in copies)
        config = meta.config
        append.unique_keys.extend(self._schemas.check_documents(meta.topic_id, config.schema_json, config.dedup_fields,
                                                                (b.value for b in bodies)))
        release = memory_topics.check_append(self._state, meta, total, self._limits.memory_topics_bytes_max)
        append.now_ms = self._clock.now_ms()
        try:
            result = self._submitter.submit(cmd, sync=meta.config.durability == internal_pb2.DURABILITY_FSYNC)
        finally:
            release()
        if isinstance(result, Rejected):
            raise result.error
        assert isinstance(result, Appended) and len(result) == len(copies)
        return result

    def _check(self, i: int, copy: Copy, foreign: bool) -> internal_pb2.RecordBody:
        if not copy.idempotency_key or len(copy.idempotency_key) > ID_CHARS_MAX:
            raise InvalidArgument(f"record {i}: a routed copy needs an idempotency_key of 1 to {ID_CHARS_MAX} "
                                  "characters")
        if len(copy.body) > self._limits.record_bytes_max + VIA_SLACK_BYTES:  # what a route adds (route_copies)
            raise InvalidArgument(f"record {i} is {len(copy.body)} bytes, over the limit of "
                                  f"{self._limits.record_bytes_max} bytes")
        try:
            body = internal_pb2.RecordBody.FromString(copy.body)
        except DecodeError:
            raise InvalidArgument(f"record {i}: body is not a stored record") from None
        unknown = UnknownFieldSet(body)
        if unknown:
            # stored bodies are merged into delivered Records by their bytes: a field RecordBody lacks
            # (a Record's topic, offset, position, delivery attempt...) would reach every reader forged
            numbers = sorted({field.field_number for field in unknown})
            raise InvalidArgument(f"record {i}: body has fields a stored record does not (numbers {numbers})")
        if body.op not in internal_pb2.Op.values():
            raise InvalidArgument(f"record {i}: unknown op {body.op}")
        if not body.origin:
            raise InvalidArgument(f"record {i}: a routed copy must carry its origin")
        if foreign and origin_cluster(body.origin) == self._cluster_id:
            raise InvalidArgument(f"record {i}: its origin {body.origin!r} is this cluster; a mirror never "
                                  "brings a record back to the cluster it came from")
        return body
