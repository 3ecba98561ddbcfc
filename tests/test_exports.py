"""The public API is exactly the names docs/product.md §2 promises, and what they raise."""

from __future__ import annotations

import rsgw


def test_public_names() -> None:
    assert set(rsgw.__all__) == {
        "ConfigError",
        "GatewayStatus",
        "ListenError",
        "StartupError",
        "GatewayConfig",
        "GatewayWedged",
        "RsgwError",
        "__version__",
        "load_config",
        "probe_worker_ready",
        "serve_gateway",
        "open_gateway",
        "RunningGateway",
    }
    for name in rsgw.__all__:
        assert hasattr(rsgw, name)


def test_errors_form_one_family() -> None:
    assert issubclass(rsgw.ConfigError, rsgw.RsgwError)
    assert issubclass(rsgw.GatewayWedged, rsgw.RsgwError)
    assert issubclass(rsgw.ListenError, rsgw.RsgwError)
    assert issubclass(rsgw.StartupError, rsgw.RsgwError)
