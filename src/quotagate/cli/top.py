"""``quotagate top``: the dashboard in a terminal (rich), live or one frame with ``--once``.

It reads the same snapshot as the page at ``/ui/``: straight from the ledger
(``--db``, any backend URL) or from a running server (``--url`` and
``--token``). See docs/dashboard.md.
"""

from __future__ import annotations

import os
import time
from typing import Any

import click

from quotagate.cli.common import db_option, open_gate, reports_errors
from quotagate.cli.streams import redis_option
from quotagate.domain.model import validate_name
from quotagate.errors import InvalidInput, QuotagateError, StoreUnavailable, Unauthorized


def _rich() -> Any:
    try:
        import rich
    except ModuleNotFoundError as exc:
        raise click.ClickException(
            "quotagate top needs rich: pip install 'quotagate[top]'"
        ) from exc
    import rich.console

    return rich


def _from_server(url: str, token: str, tenant: str | None) -> dict[str, Any]:
    try:
        import httpx
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on extras installed
        raise click.ClickException("top --url needs httpx: pip install 'quotagate[top]'") from exc
    try:
        response = httpx.get(
            f"{url.rstrip('/')}/v1/dashboard", params={"tenant": tenant} if tenant else None,
            headers={"Authorization": f"Bearer {token}"}, timeout=10,
        )
    except httpx.TransportError as error:
        raise StoreUnavailable(f"the server at {url} did not answer: {error}",
                               code="server_unreachable") from error
    if response.status_code != 200:
        try:
            body = response.json()
        except ValueError:
            body = {}
        refusal = QuotagateError(body.get("message", f"HTTP {response.status_code}"),
                                 code=body.get("code", "http_error"))
        refusal.status = response.status_code  # the exit code follows the server's status
        raise refusal
    data: dict[str, Any] = response.json()
    return data


_BAR_WIDTH = 30


def _age(value: float) -> str:
    seconds = max(0, round(value))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _cost(cost: dict[str, int]) -> str:
    return " ".join(f"{name}={amount}" for name, amount in cost.items())


