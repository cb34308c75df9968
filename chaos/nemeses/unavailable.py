"""Faults whose broker feature does not exist yet. Each probe asks the running cluster (or states
a fact), so a drill says "not available: <why>" instead of faking a pass, and the reason changes by
itself when the feature lands (then the nemesis must be written here: it is not, yet).

- power loss needs the ``fsync`` durability class and its crash mode that drops unsynced writes;
- membership changes need Admin.AddNode/RemoveNode;
- clock jumps need an injectable clock behind the timeouts the broker owns.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from chaos.probe import unimplemented

CLOCK_REASON = ("the broker has no injectable clock: its timeouts (elections, leader fallback, commit "
                "timeout, dedup windows, housekeeping) read the process clock, which a drill cannot jump")


def power_loss_unavailable(addresses: Sequence[str]) -> str:
    """Why power loss cannot be drilled (always a reason today; see the module docstring)."""
    config = admin_pb2.TopicConfig(name="chaos-fsync-probe", durability=common_pb2.DURABILITY_FSYNC)
    missing, answer = unimplemented(addresses, lambda ch: admin_pb2_grpc.AdminStub(ch).CreateTopic(
        admin_pb2.CreateTopicRequest(config=config), timeout=5))
    if missing:
        return (f"no fsync durability class to protect against it ({answer}) and no crash mode that drops "
                "unsynced writes")
    return (f"creating an fsync topic answers {answer}, but no power-loss crash mode (dropping unsynced writes) "
            "is wired into the drills yet (chaos/nemeses/unavailable.py)")


def membership_unavailable(addresses: Sequence[str]) -> str:
    """Why membership changes cannot be drilled (always a reason today)."""
    missing, answer = unimplemented(addresses, lambda ch: admin_pb2_grpc.AdminStub(ch).RemoveNode(
        admin_pb2.RemoveNodeRequest(id="chaos-probe-absent"), timeout=5))
    if missing:
        return f"the broker does not change membership ({answer})"
    return (f"Admin.RemoveNode answers ({answer}), but the membership nemesis is not written yet "
            "(chaos/nemeses/unavailable.py)")
