"""Pure delivery rules: deterministic names, label values, retry backoff, counters."""

from __future__ import annotations

import re

import pytest

from quotagate import InvalidInput
from quotagate.delivery.naming import external_name, label_value
from quotagate.delivery.retry import RetryPolicy
from quotagate.store.counters import DELIVERY_COUNTERS, delivery_counters

DNS_1123_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

LEDGER = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("tenant", "request_id"),
    [
        ("team-a", "job-1"),
        ("team-a", "Job_1:Retry.2"),
        ("t", "A" * 128),
        ("a" * 63, "x"),
        ("team-a", "..--::"),
    ],
)
def test_external_names_are_valid_dns_1123_labels(tenant: str, request_id: str) -> None:
    name = external_name(LEDGER, tenant, request_id)
    assert DNS_1123_LABEL.fullmatch(name), name
    assert len(name) <= 63


def test_external_names_are_deterministic() -> None:
    # Pinned values: a restarted worker (another process, another version) must
    # derive the very name the first attempt used, or it would create a second object.
    assert external_name(LEDGER, "team-a", "job-1") == "team-a-job-1-afbe31e18d"
    assert external_name(LEDGER, "team-a", "Job_1:Retry.2") == "team-a-job-1-retry-2-9f2bd7aee3"


def test_the_ledger_is_part_of_the_name() -> None:
    assert external_name(LEDGER, "team-a", "job-1") != external_name("other", "team-a", "job-1")


def test_ids_that_read_alike_get_different_names() -> None:
    # Case folding and character replacement make these look the same...
    assert external_name(LEDGER, "team-a", "Job_1") != external_name(LEDGER, "team-a", "job-1")
    # ...and long ids sharing a 60-character prefix are cut to the same text.
    prefix = "x" * 100
    assert external_name(LEDGER, "team-a", prefix + "1") != external_name(LEDGER, "team-a", prefix + "2")
    # The tenant is part of the identity.
    assert external_name(LEDGER, "team-a", "job-1") != external_name(LEDGER, "team-b", "job-1")


def test_label_values_pass_through_when_valid_and_hash_otherwise() -> None:
    assert label_value("job-1") == "job-1"
    # Pinned: selectors written by earlier workers must keep matching.
    assert label_value("job:1") == "h-d1e888ce6b7290a879f2ff1e24dffac802513280"
    assert label_value("a" * 64).startswith("h-")
    assert len(label_value("a" * 128)) <= 63


def test_backoff_doubles_up_to_the_ceiling() -> None:
    policy = RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=5.0)
    assert [policy.delay(n) for n in range(0, 6)] == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert not policy.gives_up(4)
    assert policy.gives_up(5)
    assert RetryPolicy(base_delay=1.0, max_delay=300.0).delay(10_000) == 300.0


@pytest.mark.parametrize(
    "options",
    [{"max_attempts": 0}, {"base_delay": -1.0}, {"base_delay": 5.0, "max_delay": 1.0}],
)
def test_bad_retry_policies_are_refused(options: dict[str, float]) -> None:
    with pytest.raises(InvalidInput):
        RetryPolicy(**options)  # type: ignore[arg-type]


def test_counters_count_apart_and_refuse_unknown_names() -> None:
    counters, other = delivery_counters(), delivery_counters()
    counters.increment("stale_writes")
    counters.increment("claimed", 3)
    assert counters.snapshot() == {**dict.fromkeys(DELIVERY_COUNTERS, 0), "stale_writes": 1, "claimed": 3}
    assert other.snapshot()["stale_writes"] == 0
    with pytest.raises(KeyError):
        counters.increment("no_such_counter")
    counters.reset()
    assert set(counters.snapshot().values()) == {0}


def test_webhook_urls_lose_their_credentials_in_messages() -> None:
    from quotagate.delivery.targets.webhook import redact

    assert redact("https://user:secret@hooks.example:8443/x?y=1") == (
        "https://hooks.example:8443/x?y=***"
    )
    assert redact("see http://h/x?token=abc&b=2 and https://a:b@c/") == (
        "see http://h/x?token=***&b=*** and https://c/"
    )
    assert redact("http://127.0.0.1:9/hooks") == "http://127.0.0.1:9/hooks"


def test_a_later_attempt_gets_a_name_of_its_own() -> None:
    first = external_name(LEDGER, "team-a", "job-1")
    assert external_name(LEDGER, "team-a", "job-1", attempt=1) == first  # names kept
    second = external_name(LEDGER, "team-a", "job-1", attempt=2)
    assert second != first and second.startswith("team-a-job-1-a2-")
    assert len(external_name(LEDGER, "t" * 63, "x" * 128, attempt=12)) <= 63
    assert external_name(LEDGER, "team-a", "job-1", attempt=3) != second
