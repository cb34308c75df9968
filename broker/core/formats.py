"""Command formats: which commands this node's code can apply (docs/design/command-formats.md).

Every node applies every committed command with its own code, so nodes running different code
(a rolling upgrade) must agree on what each command means, or their data diverges without a word.
A command states the format it needs in ``Command.format``; :data:`APPLY_FORMAT` is the newest
format this code applies. A node meeting a command of a newer format halts before it
(:class:`FormatTooNew`, an :class:`~broker.storage.ApplyHalt`): it records nothing, so it cannot
diverge, and after an upgrade it resumes from that command. Bump :data:`CODE_FORMAT` with every
change to what a command means (a new kind, a new field an apply reads, a change in whether an
apply fails), and add a line below.

The cluster's format is replicated state (``Column.META`` ``cluster_format`` -> >I, 0 when
absent), raised only by a ``set_format`` command and never lowered. The leader builds commands in
the cluster's format, and submits ``set_format(n)`` only once every voting member reports that its
code applies ``n`` (``broker/leader/formats.py``). ``set_format(n)`` itself states format ``n``, so
a member that cannot apply ``n`` halts before it rather than agree to it. A node whose code applies
less than its data's cluster format refuses to start, and halts after restoring such a snapshot
(:class:`DataFormatTooNew`): a downgrade past the cluster's format is refused.

Formats:

- 0: every command built before formats existed (no ``format`` field).
- 1: ``set_format`` (Command field 60) and the cluster's format.
- 2: the apply digest (``core/apply_digest.py``): from the ``set_format`` that reaches 2, every apply
  also writes ``META/apply_digest``.
- 3: ``retry_dead_letters`` with ``start_offsets``: a dead letter below its partition's start (its
  record was pruned) stays dead and is counted apart, instead of going back to be dead-lettered again.
- 4: no command changes: a member at 4 reads position tokens of version 2 (a group delivery's
  record names its delivery, ``broker/core/records.py``), which code before it refuses. The leader
  hands such tokens out only once the cluster's format is 4, i.e. every member's code reads them.
- 5: `memory` topics decide from replicated data only (docs/design/memory-topics.md): every append
  to one also writes its records' skeleton (sizes and timestamps, ``core/record_log.py`` format 4)
  in the durable store, and applies decide from the replicated counters (``counters``) and the
  skeletons (``sizes_store``), not from the records and view of a node that lost them at a restart.
  Also: ``advance_route`` carries the records a pass copied, skipped and lost, added to the route's
  replicated totals (``core/routes.py``), so that ``ListRoutes`` keeps them across leaders.
"""

from __future__ import annotations

import os
import struct

from broker.storage import ApplyHalt, Batch, Column, Store
from broker.v1 import internal_pb2

CODE_FORMAT = 5  # the newest command format this code applies
PRUNED_DEAD_FORMAT = 3  # from this format a retry of dead letters carries the leader's start offsets
DELIVERY_TOKEN_FORMAT = 4  # from this format a group delivery's position token names the delivery
MEMORY_SKELETON_FORMAT = 5  # from this format `memory` topics' applies decide from replicated data only
ROUTE_TOTALS_FORMAT = 5  # from this format a route's advances carry its copied, skipped and lost counts
# Tests only: run this node as a release that applies formats up to N <= CODE_FORMAT (an older node
# in a rolling upgrade). Unset in production; a value above CODE_FORMAT is refused.
APPLY_FORMAT_ENV = "RAFTBROKER_TEST_APPLY_FORMAT"

CLUSTER_FORMAT_KEY = b"cluster_format"  # in Column.META
_U32 = struct.Struct(">I")


def _apply_format_from_env() -> int:
    raw = os.environ.get(APPLY_FORMAT_ENV)
    if raw is None or raw == "":
        return CODE_FORMAT
    if not raw.isdigit() or int(raw) > CODE_FORMAT:
        raise ValueError(f"{APPLY_FORMAT_ENV}={raw!r}: expected a command format from 0 to {CODE_FORMAT}")
    return int(raw)


APPLY_FORMAT = _apply_format_from_env()


class FormatTooNew(ApplyHalt):
    """A committed command needs a newer command format than this node's code applies."""

    def __init__(self, index: int, needed: int, applied: int) -> None:
        super().__init__(f"the command at index {index} needs command format {needed}, and this node applies "
                         f"formats up to {applied}: upgrade it (it resumes from this command)")
        self.index, self.needed = index, needed


class DataFormatTooNew(ApplyHalt):
    """This node's data (its store, or a snapshot it restored) is at a cluster format its code does
    not apply: a downgrade past the cluster's format."""

    def __init__(self, cluster_format: int, applied: int) -> None:
        super().__init__(f"this node's data is at cluster command format {cluster_format}, and its code applies "
                         f"formats up to {applied}: run a release that applies format {cluster_format} (a "
                         "downgrade past the cluster's command format is not possible; docs/deploy.md)")
        self.cluster_format = cluster_format


def check(index: int, cmd: internal_pb2.Command) -> None:
    """Raise :class:`FormatTooNew` when ``cmd`` needs a newer format than :data:`APPLY_FORMAT`."""
    if cmd.format > APPLY_FORMAT:
        raise FormatTooNew(index, cmd.format, APPLY_FORMAT)


def stored_cluster_format(store: Store) -> int:
    """The cluster's format as ``store`` holds it (0 when never raised)."""
    raw = store.get(Column.META, CLUSTER_FORMAT_KEY)
    return _U32.unpack(raw)[0] if raw else 0


def check_data(cluster_format: int) -> None:
    """Raise :class:`DataFormatTooNew` when this code cannot apply ``cluster_format``."""
    if cluster_format > APPLY_FORMAT:
        raise DataFormatTooNew(cluster_format, APPLY_FORMAT)


def put_cluster_format(batch: Batch, value: int) -> None:
    batch.put(Column.META, CLUSTER_FORMAT_KEY, _U32.pack(value))


def set_format_command(value: int) -> internal_pb2.Command:
    """The command that raises the cluster's format to ``value``; it needs format ``value`` itself."""
    return internal_pb2.Command(set_format=internal_pb2.SetFormatCommand(format=value), format=value)
