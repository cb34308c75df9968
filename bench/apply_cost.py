"""Micro-benchmark of the replicated apply: ``BrokerStateMachine.apply`` of one ``AppendCommand`` of
``records`` records (distinct seeded random values of ``size`` bytes, one partition, no idempotency
keys: the SDK's producer-session batch) into a fresh ``RocksStore``, as every replica runs it.

It uses only the state machine's public API and ``internal_pb2``, so the same file measures any
commit (``PYTHONPATH=<an export of the commit> python -m bench.apply_cost``). Figures are wall and
CPU microseconds per record, the median (and the minimum: the least disturbed apply) of ``rounds``
applies after a warm-up. CPU is the process's (RocksDB's threads included). A loaded machine
inflates all of them, the wall time most (preemption), so compare A and B run alternately in the
same period.

    .venv/bin/python -m bench.apply_cost                       # 1000 records of 100 B, 200 applies
    .venv/bin/python -m bench.apply_cost --records 1000 --size 1024 --rounds 100
    .venv/bin/python -m bench.apply_cost --no-store-wal        # applies without RocksDB's WAL

By default the store is written as a node writes it, through RocksDB's write-ahead log;
``--no-store-wal`` measures ``journaled=True`` (the Raft journal as the WAL, as nodes run).

``--idle-ms`` sleeps that long before each apply, as a node's tick thread idles between lone
requests, so the apply runs after the CPU went idle. On a VM that halts idle vCPUs at once the code
then runs cold: a 1-record apply measured 26-31 us back to back and 52-127 us with ``--idle-ms 0.5``
(bench/NOTE.md, 2026-12-02 04:10):

    .venv/bin/python -m bench.apply_cost --records 1 --rounds 2000 --no-store-wal --idle-ms 0.5
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.storage.rocks import RocksStore
from broker.v1 import internal_pb2

WARMUP_APPLIES = 10


def append_command(topic_id: int, records: int, size_bytes: int, rng: random.Random, msg_id: int) -> bytes:
    origin = internal_pb2.RecordBody(origin="127.0.0.1:7101").SerializeToString()
    bodies = [internal_pb2.RecordBody(value=rng.randbytes(size_bytes)).SerializeToString() + origin
              for _ in range(records)]
    append = internal_pb2.AppendCommand(topic="bench", topic_id=topic_id, now_ms=int(time.time() * 1000),
                                        partitions=[0] * records, bodies=bodies)
    if "first_msg_id" in internal_pb2.AppendCommand.DESCRIPTOR.fields_by_name:  # producer sessions
        append.dedup_id, append.first_msg_id = "bench-session", msg_id
    return internal_pb2.Command(append=append).SerializeToString()


def measure(records: int, size_bytes: int, rounds: int, seed: int, store_wal: bool = True,
            idle_s: float = 0.0) -> dict[str, float]:
    """Median and minimum wall and CPU µs per record of ``rounds`` applies (commands built beforehand),
    each after ``idle_s`` of sleep (not measured)."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="apply-cost-") as tmp:
        store = RocksStore(Path(tmp) / "db")
        journaled = "journaled" in inspect.signature(BrokerStateMachine).parameters and not store_wal
        options: dict[str, Any] = {"journaled": True} if journaled else {}  # older commits have no journaled
        sm = BrokerStateMachine(store, Changes(), **options)
        create = internal_pb2.Command(create_topic=internal_pb2.CreateTopicCommand(
            config=internal_pb2.TopicConfig(name="bench", partitions=1), now_ms=1000)).SerializeToString()
        meta = sm.apply(1, create)
        assert isinstance(meta, internal_pb2.TopicMeta)
        total = WARMUP_APPLIES + rounds
        commands = [append_command(meta.topic_id, records, size_bytes, rng, 1 + i * records) for i in range(total)]
        wall, cpu = [], []
        for i, command in enumerate(commands):
            if idle_s:
                time.sleep(idle_s)
            w0, c0 = time.perf_counter(), time.process_time()
            result = sm.apply(2 + i, command)
            w1, c1 = time.perf_counter(), time.process_time()
            assert not hasattr(result, "error"), result
            if i >= WARMUP_APPLIES:
                wall.append((w1 - w0) * 1e6 / records)
                cpu.append((c1 - c0) * 1e6 / records)
        assert sm.partition(meta.topic_id, 0).end_offset == total * records
        store.close()
    return {"wall_us_per_record": round(statistics.median(wall), 3), "wall_us_per_record_min": round(min(wall), 3),
            "cpu_us_per_record": round(statistics.median(cpu), 3), "cpu_us_per_record_min": round(min(cpu), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--no-store-wal", dest="store_wal", action="store_false",
                        help="write applies without RocksDB's WAL (journaled=True)")
    parser.add_argument("--idle-ms", type=float, default=0.0,
                        help="sleep this long before each apply (the CPU idles between lone requests)")
    args = parser.parse_args()
    if not (1 <= args.records <= 100_000 and 1 <= args.size <= 1 << 20 and 1 <= args.rounds <= 10_000):
        parser.error("need 1 <= records <= 100000, 1 <= size <= 1 MiB, 1 <= rounds <= 10000")
    if not 0 <= args.idle_ms <= 1000:
        parser.error("need 0 <= idle-ms <= 1000")
    figures = measure(args.records, args.size, args.rounds, args.seed, args.store_wal, args.idle_ms / 1000)
    print(json.dumps({"records": args.records, "size": args.size, "store_wal": args.store_wal,
                      "idle_ms": args.idle_ms} | figures))


if __name__ == "__main__":
    main()
