"""``quotagate api-token …`` (credentials for the HTTP API) and ``quotagate audit`` (the audit log)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

from quotagate.cli.common import (
    db_option,
    echo_json,
    ensure_schema,
    open_gate,
    render_table,
    reports_errors,
    utc_time,
)
from quotagate.domain.help_defaults import MAX_PAGE
from quotagate.errors import InvalidInput


@click.group("api-token")
def api_token() -> None:
    """API tokens: credentials for the HTTP API (stored only as hashes)."""


@api_token.command("create")
@click.option("--admin", is_flag=True, help="A token for every operation on every tenant.")
@click.option("--tenant", default=None, help="A token that acts on this tenant only.")
@click.option("--executor", is_flag=True,
              help="A token for the executor behind --target: it may only complete or fail "
                   "requests delivered to that target (docs/http-api.md).")
@click.option("--target", default=None, help="With --executor: the delivery target.")
@click.option("--label", default=None, help="A note to recognise the token by.")
@db_option
@reports_errors
def token_create(admin: bool, tenant: str | None, executor: bool, target: str | None,
                 label: str | None, db_url: str | None) -> None:
    """Create a token and print it once; only its hash is kept."""
    if executor != (target is not None):
        raise InvalidInput("an executor token needs --executor and --target NAME together",
                           code="invalid_token_scope")
    if [admin, tenant is not None, executor].count(True) != 1:
        raise InvalidInput("give exactly one of --admin, --tenant NAME or --executor --target NAME",
                           code="invalid_token_scope")
    with open_gate(db_url) as gate:
        # The first admin token usually comes before the first `serve`.
        ensure_schema(gate)
        created = gate.create_api_token(
            admin=admin, tenant=tenant, executor_target=target, label=label, actor="cli"
        )
    scope = created.info.scope.replace("=", " ")
    click.echo(f"created token {created.info.id} ({scope}); it is shown only now:", err=True)
    click.echo(created.token)


@api_token.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@reports_errors
def token_list(as_json: bool, db_url: str | None) -> None:
    """List tokens (ids and scopes; never secrets)."""
    with open_gate(db_url) as gate:
        tokens = gate.list_api_tokens()
    if as_json:
        echo_json([info.to_dict() for info in tokens])
        return
    click.echo(render_table(
        ["id", "scope", "label", "created", "revoked"],
        [[info.id, info.scope, info.label,
          utc_time(info.created), utc_time(info.revoked)] for info in tokens],
    ))


@api_token.command("revoke")
@click.argument("token_id")
@db_option
@reports_errors
def token_revoke(token_id: str, db_url: str | None) -> None:
    """Revoke a token: the API refuses it from the next request on."""
    with open_gate(db_url) as gate:
        info = gate.revoke_api_token(token_id, actor="cli")
    click.echo(f"revoked token {info.id} at {utc_time(info.revoked)}")


@click.command()
@click.option("--tenant", default=None, help="Only this tenant's entries.")
@click.option("--request", "request_id", default=None,
              help="Only the entries about this request (of its own tenant).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, MAX_PAGE))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@reports_errors
def audit(tenant: str | None, request_id: str | None, limit: int, as_json: bool,
          db_url: str | None) -> None:
    """The audit log, newest first: every decision and admin change (times in UTC)."""
    with open_gate(db_url) as gate:
        page = gate.list_audit(tenant=tenant, request=request_id, limit=limit)
    if as_json:
        echo_json(page.items)
        return
    click.echo(audit_table(page.items))


def audit_table(entries: Sequence[Mapping[str, Any]], *, one_request: bool = False) -> str:
    """The audit entries as a table; those of ``one_request`` without its tenant and id."""
    columns = ["at", "actor", "operation", "outcome", "reason"] if one_request else [
        "id", "at", "actor", "tenant", "operation", "target", "outcome", "reason"]
    return render_table(columns, [[utc_time(entry["at"]) if column == "at" else entry[column]
                                   for column in columns] for entry in entries])


COMMANDS = [api_token, audit]
