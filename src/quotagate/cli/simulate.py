"""``quotagate simulate``: a dry run of submit that writes nothing (docs/fair-sharing.md#dry-run)."""

from __future__ import annotations

import click

from quotagate.cli.common import db_option, echo_json, open_gate, parse_assignments, reports_errors
from quotagate.cli.rate import rate_store_option
from quotagate.domain.dry_run import Reason, describe_reason
from quotagate.domain.model import parse_payload_text


@click.command()
@click.option("--id", "request_id", default=None,
              help="The id it would have (optional; an existing id is refused).")
@click.option("--tenant", required=True)
@click.option("--cost", "costs", multiple=True, required=True, metavar="RESOURCE=AMOUNT",
              help="Cost in one resource; repeat for several.")
@click.option("--priority", default=0, show_default=True, type=int)
@click.option("--payload", default=None, help="JSON payload (validated as submit does).")
@click.option("--target", default=None, help="Delivery target name (default: the default target).")
@click.option("--max-runtime", default=None, metavar="DURATION",
              help="Its max-runtime (90s, 30m, 2h), as submit takes it.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@db_option
@rate_store_option
@reports_errors
def simulate(
    request_id: str | None, tenant: str, costs: tuple[str, ...], priority: int,
    payload: str | None, target: str | None, max_runtime: str | None, as_json: bool,
    db_url: str | None,
    rate_store: str | None,
) -> None:
    """Would this request be admitted now? Where would it queue, and why would it wait?"""
    parsed_payload = None if payload is None else parse_payload_text(payload)
    with open_gate(db_url, rate_store=rate_store) as gate:
        answer = gate.simulate(tenant, parse_assignments(costs, "cost"), priority=priority,
                               payload=parsed_payload, target=target, request_id=request_id,
                               max_runtime=max_runtime)
    if as_json:
        echo_json(answer)
        return
    verdict = "admissible now" if answer["admissible"] else "would wait"
    click.echo(f"{verdict}: queue position {answer['position']} "
               f"(in its tenant's queue {answer['tenant_position']})")
    for reason in answer["reasons"]:
        click.echo(f"  {describe_reason(Reason(**reason))}")
    for victim in answer["would_preempt"]:
        cost = ",".join(f"{r}={a}" for r, a in sorted(victim["cost"].items()))
        click.echo(f"  would preempt {victim['id']} of {victim['tenant']} ({victim['kind']}, "
                   f"cost {cost}, priority {victim['priority']})")


COMMANDS = [simulate]
