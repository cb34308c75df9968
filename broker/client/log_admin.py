"""Retention changes, prune and clear (SPEC §2.2) for :class:`broker.client.Client`."""

from __future__ import annotations

from collections.abc import Mapping

from broker.client import checks, wire
from broker.client.errors import invalid_argument
from broker.client.models import FULL_POLICIES, Retention, TopicInfo
from broker.client.routing import Router
from broker.v1 import admin_pb2


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
        if full_policy is not None and full_policy not in FULL_POLICIES:
            raise invalid_argument(f"unknown full_policy {full_policy!r}; use one of {', '.join(FULL_POLICIES)}")
        if retention is None:
            retention = self._describe(name).retention
        config = wire.topic_config(name, 1, retention, None, full_policy)
        request = admin_pb2.AlterTopicRequest(name=name, retention=config.retention, full_policy=config.full_policy)
        info = self._router.call(lambda addr, t: self._router.admin(addr).AlterTopic(request, timeout=t),
                                 write=True, what=f"alter topic {name}")
        return wire.topic_info(info)

    def prune(self, topic: str, before_offset: int | None = None, partition: int | None = None, *,
              group: str | None = None) -> int:
        """Delete every record before ``before_offset`` (in ``partition``, or in every partition);
        returns how many were deleted. Readers behind the new start get ``skip_forward``.

        ``group`` (a group marked lead, ``client.groups.mark``): prune up to what it has committed,
        and no further than ``before_offset`` when that is given too. A group marked protect refuses
        a prune past its own committed position (``FailedPrecondition``; nothing is deleted)."""
        request = admin_pb2.PruneRequest(topic=topic, before_offset=checks.prune_before(before_offset, group),
                                         group=group or "")
        if partition is not None:
            request.partition = checks.in_range(partition, "partition", 0, checks.UINT32_MAX)
        response = self._router.call(lambda addr, t: self._router.admin(addr).Prune(request, timeout=t),
                                     write=True, what=f"prune {topic}")
        return int(response.records_pruned)

    def clear_topic(self, name: str) -> None:
        """Delete every record of a topic; offsets keep growing from where they were."""
        request = admin_pb2.ClearTopicRequest(name=name)
        self._router.call(lambda addr, t: self._router.admin(addr).ClearTopic(request, timeout=t),
                          write=True, what=f"clear topic {name}")

    def _describe(self, name: str) -> TopicInfo:
        request = admin_pb2.DescribeTopicRequest(name=name)
        info = self._router.call(lambda addr, t: self._router.admin(addr).DescribeTopic(request, timeout=t),
                                 write=False, what=f"describe topic {name}")
        return wire.topic_info(info)
