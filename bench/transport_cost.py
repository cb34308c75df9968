"""Micro-benchmark of pysyncobj's message encode/decode path: ``zlib.compress(pickle.dumps(msg), 3)`` per
message per follower (today) against ``pickle.dumps(msg)`` alone (no compression), on realistic
``append_entries`` messages. Both pickle with protocol 5, as every node does once
``broker.replication._patches`` applied its ``pickle5`` patch.

An entry is built the way the leader builds it: an ``AppendCommand`` of ``records`` records with
distinct random values (seeded), the leader's origin stamp and the SDK's uuid4 idempotency key per
record, wrapped by pysyncobj as a replicated call (type byte + pickled ``(func_id, args, kwargs)``),
then sent as ``{'type': 'append_entries', 'entries': [(cmd, idx, term)], ...}``.

Figures are CPU seconds (``time.process_time``) per MB of entry bytes, one thread, best of ``rounds``:
a loaded machine inflates all of them alike, so compare the ratios of one run.

    .venv/bin/python -m bench.transport_cost                  # 100 B and 1 KiB records, 1000 per entry
    .venv/bin/python -m bench.transport_cost --records 100 --sizes 100
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from broker.v1 import internal_pb2

REGULAR_COMMAND = b"\x00"  # pysyncobj's _COMMAND_TYPE.REGULAR prefix
ZLIB_LEVEL = 3  # what pysyncobj's TcpConnection.send uses
PROTOCOL = 5  # broker.replication._patches.PATCHED_PICKLE_PROTOCOL


def entry_command(records: int, size_bytes: int, rng: random.Random) -> bytes:
    """One replicated ``Command`` (serialized) carrying ``records`` distinct records of ``size_bytes``."""
    origin = internal_pb2.RecordBody(origin="127.0.0.1:7101", producer="").SerializeToString()
    append = internal_pb2.AppendCommand(topic="bench-pub100-0123abcd", topic_id=7, now_ms=int(time.time() * 1000))
    for _ in range(records):
        value = internal_pb2.RecordBody(value=rng.randbytes(size_bytes)).SerializeToString()
        append.partitions.append(0)
        append.bodies.append(value + origin)
        append.idempotency_keys.append(str(uuid.UUID(int=rng.getrandbits(128), version=4)))
    command = internal_pb2.Command(append=append).SerializeToString()
    return REGULAR_COMMAND + pickle.dumps((0, (command,), {}), PROTOCOL)


def append_entries(cmd: bytes, index: int) -> dict[str, object]:
    """The message pysyncobj sends a follower for one new entry (non-batched mode)."""
    return {"type": "append_entries", "term": 3, "commit_index": index - 1, "entries": [(cmd, index, 3)],
            "prevLogIdx": index - 1, "prevLogTerm": 3}


@dataclass(frozen=True)
class Cost:
    """CPU per MB of entry bytes, and the wire size relative to the entry size."""

    encode_s_per_mb: float
    decode_s_per_mb: float
    wire_ratio: float


def _best_cpu(fn: Callable[[], object], repeat: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(repeat):
            fn()
        best = min(best, time.process_time() - started)
    return best / repeat


def measure(records: int, size_bytes: int, *, entries: int = 20, rounds: int = 5, seed: int = 1) -> dict[str, Cost]:
    """Cost of ``none`` (pickle protocol 5 only) and ``zlib`` (protocol 5 + zlib level 3, today) on
    ``entries`` distinct entries."""
    rng = random.Random(seed)
    commands = [entry_command(records, size_bytes, rng) for _ in range(entries)]
    messages = [append_entries(cmd, 100 + i) for i, cmd in enumerate(commands)]
    entry_mb = sum(len(cmd) for cmd in commands) / 1e6
    plain = [pickle.dumps(m, PROTOCOL) for m in messages]
    packed = [zlib.compress(p, ZLIB_LEVEL) for p in plain]
    results = {}
    for name, enc, dec, wire in (
        ("none", lambda: [pickle.dumps(m, PROTOCOL) for m in messages],
         lambda: [pickle.loads(p) for p in plain], plain),
        ("zlib", lambda: [zlib.compress(pickle.dumps(m, PROTOCOL), ZLIB_LEVEL) for m in messages],
         lambda: [pickle.loads(zlib.decompress(p)) for p in packed], packed),
    ):
        results[name] = Cost(encode_s_per_mb=_best_cpu(enc, 1, rounds) / entry_mb,
                             decode_s_per_mb=_best_cpu(dec, 1, rounds) / entry_mb,
                             wire_ratio=sum(map(len, wire)) / (entry_mb * 1e6))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transport_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1000, help="records per entry (default 1000)")
    parser.add_argument("--sizes", default="100,1024", help="record value sizes in bytes (default 100,1024)")
    parser.add_argument("--rounds", type=int, default=5, help="best of this many rounds (default 5)")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; "
          f"{args.records} records per entry; CPU ms per MB of entry bytes (best of {args.rounds})")
    print("| value B | codec | encode ms/MB | decode ms/MB | wire/entry bytes | encode zlib/none |")
    print("|---|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        res = measure(args.records, size, rounds=args.rounds)
        for name, cost in res.items():
            ratio = cost.encode_s_per_mb / res["none"].encode_s_per_mb
            print(f"| {size} | {name} | {cost.encode_s_per_mb * 1e3:.2f} | {cost.decode_s_per_mb * 1e3:.2f} | "
                  f"{cost.wire_ratio:.3f} | {ratio:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
