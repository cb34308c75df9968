"""What a chaos test does when the fault it needs cannot be injected on this machine.

A developer's laptop may lack root (no network namespaces) or a broker feature a drill scenario
needs: there the test is skipped with the reason, so the rest of the tier still runs. Under
``make chaos`` (and so ``make test`` and CI) ``RAFTBROKER_CHAOS_STRICT=1`` is set and the same test
FAILS with the reason instead: a drill that did not run is not a drill that passed, and a silent
skip would let CI go green with a guarantee of SPEC §9 untested.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from chaos.net import netns_unavailable

STRICT_ENV = "RAFTBROKER_CHAOS_STRICT"


def strict() -> bool:
    """Whether a test that cannot run must fail (``make chaos``) rather than skip."""
    return os.environ.get(STRICT_ENV, "") == "1"


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail with it when :func:`strict`."""
    if strict():
        pytest.fail(f"could not run: {reason} ({STRICT_ENV}=1: make chaos runs every drill or fails)",
                    pytrace=False)
    pytest.skip(reason)


def require_netns() -> None:
    """Network namespaces (root, ``ip netns``) or :func:`unavailable`."""
    reason = netns_unavailable()
    if reason is not None:
        unavailable(f"network namespaces: {reason}")
