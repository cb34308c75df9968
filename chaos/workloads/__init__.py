"""Workloads of a drill; each runs in threads and records every operation in the history.

- :class:`~chaos.workloads.producers.Producer`: publishes batches with idempotency keys to
  several partitions, one batch at a time, retrying a batch of unknown outcome with the same keys.
- :class:`~chaos.workloads.readers.Reader`: a stateless, live-tailing reader of one partition.
- :class:`~chaos.workloads.status.StatusPoller`: polls every node's role, term and leader.
- :mod:`chaos.workloads.groups`: consumer groups (stream and queue mode) — the checks exist, the
  workload plugs in once the broker serves groups (it says why it cannot run until then).
"""
