"""Public requests as the plain inputs the leader-side code takes, through the server's own
translation (``broker.services.wire``), so core tests build their inputs the way the API does."""

from __future__ import annotations

from collections.abc import Iterable

from broker.leader.topic_log import PublishBatch
from broker.services import wire
from broker.v1 import broker_pb2


def publish_request(topic: str, records: Iterable[broker_pb2.PublishRecord], dedup_id: str = "") -> PublishBatch:
    return wire.publish_batch(broker_pb2.PublishRequest(topic=topic, records=records, dedup_id=dedup_id))
