from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from quotagate import ManualClock, Quotagate
from support.databases import BACKENDS, fresh_database
from support.receiver import Receiver, running_receiver
from support.redis_servers import private_redis, redis_cluster, silent_redis  # noqa: F401 (fixtures)

if TYPE_CHECKING:
    from support.kube_api import KubeApiServer


@pytest.fixture(params=[pytest.param(name, marks=getattr(pytest.mark, name)) for name in BACKENDS])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A fresh database with the schema, on every backend."""
    with fresh_database(backend, tmp_path) as url:
        yield url


@pytest.fixture
def empty_db_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A fresh database without any tables, on every backend."""
    with fresh_database(backend, tmp_path, create_schema=False) as url:
        yield url


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def gate(db_url: str, clock: ManualClock) -> Iterator[Quotagate]:
    with Quotagate.connect(db_url, clock=clock) as quotagate:
        yield quotagate


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """The in-suite webhook executor (tests/support/receiver.py), on a free port."""
    with running_receiver() as server:
        yield server


@pytest.fixture
def kube_api() -> Iterator[KubeApiServer]:
    """The in-suite Kubernetes API server (tests/support/kube_api), serving deploy/crds/."""
    from support.kube_api import running_api_server  # needs PyYAML (the kubernetes extra)

    with running_api_server() as server:
        yield server


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Kill child processes a failed test left behind.

    multiprocessing joins every non-daemon child at interpreter exit, so one
    child stuck on a barrier or a lock would keep the whole run from ending
    after its summary is printed.
    """
    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=10)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every test parametrised with a backend that backend's marker.

    The ``backend`` fixture marks its own parameters, but module fixtures and
    ``parametrize`` lists of backend names (``params=BACKENDS``, ``indirect=True``)
    do not: without this, ``-m "not mysql"`` would still run their MariaDB cases.
    """
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        for value in callspec.params.values():
            if isinstance(value, str) and value in BACKENDS:
                item.add_marker(getattr(pytest.mark, value))
