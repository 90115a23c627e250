"""What the CLI says about a cohort member's borrowing limit (docs/fair-sharing.md).

Each of these was inexact: a member's cost above nominal + borrowing limit was refused with
"its quota allows gpu=6" (its quota is 4); a bad limit was "borrowing_limit for 'gpu'", the
API's field name in a sentence; `tenant set --borrowing-limit` answered with caps only, not the
limit it set; `tenant show` printed a member's nominal under "cap" (used 5, cap 4: over its cap?)
and a missing limit as "none", which reads as "borrows nothing" where it means "as far as the
cohort has room".
"""

from __future__ import annotations

from pathlib import Path

from quotagate import Quotagate
from support.cli import run


def test_borrowing_limit_messages_are_exact(db_url: str, tmp_path: Path) -> None:
    def quotagate(*args: str, expect: int = 0) -> tuple[str, str]:
        result = run(*args, db=db_url, cwd=tmp_path, expect=expect)
        return result.stdout, result.stderr

    quotagate("pool", "set", "pool-1", "--capacity", "gpu=16")
    quotagate("cohort", "set", "research")
    _, refused = quotagate("tenant", "set", "team-a", "--quota", "gpu=4", "--cohort", "research",
                           "--borrowing-limit", "gpu=-1", expect=2)
    assert refused == ("error: invalid_borrowing_limit: borrowing limit for 'gpu' must be zero or "
                       "more and at most 1000000000000, got -1\n")
    _, refused = quotagate("tenant", "set", "team-a", "--quota", "gpu=4", "--cohort", "research",
                           "--lending-limit", "gpu=x", expect=2)
    assert refused == ("error: invalid_lending_limit: lending limit for 'gpu' must be a whole "
                       "number, got 'x'\n")
    with Quotagate.connect(db_url) as gate:
        assert gate.tenants() == []  # refused whole

    shown, _ = quotagate("tenant", "set", "team-a", "--quota", "gpu=4", "--cohort", "research",
                         "--borrowing-limit", "gpu=2")
    assert shown.splitlines()[1:] == [
        "resource  used  nominal  borrowing limit  lending limit",
        "--------  ----  -------  ---------------  -------------",
        "gpu       0     4        2                no limit"]
    quotagate("tenant", "set", "team-b", "--quota", "gpu=4", "--cohort", "research")
    shown, _ = quotagate("tenant", "show", "team-b")
    assert "gpu       0     4        no limit         no limit" in shown.splitlines()
    plain, _ = quotagate("tenant", "set", "team-c", "--quota", "gpu=4")
    assert plain.splitlines()[1] == "resource  used  cap"  # no cohort: a cap

    for command in (("submit", "--id", "big"), ("simulate",)):
        _, refused = quotagate(*command, "--tenant", "team-a", "--cost", "gpu=7", expect=2)
        assert refused == (
            "error: cost_above_quota: cost gpu=7 is more than tenant 'team-a' can ever hold: its "
            "nominal quota gpu=4 plus its borrowing limit gpu=2 allow gpu=6; nothing was submitted\n")
    _, refused = quotagate("submit", "--id", "big", "--tenant", "team-c", "--cost", "gpu=7", expect=2)
    assert refused == ("error: cost_above_quota: cost gpu=7 is more than tenant 'team-c' can ever "
                       "hold: its quota allows gpu=4; nothing was submitted\n")

    # At its ceiling the member borrows, and the next is told what its limit leaves.
    quotagate("submit", "--id", "a-1", "--tenant", "team-a", "--cost", "gpu=5")
    quotagate("admit", "--until-idle")
    quotagate("submit", "--id", "a-2", "--tenant", "team-a", "--cost", "gpu=2")
    explained, _ = quotagate("explain", "a-2")
    assert explained.startswith("a-2: borrowing_limit: gpu needs 2, 1 available"), explained
    shown, _ = quotagate("tenant", "show", "team-a")
    assert "gpu       5     4        2                no limit" in shown.splitlines()
