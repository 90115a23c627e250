"""A kubernetes target's configuration is checked when it is set, not at the first delivery."""

from __future__ import annotations

from typing import Any

import pytest

from quotagate.delivery.targets import validate_config
from quotagate.errors import InvalidInput


def test_defaults_fill_what_is_not_given() -> None:
    assert validate_config("kubernetes", {"host": "http://127.0.0.1:8001"}) == {
        "group": "quotagate.io", "version": "v1alpha1", "plural": "modelservices",
        "resource_kind": "ModelService", "namespace": "default", "stop": "delete",
        "timeout": 10.0, "host": "http://127.0.0.1:8001",
    }
    assert validate_config("kubernetes", {"stop": "suspend", "timeout": 2})["stop"] == "suspend"


@pytest.mark.parametrize(("config", "wrong"), [
    ({"namespace": "Team_A"}, "namespace 'Team_A' is not a DNS-1123 label"),
    ({"plural": "ModelServices"}, "plural 'ModelServices' is not a DNS-1123 label"),
    ({"group": "quotagate_io"}, "group 'quotagate_io' is not a DNS-1123 subdomain"),
    ({"version": "v1.0"}, "version 'v1.0' is not a DNS-1123 label"),
    ({"resource_kind": "modelService"}, "resource_kind 'modelService' is not a CamelCase kind"),
    ({"stop": "kill"}, "stop must be one of delete, suspend, not 'kill'"),
    ({"timeout": 0}, "timeout must be a positive number of seconds"),
    ({"timeout": "soon"}, "timeout must be a positive number of seconds"),
    ({"host": 8001}, "host must be text"),
])
def test_a_config_the_api_server_would_refuse_is_refused_with_a_clear_error(
    config: dict[str, Any], wrong: str
) -> None:
    with pytest.raises(InvalidInput) as error:
        validate_config("kubernetes", config)
    assert error.value.code == "invalid_target_config"
    assert error.value.message.startswith(wrong)
