"""What a scripted ``Publish``/``PublishStream`` server (the publish-stream unit tests of both
SDKs) was sent and how, and its answers: each names the way the request travelled and the count so
far, so a test reads what was sent how."""

from __future__ import annotations

from broker.v1 import broker_pb2


class PublishScript:
    """``actions`` scripts the stream requests in arrival order: "answer", "end" (end the stream
    without answering), "hang", or a status code to abort with (each server may add its own)."""

    def __init__(self) -> None:
        self.actions: list[object] = []
        self.streams_opened = 0
        self.streams_ended = 0
        self.stream_requests: list[bytes] = []
        self.unary_requests: list[bytes] = []

    def answer(self, via: str, n: int) -> broker_pb2.PublishResponse:
        partition = {"stream": 0, "unary": 1}[via]  # the way it travelled, in a field the answer has
        return broker_pb2.PublishResponse(results=[broker_pb2.PublishResult(partition=partition, offset=n)])


def via(response: broker_pb2.PublishResponse) -> tuple[str, int]:
    """The way an answered request travelled ("stream" or "unary") and the count the server gave it."""
    return ("stream", "unary")[response.results[0].partition], response.results[0].offset
