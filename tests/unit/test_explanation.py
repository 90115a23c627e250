"""The sentence ``explain`` gives for a request its tenant's quota holds back."""

from __future__ import annotations

from quotagate.domain.explanation import explain_waiting


def test_a_cap_lowered_below_use_leaves_no_room_and_says_so() -> None:
    # Two gpu in use, the cap lowered to 1 since: it said "-1 of 1 left".
    reason = explain_waiting({"gpu": 1}, {"gpu": (2, 1)}, {"pool-1": {"gpu": (0, 4)}}, 1, 32)
    assert reason.reason == "tenant quota: gpu needs 1, 0 of 1 left (used 2 is over the cap)"


def test_a_cap_not_reached_says_what_is_left() -> None:
    reason = explain_waiting({"gpu": 2}, {"gpu": (1, 2)}, {"pool-1": {"gpu": (0, 4)}}, 1, 32)
    assert reason.reason == "tenant quota: gpu needs 2, 1 of 2 left"


def test_a_cost_above_the_whole_cap_says_the_cap_must_be_raised() -> None:
    # Accepted before its quota was lowered under its cost (docs/decisions/809).
    reason = explain_waiting({"gpu": 3}, {"gpu": (1, 2)}, {"pool-1": {"gpu": (0, 4)}}, 1, 32)
    assert reason.reason == ("tenant quota: gpu needs 3, more than its whole quota of 2; "
                             "it cannot be admitted until the quota is raised")
