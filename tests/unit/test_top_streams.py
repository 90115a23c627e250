"""`quotagate top` from a /v1/dashboard body: its Streams table (from a server without the view,
with its Redis down), the columns that appear only when the server sends them, and held room."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from quotagate.cli.top import render


def _frame(**extra: Any) -> str:
    data = {"tenant": None, "at": 0.0, "waiting": 0, "backlog": 0, "stops": [], "history": [],
            "tenants": [], "pools": [], "queue": [], "decisions": [], **extra}
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(render(data))
    return console.export_text()


def test_a_server_without_the_streams_view_gives_an_empty_table() -> None:
    frame = _frame()
    assert "Streams (0 of 0 topics)" in frame and "no stream topics" in frame


def test_an_unreachable_stream_redis_is_said_under_the_table() -> None:
    frame = _frame(streams={"total": 1, "error": {
        "code": "stream_store_unavailable",
        "message": "the stream Redis redis://127.0.0.1:1/0 cannot be reached"}, "topics": [{
            "tenant": "team-a", "topic": "orders", "partitions": 2, "parallelism": 1,
            "max_len": None, "length": None, "pending": None, "lag": None, "dlq": None,
            "groups": []}]})
    [line] = [line for line in frame.splitlines() if "orders" in line]
    assert [cell.strip() for cell in line.split("│")[1:-1]] == [
        "team-a", "orders", "2", "-", "-", "-", "-", ""]
    assert "stream numbers unavailable: the stream Redis redis://127.0.0.1:1/0 cannot be" in frame


def _tenant(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "resource": "gpu", "used": 1, "cap": 2, "cohort": None, "nominal": 2,
            "borrowed": 0, "lent": 0, **extra}


def test_a_budget_column_appears_only_when_the_server_reports_budgets() -> None:
    plain = _frame(tenants=[_tenant("team-a")])
    assert "budget left" not in plain and "cohort" not in plain
    frame = _frame(tenants=[_tenant("team-a", budget_left_hours=12.5, budget_limit="100h/30d"),
                            _tenant("team-b")])
    rows = {cells[0]: cells for line in frame.splitlines()
            if len(cells := [cell.strip() for cell in line.split("│")[1:-1]]) == 5}
    assert rows["team-a"][4] == "12.5h of 100h/30d" and rows["team-b"][4] == "-"


def test_held_preemptors_are_named_in_the_queue_title_only_while_a_hold_is_live() -> None:
    frame = _frame(waiting=1, holds=[{"id": "high", "tenant": "team-a", "cost": {"gpu": 2}}])
    assert "Queue head (0 of 1)  room held for high" in frame
    assert "room held for" not in _frame(waiting=1, holds=[])
