"""Consumer groups under faults (stream and queue mode, acks with random delays, member crashes).

Not available yet: the broker answers JoinGroup/Ack/Commit with UNIMPLEMENTED. :func:`unavailable`
asks the running cluster, so the drill reports the server's own words and this workload plugs in
as soon as groups are served. The checker's group checks (``chaos/checkers/groups.py``) are ready
and tested; the workload must record, per member:
- ``deliver`` info ``{"topic", "group", "member", "partition", "offset", "id"}`` per delivery;
- ``commit`` invoke/ok/fail/info ``{"topic", "group", "partition", "offset"}`` per commit or ack
  that moves the committed position;
- ``committed`` info (same fields) for polls of the committed position (Admin lag);
- ``group-drained`` info ``{"topic", "group"}`` once it has read to the end after the last heal.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from broker.v1 import broker_pb2, broker_pb2_grpc
from chaos.probe import unimplemented

WORKLOAD = "groups"


def unavailable(addresses: Sequence[str], topic: str) -> str | None:
    """Why the group workload cannot run against this cluster (``None``: it can)."""
    def join(channel: grpc.Channel) -> object:
        return broker_pb2_grpc.BrokerStub(channel).JoinGroup(
            broker_pb2.JoinGroupRequest(topic=topic, group="chaos-probe", member_id="probe"), timeout=5)

    missing, answer = unimplemented(addresses, join)
    if missing:
        return f"the broker does not serve consumer groups yet ({answer})"
    return (f"the broker answers JoinGroup ({answer}), but the group workload is not written yet "
            "(chaos/workloads/groups.py)")
