"""A CLI command imports what it uses: the modules a run loaded, read from the process at exit.

CLI startup is import time (docs/decisions/238-cli-lazy-commands.md); these tests name the heavy
parts a command must not load, not how long it takes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The console script's import and call, and the names of every module loaded, written at exit.
_RUN_RECORDING_MODULES = (
    "import atexit, json, os, sys\n"
    "def record():\n"
    "    with open(os.environ['RECORD_MODULES_TO'], 'w') as file:\n"
    "        json.dump(sorted(sys.modules), file)\n"
    "atexit.register(record)\n"
    "from quotagate.cli.main import main\n"
    "sys.argv[0] = 'quotagate'\n"
    "main()\n"
)

# What only `serve`, the worker's targets, `top`, the streaming commands or the demo use.
_NEVER_AT_STARTUP = (
    "fastapi", "starlette", "pydantic", "uvicorn", "prometheus_client", "kubernetes", "pyspark",
    "httpx", "rich", "redis", "alembic", "jinja2", "quotagate.http", "quotagate.tour",
    "quotagate.observability", "quotagate.streaming", "quotagate.demo",
)


def modules_loaded(*args: str, db: str, cwd: Path) -> set[str]:
    """Run ``quotagate ARGS`` in a fresh interpreter; the modules it had loaded when it exited."""
    record = cwd / "modules.json"
    environment = {**os.environ, "QUOTAGATE_DB": db, "RECORD_MODULES_TO": str(record)}
    result = subprocess.run([sys.executable, "-c", _RUN_RECORDING_MODULES, *args], capture_output=True,
                            text=True, cwd=cwd, env=environment, timeout=120)
    assert result.returncode == 0, (result.stdout, result.stderr)
    return set(json.loads(record.read_text()))


def loaded_of(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` (packages count with their submodules) are among ``modules``."""
    return sorted(name for name in names
                  if name in modules or any(module.startswith(f"{name}.") for module in modules))


@pytest.fixture
def sqlite_ledger(tmp_path: Path) -> str:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    for setup in (["init"], ["tenant", "set", "team-a", "--quota", "gpu=2"],
                  ["pool", "set", "pool-1", "--capacity", "gpu=4"]):
        modules_loaded(*setup, db=db, cwd=tmp_path)
    return db


@pytest.mark.sqlite
def test_help_and_version_load_none_of_the_heavy_parts(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'never-opened.db'}"
    assert loaded_of(modules_loaded("--help", db=db, cwd=tmp_path), (*_NEVER_AT_STARTUP, "sqlalchemy")) == []
    # A command's help shows its defaults (page sizes, batches, environment variables) without
    # importing the stores they belong to.
    for command in (["worker", "--help"], ["prune", "--help"], ["audit", "--help"], ["stream", "produce", "--help"],
                    ["submit", "--help"], ["serve", "--help"], ["tenant", "set", "--help"]):
        loaded = modules_loaded(*command, db=db, cwd=tmp_path)
        assert loaded_of(loaded, (*_NEVER_AT_STARTUP, "sqlalchemy", "quotagate.app")) == [], command
    # The version needs neither the facade nor SQLAlchemy.
    version = modules_loaded("--version", db=db, cwd=tmp_path)
    assert loaded_of(version, (*_NEVER_AT_STARTUP, "quotagate.app", "sqlalchemy")) == []
    assert not (tmp_path / "never-opened.db").exists()


@pytest.mark.sqlite
@pytest.mark.parametrize("command", [
    pytest.param(["tenant", "list"], id="tenant-list"),
    pytest.param(["tenant", "show", "team-a"], id="tenant-show"),
    pytest.param(["submit", "--id", "job-0", "--tenant", "team-a", "--cost", "gpu=1"], id="submit"),
])
def test_a_ledger_command_loads_only_the_ledger(command: list[str], sqlite_ledger: str, tmp_path: Path) -> None:
    modules = modules_loaded(*command, db=sqlite_ledger, cwd=tmp_path)
    assert "quotagate.app" in modules  # it did open the ledger
    # Nor the worker's dispatcher, nor (on SQLite) another database's dialect.
    assert loaded_of(modules, (*_NEVER_AT_STARTUP, "quotagate.delivery.dispatcher",
                               "sqlalchemy.dialects.postgresql", "psycopg", "pymysql")) == []


# The facade's parts a ledger command does not use: they are built, and imported, on first use.
_NOT_FOR_THE_LEDGER = (
    "quotagate.streams", "quotagate.auth", "quotagate.delivery", "quotagate.store.dashboard",
    "quotagate.store.lease", "redis",
)


@pytest.mark.sqlite
@pytest.mark.parametrize("command", [
    pytest.param(["tenant", "list"], id="tenant-list"),
    # It prints the tenant's stream settings, one row: not a reason to build the streams.
    pytest.param(["tenant", "show", "team-a"], id="tenant-show"),
    pytest.param(["tenant", "set", "team-a", "--quota", "gpu=3"], id="tenant-set"),
    pytest.param(["submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1"], id="submit"),
    pytest.param(["inspect"], id="inspect"),
])
def test_a_ledger_command_builds_none_of_the_other_stores(command: list[str], sqlite_ledger: str,
                                                          tmp_path: Path) -> None:
    modules = modules_loaded(*command, db=sqlite_ledger, cwd=tmp_path)
    assert "quotagate.app" in modules
    assert loaded_of(modules, _NOT_FOR_THE_LEDGER) == []


@pytest.mark.sqlite
def test_a_command_still_loads_what_it_uses(sqlite_ledger: str, tmp_path: Path) -> None:
    # The lazily imported parts are there when their command runs.
    worker = modules_loaded("worker", "--once", db=sqlite_ledger, cwd=tmp_path)
    assert "quotagate.delivery.dispatcher" in worker
    # A stream setting changed: the facade builds its streams then.
    changed = modules_loaded("tenant", "set", "team-a", "--stream-max-len", "100",
                             db=sqlite_ledger, cwd=tmp_path)
    assert "quotagate.streams.service" in changed
    tokens = modules_loaded("api-token", "list", db=sqlite_ledger, cwd=tmp_path)
    assert "quotagate.auth.tokens" in tokens
