"""Every client-side copy of a server limit equals the server's one definition (broker/limits.py),
and a limit refuses a bad value where it is defined."""

from __future__ import annotations

import pytest

from broker import limits
from broker.client import InvalidArgument, client, models, wire

pytestmark = pytest.mark.unit


def test_client_copies_equal_the_server_definitions() -> None:
    assert wire.ID_CHARS_MAX == limits.ID_CHARS_MAX
    assert limits.Limits().batch_records_max == client.PUBLISH_BATCH_RECORDS_MAX
    # the SDK's documentation says the same number
    assert f"at most {limits.ID_CHARS_MAX} characters" in (models.OutgoingRecord.__doc__ or "")


def test_the_server_paths_use_the_one_definition() -> None:
    from broker.leader import publish_ids, route_copies, routed_append, topic_log

    assert publish_ids.ID_CHARS_MAX is limits.ID_CHARS_MAX and routed_append.ID_CHARS_MAX is limits.ID_CHARS_MAX
    assert route_copies.ID_CHARS_MAX is limits.ID_CHARS_MAX
    assert topic_log.Limits is limits.Limits and routed_append.Limits is limits.Limits


@pytest.mark.parametrize("bad", [{"record_bytes_max": 0}, {"batch_bytes_max": -1}, {"batch_bytes_max": (64 << 20) + 1},
                                 {"batch_records_max": 0}, {"batch_records_max": 1_000_001}])
def test_limits_refuse_out_of_range_values(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        limits.Limits(**bad)


def test_client_refuses_an_id_over_the_limit_before_sending() -> None:
    assert wire.check_id("k" * limits.ID_CHARS_MAX, "idempotency_key")
    with pytest.raises(InvalidArgument, match=f"1 to {limits.ID_CHARS_MAX} characters"):
        wire.check_id("k" * (limits.ID_CHARS_MAX + 1), "idempotency_key")
