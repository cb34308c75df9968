"""Asking a running cluster whether it serves an RPC: the drills' availability probes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc

_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def unimplemented(addresses: Sequence[str], call: Callable[[grpc.Channel], object]) -> tuple[bool, str]:
    """(True, server's words) if the RPC answers UNIMPLEMENTED; (False, what it answered) otherwise.
    Transient failures (a node down or busy) are retried on the other nodes."""
    answer = "no node answered"
    for address in list(addresses) * 2:
        channel = grpc.insecure_channel(address)
        try:
            call(channel)
            return False, "OK"
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
            details = err.details() if isinstance(err, grpc.Call) else str(err)
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return True, str(details)
            answer = f"{code.name}: {details}"
            if code not in _TRANSIENT:
                return False, answer
        finally:
            channel.close()
    return False, answer
