"""Checks of the SDK's arguments that need no server: types, the ranges of the wire's integer fields,
and copies of the server's own rules, so that a bad value is refused by name (InvalidArgument)
before anything is sent, leased or stored. Pure functions, no I/O; :mod:`broker.client.wire` and
the clients use them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from broker.client.errors import invalid_argument
from broker.client.models import OutgoingRecord

# The ranges of the wire's integer fields: a larger value cannot be sent (protobuf raises a bare
# "Value out of range"), so each is refused here by name (:func:`in_range`).
UINT32_MAX = 2**32 - 1
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
# Copies of the server's rules (broker/core/groups/config.py), so a bad value is refused before
# anything is leased or sent; tests/client/test_sdk_input_checks_unit.py pins them to the originals.
GROUP_NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,99}\Z")
EXTEND_MAX_MS = 12 * 3600 * 1000  # the longest lease an Extend (a claim's visibility_ms) may ask for
NACK_DELAY_MAX_MS = 12 * 3600 * 1000  # the longest a Nack may delay a retry


def in_range(value: int, what: str, low: int, high: int) -> int:
    """``value`` when ``low <= value <= high``, else InvalidArgument naming ``what`` and the range
    (a type's bound is said as such: "between 0 and 2**64 - 1")."""
    if not low <= value <= high:
        said = {UINT32_MAX: "2**32 - 1", INT64_MAX: "2**63 - 1", UINT64_MAX: "2**64 - 1", -INT64_MAX - 1: "-2**63"}
        raise invalid_argument(f"{what} must be between {said.get(low, low)} and {said.get(high, high)}, got {value}")
    return value


def check_int(value: object, what: str, low: int, high: int) -> int:
    """``value`` when it is an int (not a bool) within ``[low, high]``, else InvalidArgument naming
    ``what``, the expected type and the range."""
    if not _is_int(value):
        raise invalid_argument(f"{what} must be an int, got {type(value).__name__} {value!r}")
    assert isinstance(value, int)
    return in_range(value, what, low, high)


def check_str(value: object, what: str) -> str:
    """``value`` when it is a str, else InvalidArgument naming ``what`` and the type it got."""
    if not isinstance(value, str):
        raise invalid_argument(f"{what} must be a str, got {type(value).__name__} {value!r}")
    return value


def check_group(group: object) -> str:
    """A consumer group name as the server accepts it (1-100 of ``A-Z a-z 0-9 _ -``, starting
    with a letter or digit), else InvalidArgument before anything is sent."""
    check_str(group, "group")
    assert isinstance(group, str)
    if not GROUP_NAME_RE.fullmatch(group):
        raise invalid_argument(f"invalid group name {group!r}: use 1-100 characters of A-Z a-z 0-9 _ - "
                               "starting with a letter or digit")
    return group


def prune_before(before_offset: object, group: str | None) -> int:
    """A prune's wire ``before_offset``: the caller's bound (an int >= 0), or 0 ("no bound of its own")
    when only a lead ``group`` bounds it. An explicit 0 with a group is refused: on the wire it would
    mean no bound and prune up to what the group committed, the opposite of "no further than 0"."""
    if before_offset is None:
        if not group:
            raise invalid_argument("give before_offset, or a lead group to prune by")
        return 0
    bound = check_int(before_offset, "before_offset", 0, UINT64_MAX)
    if bound == 0 and group:
        raise invalid_argument("before_offset 0 with a group would delete nothing (no record is below offset "
                               "0); leave before_offset out to prune up to what the group committed")
    return bound


def check_batch(records: object) -> Sequence[Any]:
    """The records of a batch as a sequence: a bare str, bytes, dict or record is refused (it is one
    record, not a batch: give a list of records), as is a value that is not iterable."""
    if isinstance(records, str | bytes | bytearray | memoryview | Mapping | OutgoingRecord):
        raise invalid_argument(f"records must be a list of records, got one {type(records).__name__}: "
                               "give a list of records (e.g. [value])")
    if isinstance(records, Sequence):
        return records
    try:
        return list(records)  # type: ignore[call-overload]
    except TypeError:
        raise invalid_argument(f"records must be a list of records, got {type(records).__name__}") from None


def headers_of(headers: Mapping[str, str] | None) -> Mapping[str, str]:
    """A publish call's ``headers`` for its record: a copy of the mapping, ``{}`` for None; anything
    else is refused (InvalidArgument naming the argument)."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise invalid_argument(f"headers must be a dict of str to str, got {type(headers).__name__}")
    return dict(headers)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
