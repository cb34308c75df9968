"""Pure broker logic: topics, records, partitioning, the deterministic state machine, reads.

Nothing here imports pysyncobj or rocksdict; it talks to ``broker.replication`` and
``broker.storage`` through their protocols.
"""
