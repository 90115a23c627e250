"""A database URL the server turns away (wrong user, unknown database) is a clear error.

It was a driver traceback on every command, ``quotagate init`` first; a server not
listening at all was one too, on ``init``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from support.cli import run
from support.databases import MYSQL_URL, POSTGRES_URL


def _with(url: str, **parts: str | int) -> str:
    return make_url(url).set(**parts).render_as_string(hide_password=False)  # type: ignore[arg-type]


REFUSED = {
    "postgresql, unknown user": (_with(POSTGRES_URL, username="qg_nobody", password="secret-word"),
                                 'role "qg_nobody" does not exist'),
    "postgresql, unknown database": (_with(POSTGRES_URL, database="qg_no_such_database"),
                                     'database "qg_no_such_database" does not exist'),
    "mysql, unknown user": (_with(MYSQL_URL, username="qg_nobody", password="secret-word"),
                            "Access denied for user 'qg_nobody'"),
    "mysql, unknown database": (_with(MYSQL_URL, database="qg_no_such_database"),
                                "Unknown database 'qg_no_such_database'"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
@pytest.mark.parametrize("command", [["init"], ["rate", "show", "team-a"], ["inspect"]])
def test_a_connection_the_server_refuses_is_store_unavailable_with_its_reason(
    case: str, command: list[str], tmp_path: Path
) -> None:
    url, reason = REFUSED[case]
    result = run(*command, db=url, cwd=tmp_path, expect=6)
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: store_unavailable: the database refused the connection")
    assert reason in result.stderr and "secret-word" not in result.stderr


@pytest.mark.parametrize("url", [_with(POSTGRES_URL, port=1), _with(MYSQL_URL, port=1)])
def test_init_on_a_server_that_is_not_there_is_store_unavailable(url: str, tmp_path: Path) -> None:
    result = run("init", db=url, cwd=tmp_path, expect=6)
    assert "Traceback" not in result.stderr
    assert "error: store_unavailable: the ledger database cannot be reached" in result.stderr
