"""LogSettings and TraceSetting through the gateway, with tritonclient."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest
import trio
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.gateway.observe._log_settings import ServerSettings
from rsgw.gateway.observe._metrics import GatewayMetrics
from rsgw.runtime._logging import resolve_format
from tests.gateway.fleet import open_fleet


@pytest.fixture(autouse=True)
def restore_rsgw_level() -> Iterator[None]:
    target = logging.getLogger("rsgw")
    level = target.level
    yield
    target.setLevel(level)


async def test_log_settings_read_and_set_the_gateway_level() -> None:
    logging.getLogger("rsgw").setLevel(logging.INFO)
    async with open_fleet(1) as fleet:
        client = grpcclient.InferenceServerClient(fleet.target)

        def scenario() -> None:
            settings = client.get_log_settings(as_json=True)["settings"]
            assert settings["log_info"] == {"bool_param": True}
            assert settings["log_verbose_level"] == {"uint32_param": 0}
            # The default, auto, is reported as what it resolved to (json under capture).
            assert settings["log_format"] == {"string_param": resolve_format("auto")}
            client.update_log_settings({"log_verbose_level": 1})
            assert logging.getLogger("rsgw").getEffectiveLevel() == logging.DEBUG
            updated = client.update_log_settings(
                {"log_verbose_level": 0, "log_info": False, "log_warning": False}, as_json=True
            )["settings"]
            assert logging.getLogger("rsgw").getEffectiveLevel() == logging.ERROR
            assert updated["log_error"] == {"bool_param": True}
            assert updated["log_warning"] == {"bool_param": False}
            for bad, why in [
                ({"log_file": "/tmp/x.log"}, "log_file cannot be changed"),
                ({"log_colour": True}, "unknown log setting 'log_colour'"),
            ]:
                with pytest.raises(InferenceServerException) as caught:
                    client.update_log_settings(bad)
                assert "INVALID_ARGUMENT" in str(caught.value.status())
                assert why in caught.value.message()
            assert logging.getLogger("rsgw").getEffectiveLevel() == logging.ERROR  # unchanged

        await trio.to_thread.run_sync(scenario)
        client.close()
        wrong = pb.LogSettingsRequest()
        wrong.settings["log_info"].string_param = "yes"
        with pytest.raises(GrpcError) as error:
            await fleet.channel().unary(Method.LOG_SETTINGS.wire, wrong.SerializeToString())
        assert (error.value.code, error.value.message) == (
            StatusCode.INVALID_ARGUMENT,
            "log setting 'log_info' takes a bool_param, got string_param",
        )


async def test_trace_setting_reports_tracing_off() -> None:
    async with open_fleet(1) as fleet:
        client = grpcclient.InferenceServerClient(fleet.target)

        def scenario() -> None:
            settings = client.get_trace_settings(as_json=True)["settings"]
            assert settings["trace_level"] == {"value": ["OFF"]}
            assert client.get_trace_settings(model_name="simple", as_json=True) is not None
            client.update_trace_settings(settings={"trace_level": ["OFF"]})
            with pytest.raises(InferenceServerException) as caught:
                client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
            assert "FAILED_PRECONDITION" in str(caught.value.status())
            assert "rsgw does not trace requests" in caught.value.message()
            with pytest.raises(InferenceServerException) as caught:
                client.get_trace_settings(model_name="nope")
            assert "NOT_FOUND" in str(caught.value.status())

        await trio.to_thread.run_sync(scenario)
        client.close()


@pytest.mark.parametrize(("terminal", "reported"), [(True, "text"), (False, "json")])
def test_log_format_auto_is_reported_as_the_format_it_resolved_to(
    terminal: bool, reported: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stderr(io.StringIO):
        def isatty(self) -> bool:
            return terminal

    monkeypatch.setattr(sys, "stderr", Stderr())
    settings = ServerSettings(GatewayMetrics(str), "auto", lambda model: False)
    assert settings._current(logging.INFO).settings["log_format"].string_param == reported
    assert ServerSettings(GatewayMetrics(str), "json", lambda model: False).log_format == "json"
