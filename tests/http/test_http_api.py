"""Every endpoint of the HTTP gateway through a real 3-node cluster, with a real HTTP client (httpx)."""

from __future__ import annotations

import base64
import json
import time

import httpx
import pytest

from broker.client import Client, Record
from broker.devcluster import DevCluster
from tests.conftest import wait_until
from tests.http.conftest import sse_events

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def gateway(c: DevCluster, follower: bool = False) -> httpx.Client:
    leader = c.leader()
    assert leader is not None
    index = (leader + 1) % c.nodes if follower else leader
    return httpx.Client(base_url=f"http://{c.http_address(index)}", timeout=30)


def problem(r: httpx.Response, status: int, reason: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["status"] == status and body["reason"] == reason and body["detail"]
    return body


def test_topic_endpoints_and_their_errors(http_cluster: DevCluster) -> None:
    with gateway(http_cluster, follower=True) as h:
        created = h.put("/v1/topics/h-topic", json={"partitions": 3, "retention": {"max_records": 1000},
                                                    "dedup_window_ms": 60000})
        assert created.status_code == 201, created.text
        assert created.json()["partition_count"] == 3
        assert h.put("/v1/topics/h-topic", json={"partitions": 3, "retention": {"max_records": 1000},
                                                 "dedup_window_ms": 60000}).status_code == 200
        problem(h.put("/v1/topics/h-topic", json={"partitions": 4}), 409, "TOPIC_EXISTS")
        problem(h.put("/v1/topics/bad name", json={"partitions": 1}), 400, "INVALID_ARGUMENT")
        problem(h.put("/v1/topics/h-x", json={"partitions": 0}), 400, "INVALID_ARGUMENT")
        problem(h.put("/v1/topics/h-x", json={"durability": "granite"}), 400, "INVALID_ARGUMENT")
        problem(h.put("/v1/topics/h-x", content=b"{not json", headers={"content-type": "application/json"}),
                400, "INVALID_JSON")
        assert "h-topic" in [t["name"] for t in h.get("/v1/topics").json()["topics"]]
        info = h.get("/v1/topics/h-topic").json()
        assert info["retention"]["max_records"] == 1000 and len(info["partitions"]) == 3
        problem(h.get("/v1/topics/h-none"), 404, "TOPIC_NOT_FOUND")
        assert h.delete("/v1/topics/h-topic").status_code == 204
        problem(h.delete("/v1/topics/h-topic"), 404, "TOPIC_NOT_FOUND")
        problem(h.get("/v1/nowhere"), 404, "NOT_FOUND")
    with Client(http_cluster.addresses) as sync:
        assert "h-x" not in [t.name for t in sync.list_topics()], "a rejected request changed nothing"


def test_publish_over_http_read_over_grpc_and_back(http_cluster: DevCluster) -> None:
    with gateway(http_cluster, follower=True) as h, Client(http_cluster.addresses) as sync:
        assert h.put("/v1/topics/h-rt", json={"partitions": 2}).status_code == 201
        body = {"records": [
            {"value": {"n": 1}, "key": "k", "headers": {"h": "v"}, "idempotency_key": "once", "partition": 0},
            {"value": "text", "partition": 1},
            {"value_b64": base64.b64encode(b"\x00\xff").decode(), "partition": 1},
        ]}
        results = h.post("/v1/topics/h-rt/records", json=body).json()["results"]
        assert [(r["partition"], r["offset"], r["duplicate"]) for r in results] == [(0, 0, False), (1, 0, False),
                                                                                    (1, 1, False)]
        again = h.post("/v1/topics/h-rt/records", json={"records": [body["records"][0]]}).json()["results"]
        assert again[0]["duplicate"] and again[0]["offset"] == 0, "idempotency key honoured over HTTP"
        stored = [r for r in sync.subscribe("h-rt", stop_at_end=True) if isinstance(r, Record)]
        assert sorted((r.partition, r.offset, r.value) for r in stored) == [
            (0, 0, b'{"n":1}'), (1, 0, b"text"), (1, 1, b"\x00\xff")]
        assert stored[0].headers == {"h": "v"} or any(r.headers == {"h": "v"} for r in stored)
        sync.publish("h-rt", "from-grpc", partition=0)
        page = h.get("/v1/topics/h-rt/records", params={"partition": 0}).json()
        assert [r["value"] for r in page["records"]] == [{"n": 1}, "from-grpc"] and page["caught_up"]
        b = h.get("/v1/topics/h-rt/records", params={"partition": 1}).json()["records"]
        assert base64.b64decode(b[1]["value_b64"]) == b"\x00\xff" and b[1]["value"] is None
        problem(h.post("/v1/topics/h-rt/records", json={"records": []}), 400, "INVALID_ARGUMENT")
        problem(h.post("/v1/topics/h-rt/records", json={"records": [{"value": 1, "partition": 9}]}),
                400, "INVALID_ARGUMENT")
        problem(h.post("/v1/topics/h-none/records", json={"records": [{"value": 1}]}), 404, "TOPIC_NOT_FOUND")
        problem(h.post("/v1/topics/h-rt/records", json={"records": [{"value_b64": "***"}]}), 400, "INVALID_ARGUMENT")
        too_large = problem(h.post("/v1/topics/h-rt/records", json={"records": [{"value": "x" * (2 << 20)}]}),
                            413, "REQUEST_TOO_LARGE")
        assert too_large["title"] == "Request too large" and too_large["limit_bytes"] == 1 << 20, too_large
        assert too_large["type"] == "https://raftbroker.dev/problems/request_too_large", too_large
        assert sum(p["records"] for p in h.get("/v1/topics/h-rt").json()["partitions"]) == 4, "nothing stored"


def test_paging_with_cursors_neither_skips_nor_repeats(http_cluster: DevCluster) -> None:
    with gateway(http_cluster) as h:
        assert h.put("/v1/topics/h-page", json={"partitions": 3}).status_code == 201
        values = [f"v{i}" for i in range(25)]
        h.post("/v1/topics/h-page/records", json={"records": [{"value": v} for v in values]})
        latest = h.get("/v1/topics/h-page/records", params={"from": "latest"}).json()
        assert latest["records"] == [] and latest["caught_up"]
        got, cursor, pages = [], "earliest", 0
        while True:
            page = h.get("/v1/topics/h-page/records", params={"from": cursor, "limit": 4}).json()
            got += [r["value"] for r in page["records"]]
            cursor, pages = page["next"], pages + 1
            if page["caught_up"]:
                break
        assert sorted(got) == sorted(values) and pages >= 7
        h.post("/v1/topics/h-page/records", json={"records": [{"value": "late"}]})
        more = h.get("/v1/topics/h-page/records", params={"from": cursor}).json()
        assert [r["value"] for r in more["records"]] == ["late"]
        after_latest = h.get("/v1/topics/h-page/records", params={"from": latest["next"]}).json()
        assert [r["value"] for r in after_latest["records"]] == ["late"]
        assert h.post("/v1/topics/h-page/prune", json={"before_offset": 5}).json()["pruned"] > 0
        lossy = h.get("/v1/topics/h-page/records", params={"from": "0", "partition": 0}).json()["records"]
        assert lossy and "event" in lossy[0], "a loss is reported inline, not skipped silently"
        said = problem(h.get("/v1/topics/h-page/records", params={"from": "banana"}), 400, "INVALID_ARGUMENT")
        assert str(said["detail"]).startswith("from must be earliest, latest, an offset, or a cursor"), said
        problem(h.get("/v1/topics/h-page/records", params={"limit": 0}), 400, "INVALID_ARGUMENT")
        problem(h.get("/v1/topics/h-page/records", params={"partition": 7}), 400, "INVALID_ARGUMENT")
        with h.stream("GET", "/v1/topics/h-page/watch", params={"from": "latest", "heartbeat_ms": 200}) as stream:
            assert stream.status_code == 200
            for event in sse_events(stream.iter_lines()):
                assert event.event != "record", "from=latest: nothing old"
                if "heartbeat" in event.comments:
                    break
        problem(h.get("/v1/topics/h-none/watch"), 404, "TOPIC_NOT_FOUND")
        said = problem(h.get("/v1/topics/h-page/watch", headers={"Last-Event-ID": "nonsense"}), 400, "INVALID_ARGUMENT")
        assert str(said["detail"]).startswith("Last-Event-ID is not an event id of this API"), said
        problem(h.get("/v1/topics/h-page/watch", params={"heartbeat_ms": 1}), 400, "INVALID_ARGUMENT")


def test_admin_endpoints(http_cluster: DevCluster) -> None:
    with gateway(http_cluster, follower=True) as h, Client(http_cluster.addresses) as sync:
        status = h.get("/v1/cluster").json()
        assert status["leader_id"] and len(status["nodes"]) == 3
        # the digests begin once the leader raises the format (within a housekeeping period)
        verified = wait_until(lambda: (lambda v: v if v["agreed"] else None)(h.get("/v1/cluster/verify").json()),
                              60, "every member's apply digest agrees")
        assert isinstance(verified, dict) and verified["differing"] == [] and len(verified["nodes"]) == 3, verified
        assert len({n["digest"] for n in verified["nodes"]}) == 1 and verified["index"] > 0, verified
        h.put("/v1/topics/h-adm", json={"partitions": 1})
        sync.publish_batch("h-adm", ["a", "b"], dedup_id="prod", first_msg_id=1)
        assert h.get("/v1/topics/h-adm/watermarks").json()["watermarks"] == [{"dedup_id": "prod", "msg_id": 2}]
        assert h.delete("/v1/topics/h-adm/watermarks/prod").status_code == 204
        assert h.get("/v1/topics/h-adm/watermarks").json()["watermarks"] == []
        problem(h.post("/v1/topics/h-adm/prune", json={}), 400, "INVALID_ARGUMENT")
        assert h.post("/v1/topics/h-adm/prune", json={"before_offset": 1}).json() == {"pruned": 1}
        doc = h.get("/openapi.json").json()
        assert {"/v1/topics/{topic}/records", "/v1/topics/{topic}/watch",
                "/v1/topics/{topic}/groups/{group}/claim"} <= set(doc["paths"])
        assert h.get("/v1/cluster", headers={"Authorization": "Bearer some-token"}).status_code == 200
        problem(h.get("/v1/cluster", headers={b"Authorization": "Bearer caf\u00e9".encode()}), 400,
                "INVALID_ARGUMENT")


def test_a_queue_claimed_by_two_http_workers_no_overlap_and_redelivery(http_cluster: DevCluster) -> None:
    a = httpx.Client(base_url=f"http://{http_cluster.http_address(0)}", timeout=30)
    b = httpx.Client(base_url=f"http://{http_cluster.http_address(1)}", timeout=30)
    with a, b:
        a.put("/v1/topics/h-jobs", json={"partitions": 2})
        a.post("/v1/topics/h-jobs/records", json={"records": [{"value": f"job{i}"} for i in range(30)]})
        first = a.post("/v1/topics/h-jobs/groups/w/claim", json={"max": 10, "visibility_ms": 600000}).json()
        second = b.post("/v1/topics/h-jobs/groups/w/claim", json={"max": 10, "visibility_ms": 600000}).json()
        mine = {(m["partition"], m["offset"]) for m in first["messages"]}
        theirs = {(m["partition"], m["offset"]) for m in second["messages"]}
        assert len(mine) == 10 and len(theirs) == 10 and not mine & theirs, "no job leased to both workers"
        short = a.post("/v1/topics/h-jobs/groups/w/claim", json={"max": 10, "visibility_ms": 1500}).json()
        expired = {(m["partition"], m["offset"]) for m in short["messages"]}
        assert len(expired) == 10 and not expired & (mine | theirs)
        receipts = [m["receipt"] for m in first["messages"]]
        assert a.post("/v1/topics/h-jobs/groups/w/ack", json={"receipts": receipts}).json() == {
            "acked": 10, "settled": 10, "not_settled": []}
        assert b.post("/v1/topics/h-jobs/groups/w/ack", json={"receipts": receipts[:1] + receipts[:1]}).json() == {
            "acked": 2, "settled": 0, "not_settled": [0, 1]}, "settled before: an ack again settles nothing"
        deadlines = b.post("/v1/topics/h-jobs/groups/w/extend",
                           json={"receipts": [second["messages"][0]["receipt"]], "ms": 600000}).json()
        assert deadlines["deadlines_ms"][0] > time.time() * 1000
        assert b.post("/v1/topics/h-jobs/groups/w/nack", json={"receipts": [m["receipt"] for m in second["messages"]],
                                                                "delay_ms": 1}).status_code == 200
        again: dict[tuple[int, int], int] = {}

        def redelivered() -> bool:
            for m in b.post("/v1/topics/h-jobs/groups/w/claim", json={"max": 20, "visibility_ms": 600000}
                            ).json()["messages"]:
                again[(m["partition"], m["offset"])] = m["delivery_attempt"]
            return (expired | theirs) <= set(again)

        wait_until(redelivered, 60, "the expired and the nacked leases to be delivered again", interval_s=0.3)
        assert not set(again) & mine, "acked jobs never come back"
        assert all(again[k] == 2 for k in expired | theirs), json.dumps(list(again.values()))
        lag = a.get("/v1/topics/h-jobs/groups/w/lag").json()
        assert lag["lag"] == 20 and len(lag["partitions"]) == 2
        problem(a.post("/v1/topics/h-jobs/groups/w/ack", json={"receipts": ["%%%"]}), 400, "INVALID_ARGUMENT")
        problem(a.post("/v1/topics/h-jobs/groups/w/claim", json={"max": 0}), 400, "INVALID_ARGUMENT")
        problem(a.get("/v1/topics/h-jobs/groups/nobody/lag"), 404, "GROUP_NOT_FOUND")
        # a claim is for queue-mode groups: of a stream-mode group it would make the gateway a member that
        # owns partitions until its session ran out, starving the real members
        with Client(http_cluster.addresses) as client:
            client.groups.create("h-jobs", "streamers", "stream")
        refused = problem(a.post("/v1/topics/h-jobs/groups/streamers/claim", json={"max": 1}), 412,
                          "FAILED_PRECONDITION")
        assert "stream-mode" in str(refused["detail"]), refused
        with Client(http_cluster.addresses) as client:
            assert client.groups.describe("h-jobs", "streamers").members == {}, "the refused claim joined nothing"


def test_a_claim_reports_the_records_pruned_before_anyone_received_them(http_cluster: DevCluster) -> None:
    """SPEC §3.3 over HTTP: a claim after a prune answers the SKIP_FORWARD its stream was sent beside
    the leases (before, the gateway dropped it), and an ack of a lease that came after the event
    moves the group past the pruned records."""
    with gateway(http_cluster) as h:
        h.put("/v1/topics/h-lost", json={"partitions": 1})
        h.post("/v1/topics/h-lost/records", json={"records": [{"value": v} for v in "abcd"]})
        held = h.post("/v1/topics/h-lost/groups/w/claim", json={"max": 1, "visibility_ms": 600000}).json()
        assert [m["value"] for m in held["messages"]] == ["a"] and held["events"] == []
        assert h.post("/v1/topics/h-lost/prune", json={"before_offset": 2}).json() == {"pruned": 2}
        told = h.post("/v1/topics/h-lost/groups/w/claim", json={"max": 1, "visibility_ms": 600000}).json()
        assert [m["value"] for m in told["messages"]] == ["c"]
        assert [(e["type"], e["partition"], e["offset_before"], e["offset_after"]) for e in told["events"]] == [
            ("skip_forward", 0, 0, 2)]
        for leases, committed in ((held, 1), (told, 3)):  # a was leased before the event, c after it
            receipts = [m["receipt"] for m in leases["messages"]]
            assert h.post("/v1/topics/h-lost/groups/w/ack", json={"receipts": receipts}).json()["settled"] == 1
            assert h.get("/v1/topics/h-lost/groups/w/lag").json()["partitions"][0]["committed"] == committed


def test_one_ack_of_a_lease_from_before_a_prune_and_one_after_its_event_settles_both(http_cluster: DevCluster) -> None:
    """One ack of a (leased before the prune) and c (leased after the SKIP_FORWARD): the settle
    commits past the pruned records, and both records were settled by this call. Before, the
    command's commit ran ahead of its entries and the answer counted 1."""
    with gateway(http_cluster) as h:
        h.put("/v1/topics/h-both", json={"partitions": 1})
        h.post("/v1/topics/h-both/records", json={"records": [{"value": v} for v in "abcd"]})
        held = h.post("/v1/topics/h-both/groups/w/claim", json={"max": 1, "visibility_ms": 600000}).json()
        assert h.post("/v1/topics/h-both/prune", json={"before_offset": 2}).json() == {"pruned": 2}
        told = h.post("/v1/topics/h-both/groups/w/claim", json={"max": 1, "visibility_ms": 600000}).json()
        assert [e["type"] for e in told["events"]] == ["skip_forward"]
        receipts = [m["receipt"] for m in held["messages"] + told["messages"]]
        assert h.post("/v1/topics/h-both/groups/w/ack", json={"receipts": receipts}).json()["settled"] == 2
        assert h.get("/v1/topics/h-both/groups/w/lag").json()["partitions"][0]["committed"] == 3


def test_json_the_rfc_does_not_allow_is_refused_and_such_stored_bytes_read_as_text(http_cluster: DevCluster) -> None:
    """Before: NaN/Infinity were stored (200) as bytes no JSON reader takes and read back as null; a
    schema topic answered "null is not of type number"; deep nesting and long numbers were a bare
    parse error, a text/plain body "Input should be a valid dictionary", a receipt "!!!" "position
    token must be 17 bytes, got 0", and {"value": null} "value ... is required"."""
    with gateway(http_cluster, follower=True) as h, Client(http_cluster.addresses) as sync:
        assert h.put("/v1/topics/h-nan", json={"partitions": 1}).status_code == 201
        nan = '{"records":[{"value":1},{"value":NaN},{"value":Infinity},{"value":-Infinity},{"value":[1.5,NaN]}]}'
        said = problem(h.post("/v1/topics/h-nan/records", content=nan, headers={"content-type": "application/json"}),
                       400, "INVALID_JSON")
        assert str(said["detail"]).startswith("body.records[1].value: NaN is not JSON (RFC 8259"), said
        schema = {"partitions": 1, "schema": {"type": "object", "properties": {"x": {"type": "number"}}}}
        assert h.put("/v1/topics/h-nan-schema", json=schema).status_code == 201
        said = problem(h.post("/v1/topics/h-nan-schema/records", content='{"records":[{"value":{"x":NaN}}]}',
                              headers={"content-type": "application/json"}), 400, "INVALID_JSON")
        assert str(said["detail"]).startswith("body.records[0].value.x: NaN is not JSON"), said
        deep = '{"records":[{"value":' + "[" * 5000 + "]" * 5000 + "}]}"
        problem(h.post("/v1/topics/h-nan/records", content=deep, headers={"content-type": "application/json"}),
                400, "JSON_TOO_DEEP")
        long_number = '{"records":[{"value":' + "7" * 5000 + "}]}"
        problem(h.post("/v1/topics/h-nan/records", content=long_number, headers={"content-type": "application/json"}),
                400, "JSON_NUMBER_TOO_LONG")
        problem(h.post("/v1/topics/h-nan/records", content='{"records":[{"value":1}]}',
                       headers={"content-type": "text/plain"}), 415, "UNSUPPORTED_MEDIA_TYPE")
        assert sync.describe_topic("h-nan").partitions[0].records == 0, "nothing refused was stored"

        sync.publish_batch("h-nan", [b"NaN", b"Infinity", b"-Infinity", b"[1.5,NaN]"])
        assert h.post("/v1/topics/h-nan/records", json={"records": [{"value": None}]}).status_code == 200
        page = h.get("/v1/topics/h-nan/records", params={"partition": 0}).json()["records"]
        assert [r["value"] for r in page] == ["NaN", "Infinity", "-Infinity", "[1.5,NaN]", None], page
        assert base64.b64decode(page[4]["value_b64"]) == b"null", "null is stored as the JSON text null"

        claimed = h.post("/v1/topics/h-nan/groups/w/claim", json={"max": 1, "visibility_ms": 600000}).json()
        assert claimed["messages"][0]["value"] == "NaN"
        said = problem(h.post("/v1/topics/h-nan/groups/w/ack", json={"receipts": ["!!!"]}), 400, "INVALID_ARGUMENT")
        assert str(said["detail"]).startswith("receipt 0 is not a receipt of this API"), said
