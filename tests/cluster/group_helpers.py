"""Helpers for consumer-group tests on real clusters: members in threads or killable processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker.client import Client, Consumer, Event, Message

REPO = Path(__file__).resolve().parents[2]

MEMBER_SCRIPT = """
import sys, time
from broker.client import Client, Message
bootstrap, topic, group, mode = sys.argv[1:5]
options = dict(arg.split("=", 1) for arg in sys.argv[5:])
config = {k: int(v) for k, v in options.items()}
with Client(bootstrap.split(",")) as client:
    consumer = client.subscribe(topic, group=group, mode=mode, max_in_flight=1, **config)
    for item in consumer:
        if isinstance(item, Message):
            print(f"got {item.partition}:{item.offset} {item.value.decode()}", flush=True)
            time.sleep(3600)  # holds the lease until it is killed
"""


def spawn_member(bootstrap: str, topic: str, group: str, mode: str, **config: int) -> subprocess.Popen[str]:
    """A member in its own process that takes one record and then hangs (to be killed -9)."""
    args = [sys.executable, "-c", MEMBER_SCRIPT, bootstrap, topic, group, mode,
            *(f"{k}={v}" for k, v in config.items())]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def first_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The first stdout line of ``proc`` (fails after ``timeout_s``)."""
    assert proc.stdout is not None
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout_s)
    if not result or not result[0]:
        err = proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
        raise AssertionError(f"the member printed nothing within {timeout_s} s {err}")
    return result[0].strip()


@dataclass
class Log:
    """What members saw: (member, message) in delivery order, plus events."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    deliveries: list[tuple[str, Message, float]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def values(self) -> list[bytes]:
        with self.lock:
            return [m.value for _, m, _ in self.deliveries]


def run_member(client: Client, topic: str, group: str, name: str, log: Log, stop: threading.Event,
               handle: Callable[[Message], None] | None = None, **options: object) -> threading.Thread:
    """A member in a thread: every message is logged, then ``handle``d (default: ack)."""
    def loop() -> None:
        consumer: Consumer = client.subscribe(topic, group=group, on_event=log.events.append, **options)

        def close_on_stop() -> None:
            stop.wait()
            consumer.close()

        threading.Thread(target=close_on_stop, daemon=True).start()
        with consumer:
            for item in consumer:
                assert isinstance(item, Message)
                with log.lock:
                    log.deliveries.append((name, item, time.monotonic()))
                (handle or Message.ack)(item)
    thread = threading.Thread(target=loop, daemon=True, name=f"member-{name}")
    thread.start()
    return thread
