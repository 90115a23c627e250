"""Choosing preemption victims, pure: only what is borrowed, never more than needed."""

from __future__ import annotations

from quotagate.domain.placement import Candidate
from quotagate.domain.preemption import Running, choose_preemption
from quotagate.domain.sharing import Member, MemberLimits, Sharing, cohort_totals


def _cohort(used: dict[str, int], nominal: dict[str, int]) -> tuple[dict, Sharing]:
    tenants = {name: {"gpu": (used[name], nominal[name])} for name in used}
    limits = {(name, "gpu"): MemberLimits(nominal[name]) for name in used}
    room = cohort_totals(Member(name, used[name], limits[name, "gpu"]) for name in used)
    return tenants, Sharing(dict.fromkeys(used, "org"), limits, {"org": {"gpu": room}})


def _work(name: str, tenant: str, gpu: int, priority: int = 0, admitted: float = 0.0,
          stopping: bool = False) -> Running:
    return Running(name, tenant, "pool-1", {"gpu": gpu}, priority, admitted, stopping)


POOLS = {"pool-1": {"gpu": (4, 8)}}


def test_reclaim_takes_the_fewest_borrowed_victims_lowest_priority_latest_first() -> None:
    tenants, sharing = _cohort({"a": 0, "b": 4}, {"a": 2, "b": 2})
    running = [_work("b-0", "b", 1, admitted=1), _work("b-1", "b", 1, admitted=2),
               _work("b-2", "b", 2, priority=5, admitted=3)]
    chosen = choose_preemption([Candidate("a-0", "a", {"gpu": 2})], {"a-0": 0},
                               tenants=tenants, pools=POOLS, sharing=sharing,
                               policies={"a": ("any", "never")}, running=running)
    assert chosen is not None and chosen.kind == "reclaim"
    assert [victim.id for victim in chosen.victims] == ["b-1", "b-0"]


def test_reclaim_never_takes_what_is_within_the_victims_nominal() -> None:
    tenants, sharing = _cohort({"a": 0, "b": 3}, {"a": 2, "b": 2})
    running = [_work("b-0", "b", 1), _work("b-1", "b", 1), _work("b-2", "b", 1)]
    # a needs 2 but b borrows only 1: taking more than that is not a reclaim.
    chosen = choose_preemption([Candidate("a-0", "a", {"gpu": 2})], {"a-0": 0},
                               tenants=tenants, pools={"pool-1": {"gpu": (3, 3)}},
                               sharing=sharing, policies={"a": ("any", "never")},
                               running=running)
    assert chosen is None


def test_work_already_stopping_counts_as_coming_back() -> None:
    tenants, sharing = _cohort({"a": 0, "b": 4}, {"a": 2, "b": 2})
    running = [_work("b-0", "b", 2, stopping=True), _work("b-1", "b", 2)]
    assert choose_preemption([Candidate("a-0", "a", {"gpu": 2})], {"a-0": 0},
                             tenants=tenants, pools=POOLS, sharing=sharing,
                             policies={"a": ("any", "never")}, running=running) is None


def test_within_the_tenant_only_lower_priority_work_is_stopped() -> None:
    tenants = {"a": {"gpu": (2, 2)}}
    running = [_work("low", "a", 1, priority=0), _work("mid", "a", 1, priority=3)]
    chosen = choose_preemption([Candidate("new", "a", {"gpu": 1})], {"new": 3},
                               tenants=tenants, pools=POOLS, sharing=Sharing(),
                               policies={"a": ("never", "lower-priority")}, running=running)
    assert chosen is not None and [victim.id for victim in chosen.victims] == ["low"]
    assert choose_preemption([Candidate("new", "a", {"gpu": 1})], {"new": 0},
                             tenants=tenants, pools=POOLS, sharing=Sharing(),
                             policies={"a": ("never", "lower-priority")},
                             running=running) is None


def test_a_candidate_never_preempts_its_own_preemptor() -> None:
    tenants = {"a": {"gpu": (2, 2)}}
    running = [_work("p", "a", 2, priority=0, admitted=2)]
    arguments: dict = {"tenants": tenants, "pools": {"pool-1": {"gpu": (2, 2)}},
                       "sharing": Sharing(), "policies": {"a": ("never", "lower-priority")},
                       "running": running}
    victim = Candidate("v", "a", {"gpu": 2})
    assert choose_preemption([victim], {"v": 5}, **arguments) is not None
    assert choose_preemption([victim], {"v": 5}, spared={"v": "p"}, **arguments) is None


def test_a_held_preemptor_has_taken_its_room_before_anyone_else_chooses() -> None:
    tenants = {"a": {"gpu": (2, 4)}, "b": {"gpu": (2, 2)}}
    running = [_work("x", "b", 2, stopping=True), _work("y", "b", 2, priority=0)]
    arguments: dict = {"tenants": tenants, "pools": {"pool-1": {"gpu": (4, 4)}},
                       "sharing": Sharing(), "policies": {"b": ("never", "lower-priority")},
                       "running": running}
    other = Candidate("b-new", "b", {"gpu": 2})
    # Without the hold, the stopping work's room would let b-new in: nothing to do.
    assert choose_preemption([other], {"b-new": 5}, **arguments) is None
    held = Candidate("a-held", "a", {"gpu": 2})
    chosen = choose_preemption([other], {"b-new": 5}, holders=[held], **arguments)
    assert chosen is not None and [victim.id for victim in chosen.victims] == ["y"]


def test_held_room_keeps_out_only_what_the_preemptor_needs() -> None:
    from quotagate.domain.preemption import HeldRoom

    # The victim's 2 are back: the pool has 3 free, of which the preemptor needs 2.
    held = HeldRoom([Candidate("p", "a", {"gpu": 2})], [])
    tenants = {"a": {"gpu": (2, 4)}, "c": {"gpu": (0, 4)}}
    room = {"pool-1": {"gpu": (2, 5)}}
    small, big = Candidate("c-1", "c", {"gpu": 1}), Candidate("c-2", "c", {"gpu": 2})
    assert held.allows(small, "pool-1", tenants, room, None, set())
    assert not held.allows(big, "pool-1", tenants, room, None, set())
    assert held.allows(Candidate("p", "a", {"gpu": 2}), "pool-1", tenants, room, None, set())
    # Still stopping, its cost counts as coming back: the 2 free now are anyone's.
    stopping = HeldRoom([Candidate("p", "a", {"gpu": 2})],
                        [_work("victim", "a", 2, stopping=True)])
    assert stopping.allows(big, "pool-1", {"a": {"gpu": (4, 4)}, "c": {"gpu": (0, 4)}},
                           {"pool-1": {"gpu": (4, 6)}}, None, set())
    # A preemptor already placed in this plan holds nothing more.
    assert held.allows(big, "pool-1", tenants, room, None, {"p"})
