"""One unary ``Admin`` call as data, so the sync and asyncio SDKs build it with the same code.

An :class:`AdminCall` says which RPC to make, with which request, whether it writes (writes go to
the leader; reads may start anywhere), what its errors call it, and how its answer becomes the SDK's
value. The functions that build them live beside the plain types they return (:mod:`.log_admin`,
:mod:`.routes`, :mod:`.groups`, :mod:`.membership`); the two clients differ only in how they run one:
``router.admin_call(call)`` (:meth:`broker.client.routing.Router.admin_call`) or
``await router.admin_call(call)`` (:meth:`broker.client.aio.routing.AsyncRouter.admin_call`), each
with its router's leader following, retries and deadlines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class AdminCall(Generic[R]):
    """``Admin.<method>(request)``; ``parse`` turns its response into what the SDK returns, and
    ``what`` names the call in errors ("create group g: no leader answered ...")."""

    method: str
    request: Any
    what: str
    parse: Callable[[Any], R]
    write: bool = True

    def __post_init__(self) -> None:
        assert self.method[:1].isupper(), f"an Admin RPC name, got {self.method!r}"


def nothing(response: object) -> None:
    """The ``parse`` of a call whose answer carries nothing the SDK returns."""
    return None
