"""What `quotagate worker --once` says a pass did, from the delivery counters around it."""

from __future__ import annotations

from quotagate.delivery.pass_report import PassReport
from quotagate.store.counters import DELIVERY_COUNTERS


def test_the_report_is_the_counters_difference_in_words() -> None:
    before = dict.fromkeys(DELIVERY_COUNTERS, 5)
    after = {**before, "delivered": 8, "given_up": 6, "stopped": 6, "executor_completed": 7}
    report = PassReport.between("worker/w1", before, after, admitted=2)
    assert report.sentence() == (
        "admitted 2 requests, delivered 3 requests, 1 failed, 1 stop confirmed, "
        "2 completed and 0 failed by their executor")


def test_an_unconfirmed_stop_is_not_counted_as_a_delivery_to_retry() -> None:
    # The outbox counts both as "retried": a failed delivery and a stop not yet confirmed.
    before = dict.fromkeys(DELIVERY_COUNTERS, 0)
    after = {**before, "retried": 3, "stops_pending": 1}
    assert PassReport.between("worker/w1", before, after, admitted=None).sentence() == (
        "delivered 0 requests, 0 failed, 2 to retry, 0 stops confirmed, "
        "1 stop awaiting the target")


def test_a_pass_without_its_lease_says_why_it_did_nothing() -> None:
    assert PassReport("worker/w1", lease_held=False).sentence() == (
        "did nothing: lease worker/w1 is held by another live worker (each live worker "
        "needs its own --name; a dead one's lease expires)")


def test_stops_begun_at_the_max_runtime_are_said_apart() -> None:
    before = dict.fromkeys(DELIVERY_COUNTERS, 0)
    after = {**before, "overruns": 2, "stopped": 1}
    assert PassReport.between("worker/w1", before, after, admitted=None).sentence() == (
        "delivered 0 requests, 0 failed, 2 stops begun at the max-runtime, 1 stop confirmed")
