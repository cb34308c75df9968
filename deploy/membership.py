"""Reconcile the cluster's Raft membership with the members a deployment wants (the Helm chart's
pre-upgrade and post-install/post-upgrade hook Jobs run this; it ships in the image as
``/opt/raftbroker/membership.py``). Only the Admin API is used (``broker.client``): peers are never
edited by hand.

    python membership.py --bootstrap HOST:PORT[,...] --desired ID=RAFT/GRPC[,...] [--client-config PATH] {shrink|grow}

Against a secured cluster, ``--client-config PATH`` (or ``$RAFTBROKER_CLIENT_CONFIG``) gives the CA
and a token whose principal has cluster-admin (docs/security.md "Client config file"); the same
TLS channel is used for the health checks.

``shrink`` (before the StatefulSet loses pods): every member whose id is not desired is removed,
one at a time (a leader hands over first), so the pods that go away are no longer counted in any
majority. ``grow`` (after new pods run): every desired id that is not a member is added once its
node answers on gRPC, then the next only after the added node is caught up (SERVING on the gRPC
health service), so the cluster never has two members catching up at once. Both are idempotent:
a rerun after a partial failure does the rest. ``shrink`` (the pre-upgrade hook) also refuses,
before the StatefulSet changes, a grow whose new pods would be a majority of the desired members:
they start with every desired member as a peer and would elect a leader among themselves before
``grow`` adds them (``check_growth``); ``grow`` refuses to add a node that already serves as a member
of another cluster. Exit 0 when membership equals the desired set
(for ``shrink``: has no extra member), 1 with one line on stderr otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.client import CLIENT_CONFIG_ENV, BrokerError, Client, ClientConfigError, ClientSecurity, load_client_config
from broker.config import ConfigError, PeerConfig

NODE_WAIT_S_MAX = 600.0  # how long a new pod may take to start answering, and then to catch up
RETRY_DEADLINE_S = 60.0  # how long a request is retried while no leader answers
POLL_S = 1.0


def _parse_desired(spec: str) -> list[PeerConfig]:
    return [PeerConfig.parse(s.strip()) for s in spec.split(",") if s.strip()]


def _channel(address: str, security: ClientSecurity | None) -> grpc.Channel:
    if security is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, security.channel_credentials(), options=security.channel_options())


def _serving(address: str, timeout_s: float = 3.0, security: ClientSecurity | None = None) -> bool | None:
    """True SERVING, False NOT_SERVING, None unreachable."""
    with _channel(address, security) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return None
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _wait(predicate_s: str, check: object, deadline: float) -> None:
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {predicate_s}")
        time.sleep(POLL_S)


def members(client: Client) -> set[str]:
    """The ids of the current members (as the answering node reports them)."""
    return {n.id for n in client.cluster_status().nodes}


def check_growth(current: set[str], desired: list[PeerConfig]) -> None:
    """Refuse (ValueError) a grow whose new members would be a majority of ``desired``: each new pod
    starts with every desired member as a peer, so such new pods elect a leader among themselves
    before ``grow`` adds them, a second cluster beside the old one, with the same node ids."""
    joining = [p.id for p in desired if p.id not in current]
    if current and 2 * len(joining) > len(desired):
        raise ValueError(
            f"{len(joining)} new members of {len(desired)} ({', '.join(joining)}) would be a majority and elect "
            f"a leader of their own before they are added: grow from {len(current)} to at most "
            f"{2 * len(current)} members per `helm upgrade`, then upgrade again")


def shrink(client: Client, desired: list[PeerConfig]) -> list[str]:
    """Remove every member not in ``desired``; returns the removed ids."""
    wanted = {p.id for p in desired}
    removed = []
    for node_id in sorted(members(client) - wanted, reverse=True):  # the highest ordinal first
        print(f"membership: removing {node_id}", flush=True)
        client.remove_node(node_id)
        removed.append(node_id)
    return removed


def grow(client: Client, desired: list[PeerConfig], wait_s: float = NODE_WAIT_S_MAX,
         security: ClientSecurity | None = None) -> list[str]:
    """Add every desired node that is not a member, one at a time; returns the added ids.
    ``security``: TLS for the health checks of the new nodes (None: plaintext)."""
    added = []
    for peer in desired:
        if peer.id in members(client):
            continue
        deadline = time.monotonic() + wait_s
        print(f"membership: waiting for {peer.id} to answer on {peer.grpc_address}", flush=True)
        _wait(f"{peer.id} to answer on {peer.grpc_address}",
              lambda p=peer: _serving(p.grpc_address, security=security) is not None, deadline)
        if _serving(peer.grpc_address, security=security):  # a node that is no member cannot be SERVING here
            raise ValueError(f"{peer.id} serves as a member of another cluster (new nodes that elected a leader "
                             "among themselves?): not adding it")
        print(f"membership: adding {peer.id} ({peer.raft_address}, gRPC {peer.grpc_address})", flush=True)
        client.add_node(peer.id, peer.raft_address, peer.grpc_address)
        _wait(f"{peer.id} to catch up", lambda p=peer: _serving(p.grpc_address, security=security) is True, deadline)
        print(f"membership: {peer.id} is a member and caught up", flush=True)
        added.append(peer.id)
    return added


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--bootstrap", required=True, help="gRPC addresses of any nodes (the leader is found)")
    parser.add_argument("--desired", required=True, help="ID=RAFT_HOST:PORT/GRPC_HOST:PORT, comma-separated")
    parser.add_argument("--wait-s", type=float, default=NODE_WAIT_S_MAX, help="per new node")
    parser.add_argument("--retry-deadline-s", type=float, default=RETRY_DEADLINE_S,
                        help="how long a request is retried while no leader answers (a failover, a cluster "
                             "starting; also a node that cannot be reached at all, e.g. TLS without the CA)")
    parser.add_argument("--client-config", default=os.environ.get(CLIENT_CONFIG_ENV) or None, metavar="PATH",
                        help=f"client config (CA, cluster-admin token), default ${CLIENT_CONFIG_ENV}")
    parser.add_argument("phase", choices=["shrink", "grow"])
    args = parser.parse_args(argv)
    try:
        desired = _parse_desired(args.desired)
        loaded = load_client_config(args.client_config) if args.client_config else None
    except (ConfigError, ClientConfigError) as exc:
        print(f"membership: error: {exc}", file=sys.stderr)
        return 2
    if not desired:
        print("membership: error: --desired names no member", file=sys.stderr)
        return 2
    security = loaded.security if loaded else None
    with Client(args.bootstrap, retry_deadline_s=args.retry_deadline_s, security=security) as client:
        try:
            if args.phase == "shrink":  # pre-upgrade: also checks the grow that follows, before pods change
                check_growth(members(client), desired)
                shrink(client, desired)
                extra = members(client) - {p.id for p in desired}
                if extra:
                    print(f"membership: error: still members: {sorted(extra)}", file=sys.stderr)
                    return 1
            else:
                grow(client, desired, args.wait_s, security)
            now = sorted(members(client))
        except (BrokerError, TimeoutError, ValueError) as exc:
            print(f"membership: error: {exc}", file=sys.stderr)
            return 1
    print(f"membership: members now {', '.join(now)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
