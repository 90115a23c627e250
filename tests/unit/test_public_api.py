from __future__ import annotations

import quotagate


def test_public_api_is_what_we_mean_to_export() -> None:
    assert set(quotagate.__all__) == {
        "Clock", "Conflict", "Forbidden", "InvalidInput", "ManualClock", "NotFound", "Placement",
        "Quotagate", "QuotagateError", "RateLimited", "ReleaseResult", "Request", "RequestState",
        "StaleGeneration", "StoreUnavailable", "SubmitResult", "SystemClock", "Unauthorized",
    }
    for name in quotagate.__all__:
        assert getattr(quotagate, name) is not None
