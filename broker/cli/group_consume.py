"""``raftbroker consume --group``: the records leased to one member of a consumer group.

Contract:
- Each record is printed, then acknowledged (``--json``: one object per record and line, with
  ``"delivery_attempt"``).
- ``--exec CMD``: instead of printing, each record's value is written to the standard input of
  ``CMD`` (run by ``/bin/sh -c``), whose environment names the record (:data:`ENV_VARS`). Exit
  status 0 acknowledges the record; any other status nacks it (redelivered after
  ``--nack-delay-ms``, else after the group's backoff; dead-lettered after ``max_attempts``
  failures). Records are handled one at a time, in delivery order. The command's output goes to
  this process's stdout (its stderr with ``--json``, so stdout stays JSON); a nack is reported on
  stderr (``--json``: ``{"event": "nacked", ...}`` on stdout).
- A paused group delivers nothing: that is said once, at the start, on stderr (``--json``:
  ``{"event": "paused", "topic", "group", "detail"}`` on stdout), rather than looking like an
  empty group.
- SIGTERM stops the consumer at once (a running ``--exec`` command is killed): records leased to
  it and not settled are given back for immediate redelivery, and it exits with 143.
"""

from __future__ import annotations

import os
import subprocess
import sys

import typer

from broker.cli import render
from broker.cli.context import connect, emit_json, state
from broker.cli.data import emit_event, parse_from
from broker.cli.terminate import EXIT_TERMINATED, Terminated, sigterm_unwinds
from broker.client import Client, Consumer, Event, Message, TopicNotFound

IN_FLIGHT_MAX = 100
ENV_VARS = ("RAFTBROKER_TOPIC", "RAFTBROKER_GROUP", "RAFTBROKER_PARTITION", "RAFTBROKER_OFFSET",
            "RAFTBROKER_KEY", "RAFTBROKER_DELIVERY_ATTEMPT", "RAFTBROKER_POSITION")


def consume_group(ctx: typer.Context, topic: str, group: str, *, mode: str | None, from_: str, limit: int | None,
                  follow: bool, partition: int | None, exec_: str | None = None,
                  nack_delay_ms: int | None = None) -> None:
    """Print (or hand to ``exec_``) the records leased to this member of ``group``; see the module doc."""
    if partition is not None:
        raise typer.BadParameter("a group member reads the partitions its group gives it", param_hint="--partition")
    if mode not in (None, "queue", "stream"):
        raise typer.BadParameter(f"{mode!r} is not queue or stream", param_hint="--mode")
    if nack_delay_ms is not None and exec_ is None:
        raise typer.BadParameter("only --exec nacks records", param_hint="--nack-delay-ms")
    start, timestamp_ms = parse_from(from_)
    json_output = state(ctx).json
    in_flight = 1 if exec_ is not None else min(limit or IN_FLIGHT_MAX, IN_FLIGHT_MAX)
    terminated = False
    with connect(ctx) as client:
        try:
            with sigterm_unwinds():
                _say_if_paused(client, topic, group, json_output, follow)
                with client.subscribe(topic, group=group, mode=mode, start=start, timestamp_ms=timestamp_ms,
                                      stop_at_end=not follow, max_in_flight=in_flight) as consumer:
                    _deliver(consumer, limit, json_output, exec_, nack_delay_ms)
        except Terminated:
            terminated = True
    if terminated:
        raise typer.Exit(EXIT_TERMINATED)


def _say_if_paused(client: Client, topic: str, group: str, json_output: bool, follow: bool) -> None:
    try:
        paused = client.groups.describe(topic, group).paused
    except TopicNotFound:  # a group created by this consumer (or no topic: the subscription says so)
        return
    if not paused:
        return
    detail = (f"group {group} of topic {topic} is paused: nothing is delivered until "
              f"'raftbroker group resume {topic} {group}'" + ("; waiting" if follow else ""))
    if json_output:
        emit_json({"event": "paused", "topic": topic, "group": group, "detail": detail})
        sys.stdout.flush()
    else:
        sys.stderr.write(f"raftbroker: {detail}\n")
        sys.stderr.flush()


def _deliver(consumer: Consumer, limit: int | None, json_output: bool, exec_: str | None,
             nack_delay_ms: int | None) -> None:
    delivered = 0
    for item in consumer:
        if isinstance(item, Event):
            emit_event(item, json_output)
            continue
        assert isinstance(item, Message)
        if exec_ is not None:
            _run_handler(item, consumer.group, exec_, nack_delay_ms, json_output)
        else:
            if json_output:
                emit_json({**render.record_json(item.record), "delivery_attempt": item.delivery_attempt})
            else:
                sys.stdout.write(render.record_line(item.record) + "\n")
            sys.stdout.flush()
            item.ack()  # only after it is printed
        delivered += 1
        if limit is not None and delivered >= limit:
            break


def _run_handler(message: Message, group: str, command: str, nack_delay_ms: int | None, json_output: bool) -> None:
    """Run ``command`` on one record; ack it on exit status 0, nack it otherwise."""
    record = message.record
    env = dict(os.environ, RAFTBROKER_TOPIC=record.topic, RAFTBROKER_GROUP=group,
               RAFTBROKER_PARTITION=str(record.partition), RAFTBROKER_OFFSET=str(record.offset),
               RAFTBROKER_KEY=(record.key or b"").decode("utf-8", errors="replace"),
               RAFTBROKER_DELIVERY_ATTEMPT=str(message.delivery_attempt),
               RAFTBROKER_POSITION=render.record_json(record)["position"])
    sys.stdout.flush()
    code = subprocess.run(command, shell=True, input=record.value, env=env,  # noqa: S602 - the user's command
                          stdout=2 if json_output else None, check=False).returncode
    if code == 0:
        message.ack()
        return
    message.nack(nack_delay_ms)
    detail = f"'{command}' exited {code} on attempt {message.delivery_attempt}: nacked"
    if json_output:
        emit_json({"event": "nacked", "topic": record.topic, "partition": record.partition,
                   "offset": record.offset, "delivery_attempt": message.delivery_attempt, "exit_code": code,
                   "detail": detail})
        sys.stdout.flush()
    else:
        sys.stderr.write(f"raftbroker: {record.partition}:{record.offset} {detail}\n")
        sys.stderr.flush()
