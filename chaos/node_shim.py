"""A broker node started through the proxy fabric: ``python -m chaos.node_shim serve ...``.

Before running the broker's command line (the program ``python -m broker.cli.launch``, run with
:mod:`runpy`: chaos imports nothing of ``broker.cli``; its ``serve`` re-executes this same command
line once to preload jemalloc, broker/allocator.py, so the redirection is made again), it makes
pysyncobj's outgoing connections dial the addresses mapped in ``RAFTBROKER_CHAOS_DIAL`` (JSON
``{"peer raft host:port": "proxy host:port"}``), so each Raft link passes through a proxy of the
drill. Nothing else of the node changes; its identity (the address it binds and announces) stays
its own Raft address.
"""

from __future__ import annotations

import json
import os
import runpy


def main() -> None:
    from broker.replication.dial import redirect_dials  # before the node imports pysyncobj's users

    redirect_dials(json.loads(os.environ.get("RAFTBROKER_CHAOS_DIAL", "{}")))
    runpy.run_module("broker.cli.launch", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
