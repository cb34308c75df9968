"""``raftbroker publish`` and ``raftbroker consume``."""

from __future__ import annotations

import base64
import os
import re
import select
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import IO, TYPE_CHECKING, Annotated

import typer

from broker.cli import render
from broker.cli.context import BootstrapOption, JsonFlag, connect, emit_json, state

if TYPE_CHECKING:  # the SDK is imported when a command runs (broker/cli/context.py)
    from broker.client import Client, Event, OutgoingRecord, PublishResult

STDIN_BATCH_RECORDS = 500
STDIN_BATCH_BYTES_MAX = 1024 * 1024  # keeps one Publish well below gRPC's message limit
TIMESTAMP_MS_MIN = 10**12  # a bare number at or above this is a timestamp (2001-09-09 and later)

FROM_HELP = (
    "Where to start: 'earliest' (default), 'latest', an OFFSET, or a timestamp in ms since the epoch. "
    f"A bare number below {TIMESTAMP_MS_MIN} is an offset, at or above it a timestamp; be explicit "
    "with 'offset:N', 'ts:MS' or 'ts:2024-05-01T12:00:00Z' (ISO 8601), or resume after a record "
    "with 'token:POSITION' (the base64 'position' of --json output, or the HTTP API's)."
)


def register(app: typer.Typer) -> None:
    """Add ``publish`` and ``consume`` to the CLI."""
    app.command("publish")(publish)
    app.command("consume")(consume)


# -- publish ------------------------------------------------------------------------------------


