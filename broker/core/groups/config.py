"""Group configuration: names, defaults, limits and the retry backoff (SPEC §3.2).

A group's config is normalized once by the leader (defaults filled in, limits checked) and then
stored with the group, so every node applies the same values. Units are in the names.
"""

from __future__ import annotations

import re

from broker.core import records
from broker.core.errors import InvalidArgument
from broker.core.topics import NAME_RE
from broker.v1 import internal_pb2

GROUP_NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,99}\Z")
DLQ_SUFFIX = ".dlq"

DEFAULT_VISIBILITY_TIMEOUT_MS = 30_000
DEFAULT_BASE_DELAY_MS = 1_000
DEFAULT_MAX_DELAY_MS = 60_000
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_SESSION_TIMEOUT_MS = 10_000
DEFAULT_MAX_PENDING = 5_000

TIMEOUT_MS_MAX = 12 * 3600 * 1000
MAX_ATTEMPTS_MAX = 1000
MAX_PENDING_MAX = 100_000
TIMEOUT_MS_MIN = 10
# the longest a Nack may delay a retry and the longest lease an Extend may ask for (both bounded
# so that `now + delay` always fits the int64 fields it is stored in, with room to spare)
NACK_DELAY_MAX_MS = TIMEOUT_MS_MAX
EXTEND_MAX_MS = TIMEOUT_MS_MAX
assert 0 < TIMEOUT_MS_MIN < TIMEOUT_MS_MAX < 2**40


def validate_group_name(group: str) -> None:
    """Group names: 1-100 of ``[A-Za-z0-9_-]`` starting with a letter or digit (no dot, so the
    dead-letter topic name ``<topic>.<group>.dlq`` always reads back unambiguously)."""
    if not GROUP_NAME_RE.fullmatch(group):
        raise InvalidArgument(f"invalid group name {group!r}: use 1-100 characters of A-Z a-z 0-9 _ - "
                              "starting with a letter or digit")


MEMBER_ID_CHARS_MAX = 128


def validate_member_id(member_id: str) -> None:
    """A stream-mode member's id (empty where the leader makes one up): at most
    :data:`MEMBER_ID_CHARS_MAX` printable characters. It is echoed in DescribeGroup and logs, so an
    unbounded one could make every DescribeGroup answer too large to send."""
    if len(member_id) > MEMBER_ID_CHARS_MAX or not member_id.isprintable():
        shown = member_id[:40] + ("..." if len(member_id) > 40 else "")
        raise InvalidArgument(f"invalid member_id {shown!r} ({len(member_id)} characters): use at most "
                              f"{MEMBER_ID_CHARS_MAX} printable characters")


def dlq_topic_name(topic: str, group: str) -> str:
    """The dead-letter topic of ``group`` on ``topic``; raises :class:`InvalidArgument` when it would
    not be a valid topic name (too long). The leader checks it before submitting a new group."""
    name = f"{topic}.{group}{DLQ_SUFFIX}"
    if not NAME_RE.fullmatch(name):
        raise InvalidArgument(f"the dead-letter topic name {name!r} would be too long: shorten the topic "
                              "or group name")
    return name


def validate_delay_ms(name: str, value: int, high: int) -> None:
    """``value`` must be in ``[0, high]`` (0 meaning the group's default)."""
    if not 0 <= value <= high:
        raise InvalidArgument(f"{name} must be between 0 and {high} ms, got {value}")


def _positive_or_default(config: internal_pb2.GroupConfig, name: str, default: int, low: int, high: int) -> None:
    value = getattr(config, name)
    if value == 0:
        setattr(config, name, default)
        return
    if not low <= value <= high:
        raise InvalidArgument(f"{name} must be between {low} and {high}, got {value}")


def normalized_group_config(config: internal_pb2.GroupConfig) -> internal_pb2.GroupConfig:
    """A validated copy of ``config`` with every default filled in; raises :class:`InvalidArgument`."""
    out = internal_pb2.GroupConfig()
    out.CopyFrom(config)
    if out.mode == internal_pb2.DELIVERY_MODE_UNSPECIFIED:
        out.mode = internal_pb2.DELIVERY_MODE_QUEUE
    if out.mode not in (internal_pb2.DELIVERY_MODE_QUEUE, internal_pb2.DELIVERY_MODE_STREAM):
        raise InvalidArgument(f"unknown delivery mode {out.mode}")
    if out.backoff == internal_pb2.BACKOFF_UNSPECIFIED:
        out.backoff = internal_pb2.BACKOFF_EXPONENTIAL
    if out.backoff not in (internal_pb2.BACKOFF_FIXED, internal_pb2.BACKOFF_EXPONENTIAL):
        raise InvalidArgument(f"unknown backoff {out.backoff}")
    _positive_or_default(out, "visibility_timeout_ms", DEFAULT_VISIBILITY_TIMEOUT_MS, TIMEOUT_MS_MIN, TIMEOUT_MS_MAX)
    _positive_or_default(out, "base_delay_ms", DEFAULT_BASE_DELAY_MS, 1, TIMEOUT_MS_MAX)
    _positive_or_default(out, "max_delay_ms", max(DEFAULT_MAX_DELAY_MS, out.base_delay_ms), 1, TIMEOUT_MS_MAX)
    _positive_or_default(out, "session_timeout_ms", DEFAULT_SESSION_TIMEOUT_MS, TIMEOUT_MS_MIN, TIMEOUT_MS_MAX)
    _positive_or_default(out, "max_attempts", DEFAULT_MAX_ATTEMPTS, 1, MAX_ATTEMPTS_MAX)
    _positive_or_default(out, "max_pending", DEFAULT_MAX_PENDING, 1, MAX_PENDING_MAX)
    if out.max_delay_ms < out.base_delay_ms:
        raise InvalidArgument(f"max_delay_ms ({out.max_delay_ms}) must not be below base_delay_ms "
                              f"({out.base_delay_ms})")
    if out.ordered and out.mode == internal_pb2.DELIVERY_MODE_STREAM:
        raise InvalidArgument("ordered applies to queue mode (stream mode is ordered per partition already)")
    if not out.HasField("start_from"):
        out.start_from.start = internal_pb2.START_POSITION_EARLIEST
    kind = out.start_from.WhichOneof("kind")
    if kind == "start" and out.start_from.start not in internal_pb2.StartPosition.values():
        raise InvalidArgument(f"unknown start position {out.start_from.start} in start_from")  # as Subscribe says
    if kind == "token":  # decoding raises InvalidArgument for a malformed one; a delivery is not kept
        out.start_from.token = records.PositionToken.decode(out.start_from.token).resumable().encode()
    return out


def retry_delay_ms(config: internal_pb2.GroupConfig, attempts: int) -> int:
    """The wait before the next delivery after ``attempts`` (>= 1) failed ones: ``base`` every time
    (fixed) or ``base * 2**(attempts-1)`` (exponential), never above ``max_delay_ms``."""
    assert attempts >= 1
    if config.backoff == internal_pb2.BACKOFF_FIXED:
        return int(min(config.base_delay_ms, config.max_delay_ms))
    exponent = min(attempts - 1, 62)
    return int(min(config.base_delay_ms * (1 << exponent), config.max_delay_ms))


def is_stream(config: internal_pb2.GroupConfig) -> bool:
    return bool(config.mode == internal_pb2.DELIVERY_MODE_STREAM)
