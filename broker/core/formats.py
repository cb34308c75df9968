"""Command formats: which commands this node's code can apply (docs/design/command-formats.md).

Every node applies every committed command with its own code, so nodes running different code
(a rolling upgrade) must agree on what each command means, or their data diverges without a word.
A command states the format it needs in ``Command.format``; :data:`APPLY_FORMAT` is the newest
format this code applies. A node meeting a command of a newer format halts before it
(:class:`FormatTooNew`, an :class:`~broker.storage.ApplyHalt`): it records nothing, so it cannot
diverge, and after an upgrade it resumes from that command. Bump :data:`APPLY_FORMAT` with every
change to what a command means (a new kind, a new field an apply reads, a change in whether an
apply fails), and add a line below.

The leader side builds every command in format 0 until the cluster's format is raised, which is
not built yet (the design note's points 2 and 3).

Formats:

- 0: every command built before formats existed (no ``format`` field).
"""

from __future__ import annotations

from broker.storage import ApplyHalt
from broker.v1 import internal_pb2

APPLY_FORMAT = 0


class FormatTooNew(ApplyHalt):
    """A committed command needs a newer command format than this node's code applies."""

    def __init__(self, index: int, needed: int, applied: int) -> None:
        super().__init__(f"the command at index {index} needs command format {needed}, and this node applies "
                         f"formats up to {applied}: upgrade it (it resumes from this command)")
        self.index, self.needed = index, needed


def check(index: int, cmd: internal_pb2.Command) -> None:
    """Raise :class:`FormatTooNew` when ``cmd`` needs a newer format than :data:`APPLY_FORMAT`."""
    if cmd.format > APPLY_FORMAT:
        raise FormatTooNew(index, cmd.format, APPLY_FORMAT)
