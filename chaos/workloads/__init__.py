"""Workloads of a drill; each runs in threads and records every operation in the history.

- :class:`~chaos.workloads.producers.Producer`: publishes batches with idempotency keys to
  several partitions, one batch at a time, retrying a batch of unknown outcome with the same keys.
- :class:`~chaos.workloads.readers.Reader`: a stateless, live-tailing reader of one partition.
- :class:`~chaos.workloads.status.StatusPoller`: polls every node's role, term and leader.
- :class:`~chaos.workloads.groups.GroupWorkload`: a queue-mode and a stream-mode consumer group,
  two members each (:mod:`chaos.workloads.group_member`: random ack delays, nacks, commits,
  crashes), a poll of their committed positions, and the wait until they drained; every group
  entry is written through a :class:`~chaos.workloads.group_ledger.GroupLedger`.
"""
