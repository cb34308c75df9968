"""Routes on real clusters (SPEC §3.4): a route resumes from its replicated cursor after the leader
is killed (nothing lost, nothing copied twice), and two clusters mirroring each other both ways
end with the union of their records and no echo."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import grpc
import pytest

from broker.client import Client, InvalidArgument, Record
from broker.core import formats
from broker.devcluster import DevCluster
from broker.v1 import routes_pb2
from tests.cluster.stubs import refused, stubs
from tests.conftest import start_cluster, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def values(client: Client, topic: str) -> list[Record]:
    return [r for r in client.subscribe(topic, stop_at_end=True, max_batch=5000) if isinstance(r, Record)]


def format_risen(c: DevCluster) -> None:
    """Wait for the cluster's command format to rise: a route's counts are replicated from format 5,
    and count what its passes did from then on."""
    wait_until(lambda: all(v is not None and v.cluster_format == formats.CODE_FORMAT
                           for v in map(c.node_status, range(c.nodes))), 60, "the cluster's command format to rise")


def test_route_resumes_after_leader_kill_without_loss_or_duplicates(fresh_cluster: DevCluster) -> None:
    c = fresh_cluster
    total, batch = 3000, 20
    format_risen(c)
    with Client(c.addresses, retry_deadline_s=60) as client:
        client.create_topic("src", 2)
        client.create_topic("dst", 2)
        client.create_route("copy", "src", "dst")
        published = threading.Event()

        def publish() -> None:
            for start in range(0, total, batch):
                client.publish_batch("src", [{"value": json.dumps({"n": i}), "partition": i % 2}
                                             for i in range(start, start + batch)])
                time.sleep(0.01)  # spread the publishing so the kill lands while records are being routed
            published.set()

        writer = threading.Thread(target=publish, daemon=True)
        writer.start()
        wait_until(lambda: client.describe_topic("dst").records >= total // 6, 60, "the route to copy a sixth")
        old = c.leader()
        assert old is not None
        in_flight = not published.is_set()
        c.kill(old)  # kill -9: the new leader's router resumes from the replicated cursor
        writer.join(120)
        assert published.is_set(), "the publisher did not finish"
        assert in_flight, "the leader was killed after everything was published: nothing was tested"
        c.spawn(old)

        def caught_up() -> bool:
            route = client.route("copy")
            return route.lag == 0 and client.describe_topic("dst").records >= total

        wait_until(caught_up, 90, "the route to catch up after the failover")
        route = client.route("copy")  # the counts are replicated: the killed leader's passes are in them
        assert (route.copied, route.skipped, route.lost) == (total, 0, 0), route
        copied = values(client, "dst")
        source = values(client, "src")
    assert len(source) == total
    numbers = [json.loads(r.value)["n"] for r in copied]
    assert sorted(numbers) == list(range(total)), "every record copied exactly once"
    for p in (0, 1):  # FIFO per source partition (no key: source partition p lands in target partition p)
        assert [json.loads(r.value)["n"] for r in copied if r.partition == p] == list(range(p, total, 2))
    assert {r.origin for r in copied} == {r.origin for r in source}


def test_two_clusters_mirror_both_ways_without_echo(tmp_path: Path) -> None:
    east = start_cluster(tmp_path / "east", extra_args=("--cluster-id", "east"))
    try:
        west = start_cluster(tmp_path / "west", extra_args=("--cluster-id", "west"))
    except BaseException:
        east.stop()
        raise
    try:
        format_risen(east)
        format_risen(west)
        with Client(east.addresses) as ce, Client(west.addresses) as cw:
            for client in (ce, cw):
                client.create_topic("events", 3)
            ce.create_route("to-west", "events", "events", target_cluster=west.addresses)
            cw.create_route("to-east", "events", "events", target_cluster=",".join(east.addresses))
            for start in range(0, 1000, 100):
                for name, client in (("east", ce), ("west", cw)):
                    client.publish_batch("events", [{"value": json.dumps({"from": name, "n": i}), "key": f"k{i}"}
                                                    for i in range(start, start + 100)])

            def settled() -> bool:
                routes = [ce.route("to-west"), cw.route("to-east")]
                return all(r.lag == 0 for r in routes) and \
                    ce.describe_topic("events").records == cw.describe_topic("events").records == 2000

            wait_until(settled, 90, "both clusters to hold 2000 records")
            contents = {name: values(client, "events") for name, client in (("east", ce), ("west", cw))}
            routes = [ce.route("to-west"), cw.route("to-east")]
    finally:
        east.stop()
        west.stop()
    union = sorted((d["from"], d["n"]) for d in ({"from": "east", "n": i} for i in range(1000)))
    union += sorted(("west", i) for i in range(1000))
    for name, records in contents.items():
        docs = sorted((json.loads(r.value)["from"], json.loads(r.value)["n"]) for r in records)
        assert docs == sorted(union), f"{name} must hold the union, each record once"
        by_origin: dict[str, int] = {}
        for r in records:
            cluster = r.origin.split("/")[0]
            by_origin[cluster] = by_origin.get(cluster, 0) + 1
            assert cluster == json.loads(r.value)["from"], "a copy keeps the origin of the cluster that accepted it"
        assert by_origin == {"east": 1000, "west": 1000}, "no echo"
    for route in routes:
        assert route.copied == 1000 and route.skipped == 1000 and not route.last_error


def test_a_third_clusters_record_does_not_loop_between_two_mirrored_clusters(tmp_path: Path) -> None:
    """north routes into east, east and west mirror each other both ways. The echo rule compared
    only the origin (north), so north's record went back and forth between east and west for good
    (1,000 copies a side after 12 s). A copy now names the cluster it was sent from."""
    clusters: dict[str, DevCluster] = {}
    try:
        for name in ("north", "east", "west"):
            clusters[name] = start_cluster(tmp_path / name, nodes=1, extra_args=("--cluster-id", name))
        clients = {name: Client(c.addresses) for name, c in clusters.items()}
        for client in clients.values():
            client.create_topic("lp", 1)
        clients["north"].create_route("to-east", "lp", "lp", target_cluster=clusters["east"].addresses)
        clients["east"].create_route("to-west", "lp", "lp", target_cluster=clusters["west"].addresses)
        clients["west"].create_route("to-east", "lp", "lp", target_cluster=clusters["east"].addresses)
        clients["north"].publish_batch("lp", [b"n0", b"n1", b"n2"])
        clients["east"].publish("lp", b"e0")
        # the largest record north takes: the header a copy to another cluster carries must not make
        # the target refuse it for good (it was skipped: lost to the mirror)
        size = 1 << 20
        while True:
            try:
                clients["north"].publish("lp", b"b" * size)
                break
            except InvalidArgument:
                size -= 1
        # the header is the routers' own: a record that carries it would never be mirrored back there
        with pytest.raises(InvalidArgument, match="raftbroker-via' is reserved"):
            clients["east"].publish("lp", b"x", headers={"raftbroker-via": "west"})

        def settled() -> bool:
            routes = [clients["north"].route("to-east"), clients["east"].route("to-west"),
                      clients["west"].route("to-east")]
            return all(r.lag == 0 for r in routes) and all(
                clients[n].describe_topic("lp").records == 5 for n in ("east", "west"))

        wait_until(settled, 60, "east and west to hold north's four records and east's one")
        time.sleep(2)  # a loop would have copied them again by now (hundreds a second before)
        for name in ("east", "west"):
            held = values(clients[name], "lp")
            assert sorted(r.value for r in held) == sorted([b"e0", b"n0", b"n1", b"n2", b"b" * size]), \
                (name, len(held))
            assert all(r.origin.split("/")[0] == ("east" if r.value == b"e0" else "north") for r in held)
        assert all(client.route(name).skipped == 0 for client, name in (
            (clients["north"], "to-east"), (clients["east"], "to-west"))), "nothing refused by a target"
        for client in clients.values():
            client.close()
    finally:
        for c in clusters.values():
            c.stop()


def test_routes_are_listed_by_the_leader(fresh_cluster: DevCluster) -> None:
    """A follower (one catching up after a restart, too) answered ListRoutes from its own table, with
    the leader's live figures (copied, skipped, last error) at 0 and nothing saying so: it now sends
    the caller to the leader, as the SDKs follow."""
    leader = fresh_cluster.wait_ready()
    follower = next(a for a in fresh_cluster.addresses if a != leader)
    with Client(fresh_cluster.addresses) as client:
        client.create_topic("l-src", 1)
        client.create_topic("l-dst", 1)
        client.create_route("l", "l-src", "l-dst")
        client.publish_batch("l-src", [b"a", b"b"])
        wait_until(lambda: client.route("l").copied == 2, 30, "the copies counted")
    s = stubs(follower)
    try:
        code, message = refused(lambda: s.admin.ListRoutes(routes_pb2.ListRoutesRequest(), timeout=30))
        assert code == grpc.StatusCode.UNAVAILABLE and "leader" in message.lower(), (code, message)
    finally:
        s.close()
    with Client([follower]) as client:  # the SDK follows the leader's address
        assert client.route("l").copied == 2


def test_a_route_to_its_own_cluster_is_refused_at_create_and_an_unreachable_target_is_taken(
        fresh_cluster: DevCluster) -> None:
    """A --to-cluster route whose target is this very cluster could only fail (the router refuses to
    mirror into its own cluster): it was accepted and failed on every pass. Now the leader asks the
    target's cluster id at create; a target that does not answer is taken (it may come up later)."""
    with Client(fresh_cluster.addresses) as client:
        client.create_topic("own-src", 1)
        follower = next(a for a in fresh_cluster.addresses if a != fresh_cluster.wait_ready())
        with pytest.raises(InvalidArgument, match=r"is this cluster \('.+'\): route to the topic here"):
            client.create_route("own", "own-src", "own-dst", target_cluster=[follower])
        assert [r.name for r in client.list_routes()] == []
        client.create_route("later", "own-src", "own-dst", target_cluster=["127.0.0.1:1"])  # nothing listens
        assert [r.name for r in client.list_routes()] == ["later"]
        client.delete_route("later")


