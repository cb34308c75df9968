"""Python SDK of raftbroker (synchronous): ``with Client(["127.0.0.1:7001"]) as c: ...``.

Public API: :class:`Client`, the value types it returns (:class:`TopicInfo`,
:class:`PartitionInfo`, :class:`PublishResult`, :class:`PublishResults`, :class:`Record`, :class:`Event`,
:class:`NodeInfo`, :class:`ClusterStatus`, :class:`Retention`, :class:`OutgoingRecord`,
:class:`Watermark`, :class:`RouteInfo`, :class:`Batch`), the iterators :class:`Subscription` and
:class:`BatchSubscription` (``subscribe_batches``: one object per batch, for throughput), typed topics
(:class:`TypedTopic` from ``client.topic(name, PydanticModel)``, see :mod:`broker.client.typed`),
the error types rooted at :class:`BrokerError`, and :class:`NodeProbe` (asks exactly one node: no leader
following, no retries; for tools and drills that watch single nodes).

Delivery guarantees: publishing is exactly-once in effect, because every record carries an
idempotency key that retries reuse (see :meth:`Client.publish_batch`); reading is at-least-once
per record and never skips one (see :mod:`broker.client.subscription`).
"""

from broker.client.client import Client
from broker.client.consumer import Consumer, Message
from broker.client.errors import (
    AlreadyExists,
    BrokerError,
    DeadlineExceeded,
    DuplicateMessageError,
    FailedPrecondition,
    GroupExists,
    GroupNotFound,
    InvalidArgument,
    MemberExists,
    MemberNotFound,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    RouteExists,
    RouteNotFound,
    SchemaMismatchError,
    SessionOutOfSequence,
    TopicExists,
    TopicNotFound,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from broker.client.groups import DeadLetter, DeadLettersRetried, GroupInfo, GroupLag, Groups, PartitionLag
from broker.client.models import (
    Batch,
    ClusterStatus,
    Event,
    NodeDigest,
    NodeInfo,
    OutgoingRecord,
    PartitionInfo,
    PublishResult,
    PublishResults,
    Record,
    ReplicaVerification,
    Retention,
    TopicInfo,
    Watermark,
)
from broker.client.probe import NodeProbe
from broker.client.ranges import MissingRange
from broker.client.routes import RouteInfo, RoutePartition
from broker.client.security import CLIENT_CONFIG_ENV, ClientConfigError, ClientSecurity, load_client_config
from broker.client.subscription import BatchSubscription, Subscription
from broker.client.typed import TypedSubscription, TypedTopic

__all__ = [
    "AlreadyExists",
    "Batch",
    "BatchSubscription",
    "PermissionDenied",
    "Unauthenticated",
    "CLIENT_CONFIG_ENV",
    "ClientConfigError",
    "ClientSecurity",
    "load_client_config",
    "BrokerError",
    "Client",
    "Consumer",
    "ClusterStatus",
    "DeadLetter",
    "DeadLettersRetried",
    "DeadlineExceeded",
    "DuplicateMessageError",
    "FailedPrecondition",
    "Event",
    "GroupExists",
    "GroupInfo",
    "GroupLag",
    "GroupNotFound",
    "Groups",
    "InvalidArgument",
    "SessionOutOfSequence",
    "MemberExists",
    "MemberNotFound",
    "Message",
    "MissingRange",
    "NodeDigest",
    "NodeInfo",
    "NodeProbe",
    "NotFound",
    "OutgoingRecord",
    "PartitionInfo",
    "PartitionLag",
    "PublishResult",
    "PublishResults",
    "Record",
    "ResourceExhausted",
    "ReplicaVerification",
    "Retention",
    "RouteExists",
    "RouteInfo",
    "RouteNotFound",
    "RoutePartition",
    "SchemaMismatchError",
    "Subscription",
    "TopicExists",
    "TopicInfo",
    "TopicNotFound",
    "TypedSubscription",
    "TypedTopic",
    "Unavailable",
    "Unimplemented",
    "Watermark",
]
