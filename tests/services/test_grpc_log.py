"""grpc's ERROR for a response stream whose peer went away mid-write becomes one DEBUG line of ours;
everything else grpc logs passes unchanged."""

from __future__ import annotations

import logging

import pytest

from broker.services import grpc_log

pytestmark = pytest.mark.unit


def test_only_the_abandoned_stream_record_is_quieted(caplog: pytest.LogCaptureFixture) -> None:
    grpc_log.quiet_abandoned_streams()
    grpc_log.quiet_abandoned_streams()  # idempotent
    grpc_logger = logging.getLogger(grpc_log.GRPC_LOGGER)
    assert grpc_logger.filters.count(grpc_log._FILTER) == 1
    with caplog.at_level(logging.DEBUG):
        try:
            raise RuntimeError("Failed execute_batch")
        except RuntimeError:
            grpc_logger.exception("ExecuteBatchError raised in core by servicer method [/broker.v1.Broker/Subscribe]")
        grpc_logger.error("Unexpected [ValueError] raised by servicer method [/broker.v1.Admin/ListTopics]")
    by_logger = [(r.name, r.levelno) for r in caplog.records]
    assert (grpc_log.GRPC_LOGGER, logging.ERROR) in by_logger, "other grpc errors still reach the log"
    assert [r for r in caplog.records if r.name == grpc_log.GRPC_LOGGER and "ExecuteBatchError" in r.getMessage()] == []
    quiet = [r for r in caplog.records if r.name == grpc_log.log.name]
    assert [r.levelno for r in quiet] == [logging.DEBUG] and "/broker.v1.Broker/Subscribe" in quiet[0].getMessage()
