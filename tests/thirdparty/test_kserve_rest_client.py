"""KServe's own REST client through the gateway's REST door.

`kserve.InferenceRESTClient` (protocol v2) is run in KServe's virtual environment
(`.venv-kserve`, as `.ci/run` makes it; `RSGW_KSERVE_PYTHON` elsewhere) against a
gateway in front of simulated workers, in every scheduling mode.
"""

from __future__ import annotations

import pytest
import trio

from rsgw.config._config import SchedulingConfig, SchedulingMode
from tests.gateway.fleet import open_fleet
from tests.thirdparty.servers import HERE, KSERVE_PYTHON, available, missing


@pytest.mark.parametrize("mode", list(SchedulingMode), ids=str)
async def test_kserves_rest_client_through_the_gateway(mode: SchedulingMode) -> None:
    if not available("kserve"):
        pytest.skip(missing("kserve"))
    async with open_fleet(2, scheduling=SchedulingConfig(mode=mode)) as fleet:
        url = f"http://127.0.0.1:{fleet.gateway.http_port}"
        with trio.fail_after(120):
            done = await trio.run_process(
                [str(KSERVE_PYTHON), str(HERE / "kserve_rest_client.py"), url],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        said = (done.stdout + done.stderr).decode(errors="replace")
        assert done.returncode == 0, said[-3000:]
        assert "infer binary=True" in said, said[-3000:]