def parse_headers(pairs: list[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` as a dict; raises ``typer.BadParameter`` for an item without ``=``."""
    headers: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{pair!r} is not k=v", param_hint="--header")
        headers[name] = value
    return headers


def stdin_batches(stream: IO[bytes], batch_records: int) -> Iterator[list[bytes]]:
    """Lines of ``stream`` (newline stripped) in batches of at most ``batch_records`` lines and
    about ``STDIN_BATCH_BYTES_MAX`` bytes. A batch is also sent as soon as no more input is
    waiting, so ``tail -f | raftbroker publish`` does not sit on a half-full batch."""
    lines = _LineReader(stream)
    batch: list[bytes] = []
    size = 0
    for line in lines:
        batch.append(line)
        size += len(line)
        if len(batch) >= batch_records or size >= STDIN_BATCH_BYTES_MAX or not lines.waiting():
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


class _LineReader:
    """Lines of a binary stream that can tell whether more input is waiting right now.

    A real file descriptor is read in chunks with ``os.read`` (so no input hides in a Python
    buffer); anything else (tests) is iterated and always reports more input waiting."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        try:
            self._fd: int | None = stream.fileno()
        except (OSError, ValueError, AttributeError):
            self._fd = None
        self._buffered_lines = 0

    def __iter__(self) -> Iterator[bytes]:
        if self._fd is None:
            for line in self._stream:
                yield line[:-1] if line.endswith(b"\n") else line
            return
        pending = b""
        while chunk := os.read(self._fd, 1 << 16):
            *lines, pending = (pending + chunk).split(b"\n")
            self._buffered_lines = len(lines)
            for line in lines:
                self._buffered_lines -= 1
                yield line
        if pending:
            yield pending

    def waiting(self) -> bool:
        if self._fd is None or self._buffered_lines > 0:
            return True
        ready, _, _ = select.select([self._fd], [], [], 0)
        return bool(ready)


def publish(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic to publish to.")],
    values: Annotated[
        list[str] | None,
        typer.Argument(help="Record values; none: read stdin, one record per line (newline stripped).",
                       show_default=False),
    ] = None,
    key: Annotated[str | None, typer.Option("--key", "-k", help="Record key (picks the partition).")] = None,
    partition: Annotated[int | None, typer.Option("--partition", "-p", min=0, help="Explicit partition.")] = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", help="Header k=v (repeatable).", show_default=False)
    ] = None,
    batch_size: Annotated[
        int, typer.Option(min=1, max=10_000, help="Records per Publish request when reading stdin.")
    ] = STDIN_BATCH_RECORDS,
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key", help="Idempotency key of the record (exactly one record): a repeat "
                     "within the topic's dedup window stores nothing and prints the first copy's place "
                     "as a duplicate. Without it, the batch goes in the SDK's producer session, which makes "
                     "retries safe.",
                     show_default=False),
    ] = None,
    dedup_id: Annotated[
        str | None,
        typer.Option("--dedup-id", help="Producer session id (with --msg-id): records at or below the "
                     "session's watermark are discarded as duplicates.", show_default=False),
    ] = None,
    msg_id: Annotated[
        int | None,
        typer.Option("--msg-id", min=1, help="Message id of the first record (with --dedup-id); the records "
                     "get N, N+1, N+2, ... in order.", show_default=False),
    ] = None,
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Publish records and print the partition and offset of each.

    Human output: 'partition=P offset=O' per record, with ' duplicate' appended when the broker
    had the record already (nothing new stored). --json prints one object per record and line:
    {"partition": P, "offset": O, "duplicate": B}. A duplicate by --idempotency-key shows the
    first copy's place; one at or below the --dedup-id watermark shows no place (none is kept):
    'duplicate (...)', and null partition and offset in --json.
    """
    headers = parse_headers(header)
    _check_ids(idempotency_key, dedup_id, msg_id)
    json_output = state(ctx).json
    from broker.client import OutgoingRecord

    with connect(ctx) as client:
        if values:
            batches: Iterator[list[bytes]] = iter([[v.encode() for v in values]])
        else:
            batches = stdin_batches(_binary_stdin(), batch_size)
        if idempotency_key is not None:
            batches = iter([_exactly_one(batches)])
        session = _Session(dedup_id, msg_id) if dedup_id is not None and msg_id is not None else None
        for batch in batches:
            records = [
                OutgoingRecord(value=v, key=key, partition=partition, headers=headers,
                               idempotency_key=idempotency_key)
                for v in batch
            ]
            for result in _publish_chunks(client, topic, records, batch_size, session):
                _print_result(result, json_output)
            sys.stdout.flush()


def _check_ids(idempotency_key: str | None, dedup_id: str | None, msg_id: int | None) -> None:
    """Usage errors of the dedup options (exit 2), before anything is read or sent."""
    if (dedup_id is None) != (msg_id is None):
        raise typer.BadParameter("--dedup-id and --msg-id go together", param_hint="--dedup-id/--msg-id")
    from broker.client import InvalidArgument
    from broker.client.wire import check_id

    for value, hint in ((idempotency_key, "--idempotency-key"), (dedup_id, "--dedup-id")):
        if value is not None:
            try:
                check_id(value, hint)
            except InvalidArgument as err:
                raise typer.BadParameter(err.message, param_hint=hint) from None


def _exactly_one(batches: Iterator[list[bytes]]) -> list[bytes]:
    values = [v for batch in batches for v in batch]
    if len(values) != 1:
        raise typer.BadParameter(f"needs exactly one record, got {len(values)}", param_hint="--idempotency-key")
    return values


class _Session:
    """The next message id of a producer session (``--dedup-id``/``--msg-id``)."""

    def __init__(self, dedup_id: str, first_msg_id: int) -> None:
        self.dedup_id = dedup_id
        self.next_msg_id = first_msg_id


def _publish_chunks(
    client: Client, topic: str, records: list[OutgoingRecord], batch_size: int, session: _Session | None = None
) -> Iterator[PublishResult]:
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        if session is None:
            yield from client.publish_batch(topic, chunk)
            continue
        results = client.publish_batch(topic, chunk, dedup_id=session.dedup_id, first_msg_id=session.next_msg_id)
        session.next_msg_id += len(chunk)
        yield from results


def _binary_stdin() -> IO[bytes]:
    buffer = getattr(sys.stdin, "buffer", None)
    return buffer if buffer is not None else _EncodedText(sys.stdin)  # type: ignore[return-value]


class _EncodedText:
    """A text stream read as UTF-8 bytes lines (for stdin replacements without ``.buffer``)."""

    def __init__(self, text: IO[str]) -> None:
        self._text = text

    def __iter__(self) -> Iterator[bytes]:
        return (line.encode() for line in self._text)


def _print_result(result: PublishResult, json_output: bool) -> None:
    if json_output:
        emit_json(render.publish_json(result))
    else:
        sys.stdout.write(render.publish_line(result) + "\n")


# -- consume ------------------------------------------------------------------------------------


def emit_event(event: Event, json_output: bool) -> None:
    """A stream event (skip-forward, reset, badmsg, gap, ...): a JSON line on stdout with ``--json``,
    else a line on stderr (stdout keeps only records)."""
    if json_output:
        emit_json(render.event_json(event))
    else:
        sys.stderr.write(f"raftbroker: {render.event_line(event)}\n")


def parse_from(text: str, option: str = "--from") -> tuple[str | int | bytes, int | None]:
    """``--from`` (or ``option``: ``group seek --to``) as ``(start, timestamp_ms)`` for
    ``Client.subscribe`` (see ``FROM_HELP``)."""
    value = text.strip()
    kind, sep, rest = value.partition(":")
    why = ""
    try:
        if value in ("earliest", "latest"):
            return value, None
        if not sep:
            number = int(value)
            if number < 0:
                raise ValueError("negative")
            return ("earliest", number) if number >= TIMESTAMP_MS_MIN else (number, None)
        if kind == "offset":
            offset = int(rest)
            if offset < 0:
                raise ValueError("negative")
            return offset, None
        if kind in ("ts", "time"):
            return "earliest", _timestamp_ms(rest)
        if kind == "token":
            return _token(rest), None
    except NoTimeZone as exc:
        why = f" ({exc})"
    except ValueError:
        pass
    start_help = FROM_HELP if option == "--from" else (
        FROM_HELP.replace("Where to start: ", "Where to move the position: ").replace(" (default)", ""))
    raise typer.BadParameter(f"cannot read {text!r}{why}; {start_help}", param_hint=option)


def _token(text: str) -> bytes:
    """A position token as ``consume --json`` writes it (base64) or as the HTTP API does (``position``,
    ``receipt``: unpadded base64url); raises ValueError for anything else."""
    if _URLSAFE_B64.fullmatch(text) and ("-" in text or "_" in text or len(text) % 4):
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    return base64.b64decode(text, validate=True)


_URLSAFE_B64 = re.compile(r"[A-Za-z0-9_-]+")


class NoTimeZone(ValueError):
    """An ISO timestamp without a zone: which instant it names depends on the machine."""


def _timestamp_ms(text: str) -> int:
    if text.lstrip("-").isdigit():
        return int(text)
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise NoTimeZone(f"an ISO timestamp needs a time zone, e.g. {text}T00:00:00Z" if "T" not in text
                         else f"an ISO timestamp needs a time zone, e.g. {text}Z")
    return int(moment.timestamp() * 1000)


def consume(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic to read.")],
    from_: Annotated[str, typer.Option("--from", "-f", help=FROM_HELP)] = "earliest",
    partition: Annotated[int | None, typer.Option("--partition", "-p", min=0, help="Only this partition.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", "-n", min=1, help="Stop after N records.")] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Keep waiting for new records (live tail).")] = False,
    filter_: Annotated[
        str | None,
        typer.Option("--filter", help="Boolean CEL expression evaluated by the server on each record, e.g. "
                     "'value.type == \"order.paid\" && headers.source == \"checkout\"'. Variables: key (bytes: "
                     "key == b\"k1\" or string(key) == \"k1\"), headers (map of strings), op (string), partition "
                     "and timestamp_ms (ints), value (the JSON document, else the bytes; guard fields with "
                     "has(value.f)). Non-boolean filters, nested comprehensions and costly ones are refused.",
                     show_default=False),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option("--group", "-g", help="Consume as a member of this consumer group: each record printed is "
                     "acknowledged after it is printed (see 'raftbroker group').", show_default=False),
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option("--mode", help="With --group, when the group is created: queue (default) or stream.",
                     show_default=False),
    ] = None,
    exec_: Annotated[
        str | None,
        typer.Option("--exec", help="With --group: run this shell command per record, value on its stdin and "
                     "RAFTBROKER_TOPIC/GROUP/PARTITION/OFFSET/KEY/DELIVERY_ATTEMPT/POSITION in its environment; "
                     "exit 0 acks the record, any other exit nacks it (retried, then dead-lettered).",
                     show_default=False),
    ] = None,
    nack_delay_ms: Annotated[
        int | None,
        typer.Option("--nack-delay-ms", min=1, help="With --exec: redeliver a nacked record after this many ms "
                     "(default: the group's backoff).", show_default=False),
    ] = None,
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Print records from a position; stops at the end of the log unless --follow.

    Human output: 'PARTITION:OFFSET [key=KEY] VALUE' per record; events go to stderr.
    --json: one object per line. Records: {"topic", "partition", "offset", "key", "value",
    "headers", "timestamp_ms", "position", "msg_id"}; key and value are UTF-8 text, or null with
    "key_b64"/"value_b64" (base64) when not valid UTF-8. Events (data loss or a reset is never
    silent): {"event": "skip_forward"|"reset"|"badmsg"|"gap", "topic", "partition",
    "offset_before", "offset_after", "position_before", "position_after", "detail"}.
    With --group G: records come as leases of consumer group G (created on first use, starting at
    --from), each acked once printed, or handed to --exec (see broker.cli.group_consume); without
    --follow it stops once nothing more is available now; --json records also carry
    "delivery_attempt". A paused group is reported (stderr; --json: {"event": "paused", ...}).
    SIGTERM stops a group consumer at once and gives its unsettled records back (exit 143).
    """
    if group is None and (exec_ is not None or nack_delay_ms is not None):
        raise typer.BadParameter("--exec and --nack-delay-ms need --group (they settle leases)",
                                 param_hint="--exec")
    if group is None and mode is not None:
        raise typer.BadParameter("--mode needs --group (it is the mode of the group created on first use)",
                                 param_hint="--mode")
    if group is not None and filter_:
        raise typer.BadParameter("a consumer group cannot filter its deliveries (the broker refuses it: skipped "
                                 "records would have to be settled for the whole group); filter in a handler, "
                                 "or route the matching records into their own topic and consume that",
                                 param_hint="--filter/--group")
    if group is not None:
        from broker.cli.group_consume import consume_group  # late: it imports this module

        consume_group(ctx, topic, group, mode=mode, from_=from_, limit=limit, follow=follow, partition=partition,
                      exec_=exec_, nack_delay_ms=nack_delay_ms)
        return
    start, timestamp_ms = parse_from(from_)
    json_output = state(ctx).json
    delivered = 0
    from broker.client import Event

    with connect(ctx) as client, client.subscribe(
        topic, partition=partition, start=start, timestamp_ms=timestamp_ms, stop_at_end=not follow, filter=filter_
    ) as subscription:
        for item in subscription:
            if isinstance(item, Event):
                emit_event(item, json_output)
                continue
            if json_output:
                emit_json(render.record_json(item))
            else:
                sys.stdout.write(render.record_line(item) + "\n")
            delivered += 1
            if follow:
                sys.stdout.flush()
            if limit is not None and delivered >= limit:
                break
        sys.stdout.flush()
