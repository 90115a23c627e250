"""What every CLI command shares: the database option, error reporting, output."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from quotagate.errors import InvalidInput, QuotagateError, RateLimited, StoreUnavailable, quoted

if TYPE_CHECKING:
    from quotagate.app import Quotagate

F = TypeVar("F", bound=Callable[..., Any])

# Exit codes: 1 for any refusal, with more specific ones a script can act on.
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CONFLICT = 3
EXIT_NOT_FOUND = 4
EXIT_RATE_LIMITED = 5
EXIT_STORE_UNAVAILABLE = 6

_EXIT_BY_STATUS = {409: EXIT_CONFLICT, 404: EXIT_NOT_FOUND, 429: EXIT_RATE_LIMITED,
                   503: EXIT_STORE_UNAVAILABLE, 400: EXIT_USAGE}

db_option = click.option(
    "--db",
    "db_url",
    envvar="QUOTAGATE_DB",
    default=None,
    help="Database URL: sqlite:///FILE (default ./quotagate.db), postgresql://…, mysql://…. "
    "Also $QUOTAGATE_DB.",
)

# The default is holds.DEFAULT_HOLD_SECONDS, written out: importing the store here would
# cost every command's start-up (docs/performance.md, CLI startup); a unit test keeps them equal.
hold_seconds_option = click.option(
    "--hold-seconds",
    "hold_seconds",
    envvar="QUOTAGATE_HOLD_SECONDS",
    default=600.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds the room a preemption frees is kept for its preemptor before anyone may "
    "take it (0: not kept; docs/fair-sharing.md). Also $QUOTAGATE_HOLD_SECONDS.",
)


# The codes of errors about the ledger database itself: the CLI names the database in them.
_LEDGER_UNAVAILABLE = frozenset({"store_unavailable", "schema_missing", "store_timeout",
                                 "store_busy"})
# The ledger database of the gate this command opened, password masked: an error about an
# unreachable database names which one (a typo in $QUOTAGATE_DB is the usual cause).
_opened_database: str | None = None


def open_gate(db_url: str | None, **options: Any) -> Quotagate:
    # Imported here, not at the top: `--help`, `--version` and a usage error need neither the
    # facade nor SQLAlchemy, and every CLI module imports this one (docs/performance.md, CLI startup).
    from quotagate.app import Quotagate

    global _opened_database
    gate = Quotagate.connect(db_url, **options)
    _opened_database = gate.database
    return gate


def error_line(error: QuotagateError) -> str:
    """The one stderr line for ``error``; an unreachable ledger database is named."""
    message = error.message
    if error.code in _LEDGER_UNAVAILABLE and _opened_database is not None:
        message = f"{message} (database {_opened_database})"
    return f"error: {error.code}: {message}"


def ensure_schema(gate: Quotagate) -> None:
    """Create the schema if absent, so the embedded SQLite default needs no `init`."""
    from sqlalchemy.exc import OperationalError  # loaded already: the gate holds an engine

    try:
        present = gate.has_schema()
    except OperationalError as error:
        translated = _translated(error)
        raise (translated if isinstance(translated, StoreUnavailable) else
               StoreUnavailable("the ledger database cannot be reached")) from error
    if not present:
        click.echo("creating the ledger schema", err=True)
        gate.init()


class LazyChoice(click.Choice[str]):
    """A ``click.Choice`` whose choices are loaded when a command first needs them.

    For choices that live in a heavy module (the lab's scenarios import the streaming
    package): registering the command then imports nothing, and its help, its parsing
    and its error for a wrong value are those of a plain ``click.Choice``.
    """

    def __init__(self, load: Callable[[], Sequence[str]], case_sensitive: bool = True) -> None:
        self._load = load
        self._loaded: tuple[str, ...] | None = None
        super().__init__((), case_sensitive)

    @property
    def choices(self) -> tuple[str, ...]:
        if self._loaded is None:
            self._loaded = tuple(self._load())
        return self._loaded

    @choices.setter
    def choices(self, value: Sequence[str]) -> None:
        # click.Choice.__init__ assigns the (empty) choices given above; the loader stays.
        if value:
            self._loaded = tuple(value)


def _translated(error: Exception) -> QuotagateError | None:
    """The domain error for a driver error that escaped the facade untranslated (a
    worker's first read of the ledger id, say), or None: an unreachable database is one
    error line and exit 6, never a traceback."""
    if "sqlalchemy" not in sys.modules:  # nothing opened a database: not a driver error
        return None
    from sqlalchemy.exc import DBAPIError

    from quotagate.store.dialect import translate

    if not isinstance(error, DBAPIError):
        return None
    translated = translate(error)
    return translated if isinstance(translated, QuotagateError) else None


def reports_errors(function: F) -> F:
    """Turn quotagate errors into one stderr line and a meaningful exit code."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as raised:
            error = raised if isinstance(raised, QuotagateError) else _translated(raised)
            if error is None:
                raise
            click.echo(error_line(error), err=True)
            if isinstance(error, RateLimited):
                click.echo(f"retry after {error.retry_after:.1f}s", err=True)
            sys.exit(_EXIT_BY_STATUS.get(error.status, EXIT_ERROR))

    return wrapper  # type: ignore[return-value]


def parse_assignments(
    values: tuple[str, ...], what: str, *, allow_none: bool = False
) -> dict[str, object]:
    """``("gpu=1", "cpu=4")`` → ``{"gpu": 1, "cpu": 4}``; the ledger validates the numbers.

    With ``allow_none``, ``gpu=none`` gives ``{"gpu": None}`` (a limit removed).
    """
    parsed: dict[str, object] = {}
    words = what.replace("_", " ")  # "borrowing limit for 'gpu'", as the ledger says it
    for value in values:
        name, sep, amount = value.partition("=")
        if not sep or not name:
            raise InvalidInput(f"{words} must look like NAME=AMOUNT, got {quoted(value)}",
                               code=f"invalid_{what}")
        if allow_none and amount.strip() == "none":
            parsed[name.strip()] = None
            continue
        try:
            parsed[name.strip()] = int(amount)
        except ValueError:
            raise InvalidInput(
                f"{words} for {quoted(name)} must be a whole number, got {quoted(amount)}",
                code=f"invalid_{what}",
            ) from None
    return parsed


def parse_whole(text: str, what: str) -> int:
    """A whole number from the command line, or the error a user can act on."""
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(f"{what} must be a whole number, got {quoted(text)}",
                           code=f"invalid_{what}") from None


def utc_time(epoch: float | None) -> str:
    """A time as the CLI prints it, its zone said: ``2026-12-07 19:20:00 UTC`` ("" for none)."""
    if epoch is None:
        return ""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def render_table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
