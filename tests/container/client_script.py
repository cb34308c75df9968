"""Runs inside a client container of the image (on the cluster's network, where the nodes' pod
names resolve): the Python SDK from outside the broker containers. One JSON document on stdout.

    python3 client_script.py BOOTSTRAP status
    python3 client_script.py BOOTSTRAP publish TOPIC FIRST COUNT   # acked values, in order
    python3 client_script.py BOOTSTRAP consume TOPIC               # every value, in offset order
"""

from __future__ import annotations

import contextlib
import json
import sys

from broker.client import BrokerError, Client, Record, TopicExists


def main(argv: list[str]) -> int:
    bootstrap, command, *rest = argv
    with Client(bootstrap, timeout_s=5.0, retry_deadline_s=60.0) as client:
        if command == "status":
            status = client.cluster_status()
            print(json.dumps({"leader_id": status.leader_id, "nodes": [
                {"id": n.id, "role": n.role, "reachable": n.reachable, "commit_index": n.commit_index,
                 "applied_index": n.applied_index} for n in status.nodes]}))
        elif command == "publish":
            topic, first, count = rest[0], int(rest[1]), int(rest[2])
            with contextlib.suppress(TopicExists):
                client.create_topic(topic, partitions=1)
            acked, failed = [], []
            for i in range(first, first + count):
                value = f"v{i}"
                try:
                    client.publish(topic, value.encode(), partition=0, idempotency_key=value)
                    acked.append(value)
                except BrokerError as exc:  # not acknowledged: may or may not be stored
                    failed.append([value, str(exc)[:200]])
            print(json.dumps({"acked": acked, "failed": failed}))
        elif command == "consume":
            values = [r.value.decode() for r in client.subscribe(rest[0], partition=0, stop_at_end=True)
                      if isinstance(r, Record)]
            print(json.dumps({"values": values}))
        else:
            print(f"unknown command {command}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
