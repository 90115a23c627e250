"""One plugin scheme (docs/decisions/902): built-ins by import path, loaded on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

from quotagate import InvalidInput
from quotagate.delivery.targets import KINDS, TARGET_KINDS, TargetKind, build_target, validate_config
from quotagate.plugins import Plugins
from quotagate.rate.stores import RATE_STORES, rate_store_from_url


def test_a_builtin_is_imported_on_first_use_and_a_registered_plugin_replaces_it() -> None:
    plugins: Plugins[object] = Plugins({"dumps": "json:dumps", "missing": "json:no_such_name"})
    assert plugins.names() == ("dumps", "missing")
    import json

    assert plugins.get("dumps") is json.dumps
    assert plugins.get("nothing") is None
    with pytest.raises(AttributeError):
        plugins.get("missing")  # a wrong path fails loudly, not as "unknown"
    plugins.register("dumps", repr)
    plugins.register("extra", str)
    assert plugins.get("dumps") is repr
    assert plugins.names() == ("dumps", "extra", "missing")


def test_every_builtin_target_kind_resolves_to_a_kind_that_checks_its_config() -> None:
    assert set(KINDS) == {"process", "webhook", "kubernetes", "spark"}
    for kind in KINDS:
        plugin = TARGET_KINDS.get(kind)
        assert isinstance(plugin, TargetKind), kind
    checked = validate_config("process", {"command": ["true"], "run_dir": "runs"})
    assert checked["command"] == ["true"]
    with pytest.raises(InvalidInput):
        validate_config("process", {"run_dir": "runs"})  # no command


def test_an_unknown_target_kind_or_rate_store_scheme_is_refused_by_name() -> None:
    with pytest.raises(InvalidInput) as kind_error:
        build_target("ftp", {}, ledger_id="ledger")
    assert kind_error.value.code == "invalid_target_kind"
    assert "kubernetes, process, spark, webhook" in str(kind_error.value)
    with pytest.raises(InvalidInput) as store_error:
        rate_store_from_url("memcached://127.0.0.1:11211")
    assert store_error.value.code == "invalid_rate_store_url"
    assert "redis" in str(store_error.value) and "sqlite" in str(store_error.value)


def test_every_builtin_rate_store_scheme_resolves_to_a_factory() -> None:
    for scheme in RATE_STORES.names():
        assert callable(RATE_STORES.get(scheme)), scheme


def test_finding_targets_and_rate_stores_imports_no_optional_client() -> None:
    # A worker that only runs processes must not need kubernetes or redis installed.
    script = (
        "import sys\n"
        "from quotagate.delivery.targets import validate_config\n"
        "from quotagate.rate.stores import rate_store_from_url\n"
        "validate_config('process', {'command': ['true'], 'run_dir': 'runs'})\n"
        "loaded = [name for name in ('kubernetes', 'redis', 'httpx', 'quotagate.delivery.targets.kubernetes')\n"
        "          if name in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