def test_a_route_into_an_ephemeral_or_full_target_waits_and_loses_nothing(fresh_cluster: DevCluster) -> None:
    """An ephemeral target made a route skip every record silently (as if each were refused), and a
    full_policy=reject target with room for 5 of 12 records copied none, for good."""
    with Client(fresh_cluster.addresses) as client:
        client.create_topic("r-src", 1)
        client.create_topic("r-dst", 1)
        client.create_route("r", "r-src", "r-dst")
        client.drop_topic("r-dst")
        client.create_topic("r-dst", 1, durability="ephemeral")
        client.publish_batch("r-src", [b"a%d" % i for i in range(5)])
        wait_until(lambda: client.route("r").last_error, 30, "the route to say why")
        route = client.route("r")
        assert "ephemeral" in route.last_error and route.lag == 5 and route.skipped == 0, route
        client.drop_topic("r-dst")
        client.create_topic("r-dst", 1)
        wait_until(lambda: client.describe_topic("r-dst").records == 5, 30, "the records once the target stores")

        client.create_topic("f-src", 1)
        client.create_topic("f-dst", 1, retention={"max_records": 5}, full_policy="reject")
        client.create_route("f", "f-src", "f-dst")
        client.publish_batch("f-src", [b"f%d" % i for i in range(12)])
        wait_until(lambda: client.describe_topic("f-dst").records == 5, 30, "the 5 records that fit")
        wait_until(lambda: "full" in client.route("f").last_error, 30, "the route to say it is full")
        assert [r.value for r in values(client, "f-dst")] == [b"f%d" % i for i in range(5)]  # in order
        # the cursor moved past what went in: retried later under the same keys, the 5 were stored again
        # once the dedup window had passed (17 records for 12)
        wait_until(lambda: client.route("f").lag == 7, 30, "the cursor past the 5 copied")
        client.alter_topic("f-dst", retention={"max_records": 100})
        wait_until(lambda: client.route("f").lag == 0, 30, "the rest once there is room")
        assert [r.value for r in values(client, "f-dst")] == [b"f%d" % i for i in range(12)], "each once, in order"
