"""How SDK values look on the terminal: JSON-ready dicts and rich tables.

JSON shapes (stable, for scripts):
- topic: ``{"name", "partition_count", "durability", "full_policy", "retention": {"max_age_ms",
  "max_records", "max_bytes"}, "dedup_window_ms", "schema_json", "dedup_fields", "incarnation", "created_ms",
  "records", "bytes", "partitions": [{"partition", "start_offset", "end_offset", "records", "bytes"}]}``;
  ``dedup_window_ms`` is -1 when idempotency keys are kept forever; ``schema_json`` is the topic's JSON
  Schema as text (as ``TopicInfo.schema_json`` in the SDK) or ``null``.
- record: ``{"topic", "partition", "offset", "key", "value", "headers", "timestamp_ms",
  "position", "msg_id", "op", "origin", "producer"}``; ``key``/``value`` are UTF-8 text, or ``null``
  plus ``key_b64``/``value_b64`` (standard base64) when the bytes are not valid UTF-8; ``key`` is
  ``null`` without a key; ``position`` is the base64 resume token (``consume --from token:...``);
  ``msg_id`` is the producer-session message id as a decimal string, ``""`` when the record had
  none; ``op`` is ``insert``, ``update``, ``delete`` or ``tombstone``; ``origin`` is
  ``"<cluster_id>/<node_id>"`` of the node that first accepted the record (routes and mirrors keep
  it); ``producer`` is the authenticated principal that published it, ``""`` without auth.
- publish result: ``{"partition", "offset", "duplicate"}``; ``partition`` and ``offset`` are ``null``
  for a duplicate at or below its producer session's watermark (no original place is kept).
- event: ``{"event", "topic", "partition", "offset_before", "offset_after", "position_before",
  "position_after", "detail"}``; the positions are base64 tokens (``consume --from token:...``).
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # annotations only: the SDK is imported when a command runs (broker/cli/context.py)
    from broker.client import ClusterStatus, Event, PublishResult, Record, ReplicaVerification, TopicInfo


def topic_json(info: TopicInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "partition_count": info.partition_count,
        "durability": info.durability,
        "full_policy": info.full_policy,
        "retention": {
            "max_age_ms": info.retention.max_age_ms,
            "max_records": info.retention.max_records,
            "max_bytes": info.retention.max_bytes,
        },
        "dedup_window_ms": info.dedup_window_ms,
        "schema_json": info.schema_json or None,
        "has_schema": info.has_schema,
        "dedup_fields": list(info.dedup_fields),
        "incarnation": info.incarnation,
        "created_ms": info.created_ms,
        "records": info.records,
        "bytes": info.bytes,
        "partitions": [
            {
                "partition": p.partition,
                "start_offset": p.start_offset,
                "end_offset": p.end_offset,
                "records": p.records,
                "bytes": p.bytes,
            }
            for p in info.partitions
        ],
    }


def _text_or_b64(out: dict[str, Any], name: str, data: bytes | None) -> None:
    if data is None:
        out[name] = None
        return
    try:
        out[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        out[name] = None
        out[f"{name}_b64"] = base64.b64encode(data).decode("ascii")


def record_json(record: Record) -> dict[str, Any]:
    out: dict[str, Any] = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
    _text_or_b64(out, "key", record.key)
    _text_or_b64(out, "value", record.value)
    out["headers"] = dict(record.headers)
    out["timestamp_ms"] = record.timestamp_ms
    out["position"] = base64.b64encode(record.position).decode("ascii")
    out["msg_id"] = record.msg_id
    out["op"] = record.op
    out["origin"] = record.origin
    out["producer"] = record.producer
    return out


def event_json(event: Event) -> dict[str, Any]:
    return {
        "event": event.type,
        "topic": event.topic,
        "partition": event.partition,
        "offset_before": event.offset_before,
        "offset_after": event.offset_after,
        "position_before": base64.b64encode(event.position_before).decode("ascii"),
        "position_after": base64.b64encode(event.position_after).decode("ascii"),
        "detail": event.detail,
    }


def publish_json(result: PublishResult) -> dict[str, Any]:
    if not result.place_known:
        return {"partition": None, "offset": None, "duplicate": True}
    return {"partition": result.partition, "offset": result.offset, "duplicate": result.duplicate}


def publish_line(result: PublishResult) -> str:
    """``partition=P offset=O[ duplicate]``; a duplicate whose original place is not kept shows no place."""
    if not result.place_known:
        return "duplicate (at or below the producer session's watermark: nothing stored; no place is kept)"
    return f"partition={result.partition} offset={result.offset}{' duplicate' if result.duplicate else ''}"


def record_line(record: Record) -> str:
    """``partition:offset [key=K] value`` with undecodable bytes escaped."""
    value = record.value.decode("utf-8", errors="backslashreplace")
    if record.key is None:
        return f"{record.partition}:{record.offset} {value}"
    key = record.key.decode("utf-8", errors="backslashreplace")
    return f"{record.partition}:{record.offset} key={key} {value}"


def event_line(event: Event) -> str:
    detail = f" ({event.detail})" if event.detail else ""
    return (
        f"event {event.type} on {event.topic}/{event.partition}: "
        f"offset {event.offset_before} -> {event.offset_after}{detail}"
    )


def _retention_text(info: TopicInfo) -> str:
    r = info.retention
    parts = [
        f"{label}={value}"
        for label, value in (("age_ms", r.max_age_ms), ("records", r.max_records), ("bytes", r.max_bytes))
        if value is not None
    ]
    return " ".join(parts) or "unlimited"


def _dedup_window_text(info: TopicInfo) -> str:
    if info.dedup_window_ms == -1:
        return "forever"
    return f"{info.dedup_window_ms} ms" if info.dedup_window_ms else "default"


def print_topics(console: Console, topics: list[TopicInfo]) -> None:
    table = Table("name", "partitions", "durability", "records", "bytes", "retention", box=None)
    for info in topics:
        table.add_row(
            info.name,
            str(info.partition_count),
            info.durability,
            str(info.records),
            str(info.bytes),
            _retention_text(info),
        )
    console.print(table if topics else "no topics")


def print_topic(console: Console, info: TopicInfo) -> None:
    console.print(
        f"topic {info.name}: {info.partition_count} partition(s), durability {info.durability}, "
        f"full policy {info.full_policy}, retention {_retention_text(info)}, "
        f"dedup window {_dedup_window_text(info)}, incarnation {info.incarnation}"
    )
    if info.has_schema or info.dedup_fields:
        fields = ", ".join(info.dedup_fields) or "none"
        console.print(f"schema: {'yes' if info.has_schema else 'none'}; dedup fields: {fields}")
    table = Table("partition", "start offset", "end offset", "records", "bytes", box=None)
    for p in info.partitions:
        table.add_row(str(p.partition), str(p.start_offset), str(p.end_offset), str(p.records), str(p.bytes))
    console.print(table)


def status_json(status: ClusterStatus) -> dict[str, Any]:
    return {
        "leader_id": status.leader_id,
        "nodes": [
            {
                "id": n.id,
                "address": n.grpc_address,
                "role": n.role,
                "term": n.term,
                "commit_index": n.commit_index,
                "applied_index": n.applied_index,
                "pid": n.pid,
                "reachable": n.reachable,
                "leader_id": n.leader_id,
                "apply_format": n.apply_format,
                "cluster_format": n.cluster_format,
            }
            for n in status.nodes
        ],
    }


def print_status(console: Console, status: ClusterStatus) -> None:
    table = Table("id", "address", "role", "term", "commit", "applied", "pid", "reachable", box=None)
    for n in status.nodes:
        table.add_row(
            n.id,
            n.grpc_address,
            n.role,
            str(n.term),
            str(n.commit_index),
            str(n.applied_index),
            str(n.pid or "-"),
            "yes" if n.reachable else "NO",
        )
    console.print(table)
    console.print(f"leader: {status.leader_id or 'none'}")


def formats_json(status: ClusterStatus) -> dict[str, Any]:
    """The cluster's command formats (``raftbroker cluster formats``). The cluster's is the leader's
    view (the highest any node has applied when there is no leader). ``held_by``: the nodes that keep
    it from rising: those not answering, else those applying the least when some node applies more."""
    nodes = status.nodes
    leader = next((n for n in nodes if n.id == status.leader_id and n.reachable), None)
    cluster = leader.cluster_format if leader is not None else max((n.cluster_format for n in nodes), default=0)
    silent = [n.id for n in nodes if not n.reachable]
    members_apply = None if silent or not nodes else min(n.apply_format for n in nodes)
    if silent:
        held_by = silent
    elif members_apply is not None and members_apply <= cluster < max(n.apply_format for n in nodes):
        held_by = [n.id for n in nodes if n.apply_format <= cluster]
    else:
        held_by = []
    return {
        "cluster_format": cluster,
        "members_apply": members_apply,
        "held_by": held_by,
        "nodes": [{"id": n.id, "apply_format": n.apply_format if n.reachable else None,
                   "cluster_format": n.cluster_format if n.reachable else None, "reachable": n.reachable}
                  for n in nodes],
    }


def print_formats(console: Console, status: ClusterStatus) -> None:
    found = formats_json(status)
    table = Table("id", "applies up to", "cluster format here", "reachable", box=None)
    for n in found["nodes"]:
        table.add_row(n["id"], "-" if n["apply_format"] is None else str(n["apply_format"]),
                      "-" if n["cluster_format"] is None else str(n["cluster_format"]),
                      "yes" if n["reachable"] else "NO")
    console.print(table)
    cluster, ready, held = found["cluster_format"], found["members_apply"], ", ".join(found["held_by"])
    if ready is None:
        console.print(f"cluster format: {cluster}; {held} not answering: the leader raises the format only once "
                      "every member answers that it applies the newer one")
    elif ready > cluster:
        console.print(f"cluster format: {cluster}; every member applies {ready}: the leader raises it within a "
                      "housekeeping period (unless hold_command_format is set)")
    elif held:
        console.print(f"cluster format: {cluster}; to raise it, upgrade {held}")
    else:
        console.print(f"cluster format: {cluster}; every member applies it and none applies a newer one")


def verify_json(found: ReplicaVerification) -> dict[str, Any]:
    """``raftbroker cluster verify --json``: digests as 8 hex digits, null where a node gave none."""
    return {
        "index": found.index,
        "agreed": found.agreed,
        "differing": list(found.differing),
        "nodes": [{"id": n.id, "reachable": n.reachable, "digest": None if n.digest is None else f"{n.digest:08x}",
                   "error": n.error} for n in found.nodes],
    }


def print_verify(console: Console, found: ReplicaVerification) -> None:
    table = Table("id", "digest", "", box=None)
    for n in found.nodes:
        mark = "DIFFERS" if n.id in found.differing else ("" if n.digest is not None else n.error)
        table.add_row(n.id, "-" if n.digest is None else f"{n.digest:08x}", mark)
    console.print(table)
    if found.agreed:
        console.print(f"every member applied the log alike through index {found.index}")
    elif found.differing:
        console.print(f"at index {found.index}, {', '.join(found.differing)} decided some command differently from "
                      "the others (docs/operations.md, \"Verifying replicas\")")
    elif any(n.digest is not None for n in found.nodes):
        console.print(f"at index {found.index}, the members that gave a digest agree; not every member gave one")
    else:
        console.print("no member gave a digest (the reasons are above); the digests begin when the cluster's "
                      "command format reaches 2: raftbroker cluster formats")
