"""Conditional charges of quota and capacity rows, in the form the backend runs cheapest.

One statement per table for all rows on a server (a round trip saved per row), one
per row on SQLite (docs/decisions/051-sqlite-charges-row-by-row.md). Either way every
row must change, or ``missed`` is raised and the transaction rolls back.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from quotagate.store import statements
from quotagate.store.dialect import charges_row_by_row
from quotagate.store.driver import DriverTransaction


def charge_rows(
    transaction: DriverTransaction, table: sa.Table, holder: str, amounts: dict[Any, int],
    *, lock_in_order: bool, missed: Exception, sliced: bool = False,
) -> None:
    """Add ``amounts`` (``{(holder, resource): n}``, or ``{(holder, slice, resource): n}``
    with ``sliced``) to ``table``'s rows where each stays within its cap."""
    if charges_row_by_row(transaction):
        rows = (statements.sliced_charge_row_parameters(amounts) if sliced
                else statements.charge_row_parameters(amounts))
        transaction.expect_rows(statements.charge_row_statement(table, holder, sliced=sliced),
                                rows, missed)
        return
    statement = statements.charge_statement(table, holder, len(amounts),
                                            lock_in_order=lock_in_order, sliced=sliced)
    parameters = (statements.sliced_charge_parameters(amounts) if sliced
                  else statements.charge_parameters(amounts))
    transaction.expect(statement, parameters, len(amounts), missed)
