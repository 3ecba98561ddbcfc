"""The access log: a sampled line per ModelInfer call, with the client's request id."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from trio.testing import MockClock

from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._config import LoggingConfig
from tests.gateway.fleet import open_fleet
from tests.helpers import infer_request, simple_inputs


async def test_every_call_gets_an_access_line_at_rate_one(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    logging_config = dataclasses.replace(LoggingConfig(), access_log_sample_rate=1.0)
    caplog.set_level(logging.INFO, logger="rsgw.access")
    async with open_fleet(2, memory=True, logging=logging_config) as fleet:
        channel = fleet.channel()
        body = infer_request("simple", simple_inputs(1)).SerializeToString()
        await channel.unary(Method.MODEL_INFER.wire, body, metadata=((b"x-request-id", b"req-42"),))
        unknown = infer_request("nope", simple_inputs(1)).SerializeToString()
        with pytest.raises(GrpcError):
            await channel.unary(Method.MODEL_INFER.wire, unknown)
    lines = [r.__dict__ for r in caplog.records if r.getMessage() == "access"]
    assert [(r["model"], r["status"], r["request_id"]) for r in lines] == [
        ("simple", StatusCode.OK.name, "req-42"),
        ("_unknown_", StatusCode.NOT_FOUND.name, ""),
    ]
    assert lines[0]["worker"] in ("worker0", "worker1") and lines[1]["worker"] == ""
    assert lines[0]["rpc"] == "ModelInfer" and lines[0]["duration_ms"] >= 0
    assert not [r for r in lines if "trace_id" in r or "span_id" in r]  # tracing is off


async def test_no_access_log_by_default(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rsgw.access")
    async with open_fleet(1, memory=True) as fleet:
        assert fleet.gateway._service.infer.access is None
        await fleet.infer(infer_request("simple", simple_inputs(1)))
    assert not [r for r in caplog.records if r.getMessage() == "access"]
