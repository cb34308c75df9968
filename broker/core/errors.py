"""Error types of the broker core. ``broker.services.errors`` maps each to one gRPC status."""

from __future__ import annotations

from typing import ClassVar

from broker.reasons import Reason

ECHO_CHARS_MAX = 120


def shown(value: str | bytes, quote: bool = True, chars_max: int = ECHO_CHARS_MAX) -> str:
    """``value`` as an error message may quote it: ``repr`` (or the text itself with ``quote=False``)
    cut to ``chars_max`` characters, with the full length said. Every message that quotes a caller's
    input (a name, a value, an expression) goes through here, so no error echoes a huge input whole."""
    assert chars_max > 0
    text = repr(value) if quote else (value.decode(errors="replace") if isinstance(value, bytes) else value)
    if len(text) <= chars_max:
        return text
    return f"{text[:chars_max]}... ({len(value)} {'bytes' if isinstance(value, bytes) else 'characters'})"


class BrokerError(Exception):
    """Base of every error the core reports to a caller. ``reason`` is its machine-readable kind
    (sent in the status details, :mod:`broker.reasons`); :meth:`metadata` names the resources."""

    reason: ClassVar[Reason] = Reason.INTERNAL

    def metadata(self) -> dict[str, str]:
        """The names of the resources the error is about (``topic``, ``group``, ...); may be empty."""
        return {}


class ApplyFailed(BrokerError):
    """A committed command could not be applied; every node recorded the same failure and moved on
    (INTERNAL: the leader should have refused it before submitting)."""

    reason = Reason.APPLY_FAILED


class InvalidArgument(BrokerError):
    """The request is malformed or breaks a limit; nothing was changed."""

    reason = Reason.INVALID_ARGUMENT


class SessionOutOfSequence(InvalidArgument):
    """A producer-session batch starts past its session's watermark + 1 (SPEC §4); nothing was
    stored. The SDK answers it by opening a new session (its own sessions are used one call at a
    time, so only a reset watermark or a re-created topic causes it)."""

    reason = Reason.SESSION_OUT_OF_SEQUENCE


class TopicNotFound(BrokerError):
    reason = Reason.TOPIC_NOT_FOUND

    def __init__(self, name: str) -> None:
        super().__init__(f"topic {shown(name)} does not exist")
        self.name = name

    def metadata(self) -> dict[str, str]:
        return {"topic": self.name}


class TopicExists(BrokerError):
    reason = Reason.TOPIC_EXISTS

    def __init__(self, name: str) -> None:
        super().__init__(f"topic {shown(name)} already exists")
        self.name = name

    def metadata(self) -> dict[str, str]:
        return {"topic": self.name}


class DuplicateMessage(BrokerError):
    """A record repeats the dedup-field values of a stored record (SPEC §4)."""

    reason = Reason.DUPLICATE_MESSAGE


class NotFound(BrokerError):
    """A named thing other than a topic (e.g. a route) does not exist."""

    reason = Reason.NOT_FOUND


class AlreadyExists(BrokerError):
    """A named thing other than a topic (e.g. a route) already exists."""

    reason = Reason.ALREADY_EXISTS


class FailedPrecondition(BrokerError):
    """The request is well formed but the current state forbids it (e.g. it would close a route cycle)."""

    reason = Reason.FAILED_PRECONDITION


class NotLeader(BrokerError):
    """This node is not the leader; ``leader_address`` is the leader's gRPC address if known.
    ``no_quorum``: this node reaches less than a majority, so the leader it names may be gone."""

    reason = Reason.NOT_LEADER

    def __init__(self, leader_address: str | None, *, no_quorum: bool = False) -> None:
        where = f"the leader is {leader_address}" if leader_address else "no leader is known"
        if no_quorum:
            where += " as far as this node knows, but it reaches less than a majority of the members (no quorum)"
        super().__init__(f"this node is not the leader; {where}")
        self.leader_address = leader_address
        self.no_quorum = no_quorum

    def metadata(self) -> dict[str, str]:
        return {"leader": self.leader_address} if self.leader_address else {}


class Unavailable(BrokerError):
    """No quorum, no leader, or no outcome within the commit timeout."""

    reason = Reason.UNAVAILABLE


class DataLoss(BrokerError):
    """This node's store cannot read data it holds (a damaged file): another node may still serve it."""

    reason = Reason.DATA_LOSS


class NoQuorum(Unavailable):
    """This node reaches less than a majority of the members, so it cannot commit and no leader
    can be elected with it; nothing was written. Clients stop retrying when every node that
    answers says so (the ``x-no-quorum`` trailer), instead of waiting for a failover."""

    reason = Reason.NO_QUORUM


class ResourceExhausted(BrokerError):
    """Back-pressure or a full topic; the request may be retried later."""

    reason = Reason.RESOURCE_EXHAUSTED


class Unimplemented(BrokerError):
    """A declared part of the API that this version does not provide yet."""

    reason = Reason.UNIMPLEMENTED


class GroupNotFound(BrokerError):
    reason = Reason.GROUP_NOT_FOUND

    def __init__(self, topic: str, group: str) -> None:
        super().__init__(f"group {shown(group)} of topic {shown(topic)} does not exist")
        self.topic, self.group = topic, group

    def metadata(self) -> dict[str, str]:
        return {"topic": self.topic, "group": self.group}


class GroupExists(BrokerError):
    reason = Reason.GROUP_EXISTS

    def __init__(self, topic: str, group: str) -> None:
        super().__init__(f"group {shown(group)} of topic {shown(topic)} already exists")
        self.topic, self.group = topic, group

    def metadata(self) -> dict[str, str]:
        return {"topic": self.topic, "group": self.group}


class MemberNotFound(BrokerError):
    reason = Reason.MEMBER_NOT_FOUND

    def __init__(self, node_id: str) -> None:
        super().__init__(f"node {shown(node_id)} is not a member of the cluster")
        self.node_id = node_id

    def metadata(self) -> dict[str, str]:
        return {"node_id": self.node_id}


class MemberExists(BrokerError):
    """A node id or Raft address already belongs to another member."""

    reason = Reason.MEMBER_EXISTS


class RouteNotFound(NotFound):
    reason = Reason.ROUTE_NOT_FOUND

    def __init__(self, name: str) -> None:
        super().__init__(f"route {shown(name)} does not exist")
        self.name = name

    def metadata(self) -> dict[str, str]:
        return {"route": self.name}


class RouteExists(AlreadyExists):
    reason = Reason.ROUTE_EXISTS

    def __init__(self, name: str) -> None:
        super().__init__(f"route {shown(name)} already exists")
        self.name = name

    def metadata(self) -> dict[str, str]:
        return {"route": self.name}
