"""Options of the ``raftbroker`` Spark data source, parsed and validated on the driver.

Every bad option raises :class:`SparkOptionError` naming the option, when the query is defined or
started (``load()`` / ``start()`` / ``save()``), never inside an executor. Option names are
case-insensitive (Spark lower-cases them). An option name the reader (or writer) does not know is
refused, naming it and listing the known ones (a misspelled ``startingOffset`` would otherwise be
ignored); the options Spark adds itself (``SPARK_OPTIONS``: ``path``, ``checkpointLocation``...)
are allowed.

Reader: ``bootstrap`` (required), ``topic`` (required), ``startingOffsets`` / ``endingOffsets``
("earliest", "latest" or JSON ``{"0": 12, "1": -2}`` with -2 = earliest, -1 = latest),
``startingTimestamp`` (ms), ``maxRecordsPerPartition`` (batch split), ``maxRecordsPerTrigger``
(streams), ``failOnDataLoss`` (default true), ``valueFormat`` ("binary" or "json").
Writer: ``bootstrap``, ``topic``, ``publishBatchRecords`` (records per publish call).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

EARLIEST = -2
LATEST = -1
PUBLISH_BATCH_RECORDS_MAX = 10_000
VALUE_FORMATS = ("binary", "json")
READER_OPTIONS = ("bootstrap", "topic", "startingOffsets", "startingTimestamp", "endingOffsets",
                  "maxRecordsPerPartition", "maxRecordsPerTrigger", "failOnDataLoss", "valueFormat")
WRITER_OPTIONS = ("bootstrap", "topic", "publishBatchRecords")
# Added by Spark itself: load(path)/save(path)/start(path), load([paths]), checkpoints, query names.
SPARK_OPTIONS = ("path", "paths", "checkpointLocation", "queryName")


class SparkOptionError(ValueError):
    """A data source option is missing or malformed; the message names the option."""


@dataclass(frozen=True)
class Offsets:
    """A starting or ending position: every partition at ``default`` (EARLIEST or LATEST), except
    those given in ``per_partition`` (an offset >= 0, or EARLIEST/LATEST)."""

    default: int
    per_partition: Mapping[int, int]

    def for_partition(self, partition: int) -> int:
        return self.per_partition.get(partition, self.default)


@dataclass(frozen=True)
class ReaderOptions:
    bootstrap: str
    topic: str
    starting: Offsets
    ending: Offsets
    starting_timestamp_ms: int | None
    max_records_per_partition: int | None
    max_records_per_trigger: int | None
    fail_on_data_loss: bool
    value_format: str


@dataclass(frozen=True)
class WriterOptions:
    bootstrap: str
    topic: str
    publish_batch_records: int


def _get(options: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    for key, value in options.items():
        if key.lower() == wanted:
            return str(value)
    return None


def check_known(options: Mapping[str, str], known: Sequence[str], side: str) -> None:
    """Refuse an option name that is neither in ``known`` nor one Spark adds (``SPARK_OPTIONS``),
    naming it (with the closest known name) and listing the known ones."""
    allowed = {name.lower() for name in (*known, *SPARK_OPTIONS)}
    unknown = sorted(str(key) for key in options if str(key).lower() not in allowed)
    if not unknown:
        return
    by_lower = {name.lower(): name for name in known}
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key.lower(), list(by_lower), n=1)
        hints.append(f"{key!r}" + (f" (did you mean {by_lower[close[0]]!r}?)" if close else ""))
    raise SparkOptionError(f"raftbroker: unknown {side} option {', '.join(hints)}; the {side} options are "
                           f"{', '.join(known)}")


def _required(options: Mapping[str, str], name: str) -> str:
    value = _get(options, name)
    if value is None or not value.strip():
        raise SparkOptionError(f"raftbroker: option {name!r} is required (e.g. .option({name!r}, ...))")
    return value.strip()


def _positive_int(options: Mapping[str, str], name: str, default: int | None, maximum: int | None = None
                  ) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SparkOptionError(f"raftbroker: option {name!r} must be a positive integer, got {raw!r}") from None
    if value <= 0 or (maximum is not None and value > maximum):
        limit = f" and at most {maximum}" if maximum is not None else ""
        raise SparkOptionError(f"raftbroker: option {name!r} must be > 0{limit}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise SparkOptionError(f"raftbroker: option {name!r} must be true or false, got {raw!r}")
    return raw.strip().lower() == "true"


def parse_offsets(name: str, raw: str | None, default: int) -> Offsets:
    """``earliest``, ``latest`` or a JSON object of partition -> offset (-2 earliest, -1 latest)."""
    if raw is None:
        return Offsets(default, {})
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return Offsets(EARLIEST if text.lower() == "earliest" else LATEST, {})
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as err:
        raise SparkOptionError(f"raftbroker: option {name!r} is neither earliest, latest nor JSON "
                               f"like {{\"0\": 5}}: {err.msg} at character {err.pos} of {text!r}") from None
    if not isinstance(parsed, dict):
        raise SparkOptionError(f"raftbroker: option {name!r} must be a JSON object of partition -> offset, "
                               f"got {text!r}")
    per_partition: dict[int, int] = {}
    for key, value in parsed.items():
        if not str(key).isdigit():
            raise SparkOptionError(f"raftbroker: option {name!r}: partition {key!r} is not an integer >= 0")
        if not isinstance(value, int) or isinstance(value, bool) or value < EARLIEST:
            raise SparkOptionError(f"raftbroker: option {name!r}: offset of partition {key} must be an integer "
                                   f">= 0, or -2 (earliest) / -1 (latest), got {value!r}")
        per_partition[int(key)] = value
    return Offsets(default, per_partition)


def reader_options(options: Mapping[str, str], *, streaming: bool) -> ReaderOptions:
    """Validate a reader's options; streams start at latest by default, batch reads at earliest."""
    check_known(options, READER_OPTIONS, "reader")
    starting_raw = _get(options, "startingOffsets")
    timestamp_raw = _get(options, "startingTimestamp")
    timestamp_ms: int | None = None
    if timestamp_raw is not None:
        if starting_raw is not None:
            raise SparkOptionError("raftbroker: give startingOffsets or startingTimestamp, not both")
        timestamp_ms = _positive_int(options, "startingTimestamp", None)
    ending = parse_offsets("endingOffsets", _get(options, "endingOffsets"), LATEST)
    if streaming and _get(options, "endingOffsets") is not None:
        raise SparkOptionError("raftbroker: endingOffsets applies to batch reads only (a stream has no end)")
    if any(v == EARLIEST for v in ending.per_partition.values()) or ending.default == EARLIEST:
        raise SparkOptionError("raftbroker: endingOffsets cannot be earliest")
    value_format = (_get(options, "valueFormat") or "binary").strip().lower()
    if value_format not in VALUE_FORMATS:
        raise SparkOptionError(f"raftbroker: option 'valueFormat' must be one of {', '.join(VALUE_FORMATS)}, "
                               f"got {value_format!r}")
    starting = parse_offsets("startingOffsets", starting_raw, LATEST if streaming else EARLIEST)
    for partition, start in sorted(starting.per_partition.items()):
        end = ending.for_partition(partition)
        if start >= 0 and end >= 0 and start > end:  # both given: the cluster need not be asked
            raise SparkOptionError(f"raftbroker: topic {_get(options, 'topic')!r} partition {partition}: "
                                   f"startingOffsets {start} is after endingOffsets {end}")
    return ReaderOptions(
        bootstrap=_required(options, "bootstrap"),
        topic=_required(options, "topic"),
        starting=starting,
        ending=ending,
        starting_timestamp_ms=timestamp_ms,
        max_records_per_partition=_positive_int(options, "maxRecordsPerPartition", None),
        max_records_per_trigger=_positive_int(options, "maxRecordsPerTrigger", None),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        value_format=value_format,
    )


def writer_options(options: Mapping[str, str]) -> WriterOptions:
    """Validate a writer's options."""
    check_known(options, WRITER_OPTIONS, "writer")
    batch = _positive_int(options, "publishBatchRecords", 500, PUBLISH_BATCH_RECORDS_MAX)
    assert batch is not None
    return WriterOptions(bootstrap=_required(options, "bootstrap"), topic=_required(options, "topic"),
                         publish_batch_records=batch)
