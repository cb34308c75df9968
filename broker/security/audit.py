"""The audit log: one JSON line per admin action and per refused request, on the logger
``raftbroker.audit`` (the node's log; route it elsewhere with logging configuration).

Fields: ``principal`` ("" when unauthenticated), ``action`` (the gRPC method), ``resource``
(``topic:NAME``, ``group:TOPIC/NAME``, ``cluster``), ``result`` (``ok``, ``failed: CODE``,
``denied: ...``, ``unauthenticated: ...``), ``peer`` (the client address).
"""

from __future__ import annotations

import json
import logging
import time

log = logging.getLogger("raftbroker.audit")


def audit(principal: str, action: str, resource: str, result: str, peer: str = "") -> None:
    log.info("%s", json.dumps({"audit": True, "ts_ms": int(time.time() * 1000), "principal": principal,
                               "action": action, "resource": resource, "result": result, "peer": peer},
                              separators=(",", ":"), sort_keys=True))