def render(data: dict[str, Any]) -> Any:
    """One frame: a rich renderable of the snapshot ``data`` (the /v1/dashboard body)."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    def usage_table(title: str, rows: list[dict[str, Any]], holder: str) -> Table:
        table = Table(title=title, title_justify="left")
        table.add_column(holder)
        table.add_column("resource")
        table.add_column("usage", width=_BAR_WIDTH)
        table.add_column("used/cap", justify="right")
        # Fair-sharing columns only when some tenant is in a cohort; a budget only
        # when the server reports one (docs/dashboard.md).
        shared = any(row.get("cohort") for row in rows)
        budgets = any(row.get("budget_left_hours") is not None for row in rows)
        extra = (["cohort", "borrowed", "lent"] if shared else []) + (
            ["budget left"] if budgets else [])
        for name in extra:
            table.add_column(name, justify="left" if name == "cohort" else "right")
        for row in rows:
            share = row["used"] / row["cap"] if row["cap"] else 1.0
            style = "red" if share >= 1 else "yellow" if share >= 0.8 else "blue"
            cells = [row["name"], row["resource"],
                     ProgressBar(total=max(1, row["cap"]), completed=min(row["used"], row["cap"]),
                                 width=_BAR_WIDTH, complete_style=style, finished_style=style),
                     f"{row['used']}/{row['cap']}"]
            if shared:
                cells += [row.get("cohort") or "-", str(row.get("borrowed", 0)),
                          str(row.get("lent", 0))]
            if budgets:
                left = row.get("budget_left_hours")
                cells.append("-" if left is None
                             else f"{left:g}h of {row.get('budget_limit') or '?'}")
            table.add_row(*cells)
        if not rows:
            table.add_row(f"no {holder} yet", "", "", "", *([""] * len(extra)))
        return table

    scope = "all tenants" if data.get("tenant") is None else f"tenant {data['tenant']}"
    history = data.get("history", [])
    header = Text.assemble(
        ("quotagate top", "bold"), f"  {scope}  ",
        f"waiting {data['waiting']}  undelivered {data['backlog']}  "
        f"stops not confirmed {len(data['stops'])}  "
        f"last hour: admitted {sum(m['admitted'] for m in history)}, "
        f"rejected {sum(m['rejected'] for m in history)}  ",
        (time.strftime("%H:%M:%S UTC", time.gmtime(data["at"])), "dim"),
    )
    # Room a preemption freed, held for its waiting preemptor (docs/decisions/721).
    held = ", ".join(hold["id"] for hold in data.get("holds", []))
    queue = Table(title=f"Queue head ({len(data['queue'])} of {data['waiting']})"
                        + (f"  room held for {held}" if held else ""),
                  title_justify="left", expand=True)
    for name, justify in (("#", "right"), ("request", "left"), ("tenant", "left"),
                          ("cost", "left"), ("prio", "right"), ("age", "right"),
                          ("why it waits", "left")):
        queue.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for entry in data["queue"][:15]:
        queue.add_row(str(entry["position"]), entry["id"], entry["tenant"], _cost(entry["cost"]),
                      f"{entry['effective_priority']:.1f}", _age(entry["waited_seconds"]),
                      entry["reason"])
    if not data["queue"]:
        queue.add_row("", "nothing is waiting", "", "", "", "", "")
    decisions = Table(title="Recent decisions", title_justify="left", expand=True)
    # In UTC, as every time the CLI prints: the ledger's servers and readers span zones.
    for name in ("when (UTC)", "tenant", "operation", "outcome", "target"):
        decisions.add_column(name, no_wrap=True)
    decisions.add_column("reason", no_wrap=True, overflow="ellipsis", ratio=1)
    for entry in data["decisions"][:12]:
        outcome_style = ("red" if entry["outcome"] in ("rejected", "refused", "expired")
                         else "yellow" if entry["operation"] == "preempt" else "")
        decisions.add_row(time.strftime("%H:%M:%S", time.gmtime(entry["at"])),
                          entry["tenant"] or "-", entry["operation"],
                          Text(entry["outcome"], style=outcome_style), entry["target"] or "",
                          entry["reason"] or "")
    if not data["decisions"]:
        decisions.add_row("", "", "no decisions yet", "", "", "")
    parts: list[Any] = [header, usage_table("Tenants", data["tenants"], "tenant"),
                        usage_table("Pools", data["pools"], "pool")]
    if data.get("cohorts"):
        parts.append(usage_table("Cohorts (shared room)", data["cohorts"], "cohort"))
    return Group(*parts, queue, decisions, _streams_table(data.get("streams")))


def _streams_table(streams: dict[str, Any] | None) -> Any:
    """Topics with length, pending, lag and DLQ; a server older than the view sends none."""
    from rich.table import Table

    streams = streams or {"topics": [], "total": 0, "error": None}
    topics = streams["topics"]
    table = Table(title=f"Streams ({len(topics[:10])} of {streams['total']} topics)",
                  title_justify="left", expand=True)
    table.add_column("tenant", no_wrap=True)
    table.add_column("topic", no_wrap=True)
    for name in ("parts", "length", "pending", "lag", "dlq"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("groups", no_wrap=True, overflow="ellipsis", ratio=1)

    def shown(value: int | None) -> str:
        return "-" if value is None else str(value)

    for topic in topics[:10]:
        table.add_row(topic["tenant"], topic["topic"], str(topic["partitions"]),
                      shown(topic["length"]), shown(topic["pending"]), shown(topic["lag"]),
                      shown(topic["dlq"]),
                      " ".join(f"{group['group']}(lag {shown(group['lag'])})"
                               for group in topic["groups"]))
    if streams["error"]:
        table.caption = f"stream numbers unavailable: {streams['error']['message']}"
        table.caption_style = "red"
    if not topics:
        table.add_row("", "no stream topics", "", "", "", "", "", "")
    return table


@click.command()
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts).")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(0.2, 60),
              help="Seconds between refreshes.")
@click.option("--tenant", default=None, help="Only this tenant.")
@click.option("--url", default=None, envvar="QUOTAGATE_URL",
              help="Read from a running server (http://HOST:PORT) instead of the database. "
              "Also $QUOTAGATE_URL.")
@click.option("--token", default=None, envvar="QUOTAGATE_TOKEN",
              help="API token for --url (also $QUOTAGATE_TOKEN); a tenant token sees its tenant.")
@click.option("--width", default=None, type=click.IntRange(60, 400),
              help="Columns to draw (default: the terminal's).")
@db_option
@redis_option
@reports_errors
def top(once: bool, interval: float, tenant: str | None, url: str | None, token: str | None,
        width: int | None, db_url: str | None, redis_url: str | None) -> None:
    """The dashboard in the terminal: tenants and pools, queue head with reasons, decisions,
    stream topics with lag."""
    rich = _rich()
    if url is not None and not token:
        raise InvalidInput("--url needs --token (or $QUOTAGATE_TOKEN)", code="missing_token")
    if url is None and token:
        raise InvalidInput("--token is for --url; with --db the ledger is read directly",
                           code="invalid_option")
    console = rich.console.Console(width=width or (None if os.isatty(1) else 120))
    gate = None if url is not None else open_gate(db_url, redis=redis_url)

    def frame() -> Any:
        if url is not None:
            return render(_from_server(url, token or "", tenant))
        assert gate is not None
        return render(gate.dashboard(tenant).to_dict())

    try:
        if tenant is not None and gate is not None:
            validate_name(tenant, "tenant")
            gate.tenant(tenant)  # a misspelt tenant is unknown_tenant, not an empty frame
        if once:
            console.print(frame())
            return
        from rich.live import Live

        with Live(frame(), console=console, screen=False, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                try:
                    live.update(frame(), refresh=True)
                except (StoreUnavailable, Unauthorized) as error:
                    live.update(rich.text.Text(f"error: {error.code}: {error.message}",
                                               style="red"), refresh=True)
    except KeyboardInterrupt:
        return
    finally:
        if gate is not None:
            gate.close()


COMMANDS = [top]
