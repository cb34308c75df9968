"""Error types of the broker core. ``broker.services.errors`` maps each to one gRPC status."""

from __future__ import annotations


class BrokerError(Exception):
    """Base of every error the core reports to a caller."""


class ApplyFailed(BrokerError):
    """A committed command could not be applied; every node recorded the same failure and moved on
    (INTERNAL: the leader should have refused it before submitting)."""


class InvalidArgument(BrokerError):
    """The request is malformed or breaks a limit; nothing was changed."""


class TopicNotFound(BrokerError):
    def __init__(self, name: str) -> None:
        super().__init__(f"topic {name!r} does not exist")
        self.name = name


class TopicExists(BrokerError):
    def __init__(self, name: str) -> None:
        super().__init__(f"topic {name!r} already exists")
        self.name = name


class DuplicateMessage(BrokerError):
    """A record repeats the dedup-field values of a stored record (SPEC §4)."""


class NotFound(BrokerError):
    """A named thing other than a topic (e.g. a route) does not exist."""


class AlreadyExists(BrokerError):
    """A named thing other than a topic (e.g. a route) already exists."""


class FailedPrecondition(BrokerError):
    """The request is well formed but the current state forbids it (e.g. it would close a route cycle)."""


class NotLeader(BrokerError):
    """This node is not the leader; ``leader_address`` is the leader's gRPC address if known."""

    def __init__(self, leader_address: str | None) -> None:
        where = f"the leader is {leader_address}" if leader_address else "no leader is known"
        super().__init__(f"this node is not the leader; {where}")
        self.leader_address = leader_address


class Unavailable(BrokerError):
    """No quorum, no leader, or no outcome within the commit timeout."""


class ResourceExhausted(BrokerError):
    """Back-pressure or a full topic; the request may be retried later."""


class Unimplemented(BrokerError):
    """A declared part of the API that this version does not provide yet."""


class GroupNotFound(BrokerError):
    def __init__(self, topic: str, group: str) -> None:
        super().__init__(f"group {group!r} of topic {topic!r} does not exist")
        self.topic, self.group = topic, group


class GroupExists(BrokerError):
    def __init__(self, topic: str, group: str) -> None:
        super().__init__(f"group {group!r} of topic {topic!r} already exists")
        self.topic, self.group = topic, group


class MemberNotFound(BrokerError):
    def __init__(self, node_id: str) -> None:
        super().__init__(f"node {node_id!r} is not a member of the cluster")
        self.node_id = node_id


class MemberExists(BrokerError):
    """A node id or Raft address already belongs to another member."""
