"""Chaos and failover drills for raftbroker (SPEC §9): fault injectors (nemeses), workloads that
record every operation in a JSONL history, a checker that finds anomalies in that history and in a
final read of every node, and a drill runner (``raftbroker drill SCENARIO --seed N``).

Layout: ``history`` (the record of operations) → ``workloads`` (producers, readers, status polls)
and ``nemeses`` (faults, driven through ``cluster`` and ``net``) → ``drill`` (one seeded run of a
``scenarios`` entry) → ``checkers`` (the verdict). Every random choice of a run comes from one
``random.Random(seed)``; every fault is undone at the end of the run, also on failure.
"""
