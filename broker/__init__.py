"""raftbroker: a durable, Raft-replicated message broker.

Layers (imports point one way only): ``broker.services`` (gRPC, translate only) ->
``broker.core`` (topics, records, the deterministic state machine) -> ``broker.replication``
(the only pysyncobj importer) and ``broker.storage`` (the only rocksdict importer).
``broker.client`` and ``broker.cli`` use the public gRPC API only.
"""

__version__ = "0.1.0"
