"""Retention changes, prune and clear (SPEC §2.2) for :class:`broker.client.Client`, and the calls
(:mod:`broker.client.calls`) both SDKs make for them."""

from __future__ import annotations

from collections.abc import Mapping

from broker.client import checks, wire
from broker.client.calls import AdminCall, nothing
from broker.client.errors import invalid_argument
from broker.client.models import FULL_POLICIES, Retention, TopicInfo
from broker.client.routing import Router
from broker.v1 import admin_pb2


def check_full_policy(full_policy: str | None) -> None:
    """InvalidArgument for a full policy that is neither None (keep it) nor one of ``FULL_POLICIES``."""
    if full_policy is not None and full_policy not in FULL_POLICIES:
        raise invalid_argument(f"unknown full_policy {full_policy!r}; use one of {', '.join(FULL_POLICIES)}")


def alter_topic_call(name: str, retention: Mapping[str, int | None] | Retention,
                     full_policy: str | None) -> AdminCall[TopicInfo]:
    """``AlterTopic`` with the caps ``retention`` gives (all three: one left out is removed)."""
    check_full_policy(full_policy)
    config = wire.topic_config(name, 1, retention, None, full_policy)
    request = admin_pb2.AlterTopicRequest(name=name, retention=config.retention, full_policy=config.full_policy)
    return AdminCall("AlterTopic", request, f"alter topic {name}", wire.topic_info)


def prune_call(topic: str, before_offset: int | None, partition: int | None, group: str | None) -> AdminCall[int]:
    """``Prune``: the arguments checked (InvalidArgument) before anything is sent; answers the count."""
    request = admin_pb2.PruneRequest(topic=topic, before_offset=checks.prune_before(before_offset, group),
                                     group=group or "")
    if partition is not None:
        request.partition = checks.in_range(partition, "partition", 0, checks.UINT32_MAX)
    return AdminCall("Prune", request, f"prune {topic}", lambda response: int(response.records_pruned))


def clear_topic_call(name: str) -> AdminCall[None]:
    return AdminCall("ClearTopic", admin_pb2.ClearTopicRequest(name=name), f"clear topic {name}", nothing)


class LogAdminMixin:
    """Methods of :class:`~broker.client.Client` that delete records or change retention."""

    _router: Router

    def alter_topic(
        self,
        name: str,
        *,
        retention: Mapping[str, int | None] | Retention | None = None,
        full_policy: str | None = None,
    ) -> TopicInfo:
        """Change a topic's retention caps and/or full policy; returns the new description.

        ``retention`` REPLACES all three caps (``max_age_ms``, ``max_records``, ``max_bytes``): a cap
        left out or ``None`` is removed. ``retention=None`` keeps the current caps. ``full_policy``
        ``None`` keeps the current policy. Lowered caps apply at once (with ``discard_old`` the oldest
        records are deleted by the next housekeeping pass, or by the next append).
        """
        check_full_policy(full_policy)
        if retention is None:
            retention = self._describe(name).retention
        return self._router.admin_call(alter_topic_call(name, retention, full_policy))

    def prune(self, topic: str, before_offset: int | None = None, partition: int | None = None, *,
              group: str | None = None) -> int:
        """Delete every record before ``before_offset`` (in ``partition``, or in every partition);
        returns how many were deleted. Readers behind the new start get ``skip_forward``. A
        ``before_offset`` past the end of a pruned partition is ``InvalidArgument`` (nothing is
        deleted; ``clear_topic`` empties a topic).

        ``group`` (a group marked lead, ``client.groups.mark``): prune up to what it has committed,
        and no further than ``before_offset`` when that is given too. A group marked protect refuses
        a prune past its own committed position (``FailedPrecondition``; nothing is deleted)."""
        return self._router.admin_call(prune_call(topic, before_offset, partition, group))

    def clear_topic(self, name: str) -> None:
        """Delete every record of a topic; offsets keep growing from where they were."""
        self._router.admin_call(clear_topic_call(name))

    def _describe(self, name: str) -> TopicInfo:
        request = admin_pb2.DescribeTopicRequest(name=name)
        return self._router.admin_call(AdminCall("DescribeTopic", request, f"describe topic {name}", wire.topic_info,
                                                 write=False))
