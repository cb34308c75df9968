"""A publish's idempotency keys and producer-session ids: checked before anything is replicated,
and copied into the append command (``TopicLog.prepare_publish``)."""

from __future__ import annotations

from broker.core import sessions
from broker.core.errors import InvalidArgument
from broker.leader.publishing import PublishBatch
from broker.limits import ID_CHARS_MAX
from broker.v1 import internal_pb2


def check_into(request: PublishBatch, append: internal_pb2.AppendCommand) -> None:
    """Idempotency keys and producer-session ids, checked before anything is replicated."""
    if request.bodies is not None:  # the lean form: no per-record key or msg_id (see PublishBatch)
        _lean_dedup_fields(request, append)
        return
    keys = [r.idempotency_key for r in request.records]
    for i, key in enumerate(keys):
        if len(key) > ID_CHARS_MAX:
            raise InvalidArgument(f"record {i}: idempotency_key is longer than {ID_CHARS_MAX} characters")
    if request.first_msg_id:
        _session_fields(request, append, keys)
        return
    if any(keys):
        append.idempotency_keys.extend(keys)
    ids = [r.msg_id for r in request.records]
    if not request.dedup_id:
        if any(ids):
            raise InvalidArgument("msg_id needs a dedup_id on the request")
        return
    if len(request.dedup_id) > ID_CHARS_MAX:
        raise InvalidArgument(f"dedup_id is longer than {ID_CHARS_MAX} characters")
    for i, msg_id in enumerate(ids):
        if msg_id == 0:
            raise InvalidArgument(f"record {i}: a msg_id (non-zero) is required with dedup_id")
        if i and abs(msg_id) != abs(ids[i - 1]) + 1:
            raise InvalidArgument(
                f"record {i}: msg_id {msg_id} breaks the sequence (|msg_id| must rise by one per message: "
                f"expected {abs(ids[i - 1]) + 1} or {-(abs(ids[i - 1]) + 1)})")
    append.dedup_id = request.dedup_id
    append.msg_ids.extend(ids)


def _lean_dedup_fields(request: PublishBatch, append: internal_pb2.AppendCommand) -> None:
    """:func:`check_into` for a batch in the lean form, with the same refusals in the same order."""
    if not request.first_msg_id and not request.dedup_id:
        return
    if len(request.dedup_id) > ID_CHARS_MAX:
        raise InvalidArgument(f"dedup_id is longer than {ID_CHARS_MAX} characters")
    if not request.first_msg_id:  # a per-record session without its msg_ids
        raise InvalidArgument("record 0: a msg_id (non-zero) is required with dedup_id")
    sessions.check_batch(request.dedup_id, request.first_msg_id, request.count)
    append.dedup_id = request.dedup_id
    append.first_msg_id = request.first_msg_id


def _session_fields(request: PublishBatch, append: internal_pb2.AppendCommand, keys: list[str]) -> None:
    """A producer-session batch by range (``broker.core.sessions``): its numbers, and no
    per-record id beside them (the two forms do not mix within one batch)."""
    if len(request.dedup_id) > ID_CHARS_MAX:
        raise InvalidArgument(f"dedup_id is longer than {ID_CHARS_MAX} characters")
    sessions.check_batch(request.dedup_id, request.first_msg_id, len(request.records))
    for i, rec in enumerate(request.records):
        if rec.msg_id:
            raise InvalidArgument(f"record {i}: give first_msg_id on the request or a msg_id on every record, "
                                  f"not both (record {i} has msg_id {rec.msg_id})")
        if keys[i]:
            raise InvalidArgument(f"record {i}: a first_msg_id batch takes no idempotency_key (the session "
                                  "deduplicates it; publish keyed records in a batch of their own)")
    append.dedup_id = request.dedup_id
    append.first_msg_id = request.first_msg_id
