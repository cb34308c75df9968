"""What gRPC's own logging says about a stream whose peer went away while a response was being sent.

grpc.aio (1.85) runs a response-streaming handler written as an async generator by writing each
item it yields. When the client has gone (a closed ``grpcurl``, a killed consumer, a reset
connection), the write's batch fails; grpc ignores that failure only if it has already seen the
client close, and otherwise logs ``ExecuteBatchError raised in core by servicer method [...]`` at
ERROR with a traceback through its own Cython frames. Which of the two happens is a race inside
grpc (2 runs in 5 of `timeout 1 grpcurl ... Subscribe` against a long backlog logged it), and
either way nothing of ours failed: the stream is over and its ``finally`` blocks ran.

:func:`quiet_abandoned_streams` installs a filter on grpc's logger that turns exactly those records
into one DEBUG line of ours; every other record of grpc's passes unchanged.
"""

from __future__ import annotations

import logging

GRPC_LOGGER = "grpc._cython.cygrpc"
_ABANDONED = "ExecuteBatchError raised in core by servicer method"

log = logging.getLogger(__name__)


class _AbandonedStreamFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(_ABANDONED):
            return True
        log.debug("a response could not be sent, its peer has gone: %s", message[len(_ABANDONED):].strip())
        return False


_FILTER = _AbandonedStreamFilter()


def quiet_abandoned_streams() -> None:
    """Install the filter on grpc's logger (once, however often called)."""
    logger = logging.getLogger(GRPC_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
