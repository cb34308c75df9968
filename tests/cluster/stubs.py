"""Raw gRPC stubs for tests that check exact statuses and metadata."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest

from broker.v1 import admin_pb2_grpc, broker_pb2_grpc


@dataclass
class Stubs:
    channel: grpc.Channel
    broker: broker_pb2_grpc.BrokerStub
    admin: admin_pb2_grpc.AdminStub

    def close(self) -> None:
        self.channel.close()


def stubs(address: str) -> Stubs:
    channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20),
                                                      ("grpc.max_send_message_length", 64 << 20)])
    return Stubs(channel, broker_pb2_grpc.BrokerStub(channel), admin_pb2_grpc.AdminStub(channel))


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    """The status code and message of a call that must fail."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    err = info.value
    return err.code(), err.details()
