"""`rsgw node --server mlserver` with real MLServer processes (issue 50, acceptance 3).

MLServer from its own environment (tests/thirdparty/servers.py: `.venv-mlserver`, or
`RSGW_MLSERVER`), serving Triton's `simple` (examples/mlserver/simple_model.py) under
two names, one MLServer per "GPU", the gateway in front under lpt_packing. Each
worker's ports reach MLServer through its `MLSERVER_*` variables; what each holds is
read from the MLServer itself. Skipped, saying why, where MLServer is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator

import pytest

from tests.helpers import wait_until
from tests.node.test_own_servers import environ, serving
from tests.node.test_supervisor import NodeProcess
from tests.node.test_triton_node import infer_grpc, infer_http, node_file, ready_on
from tests.thirdparty import servers

MODELS = ("simple", "twin")
START_SECONDS = 120.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    if not servers.available("mlserver"):
        pytest.skip(servers.missing("mlserver"))
    directory = tmp_path_factory.mktemp("mlserver-node")
    repository = directory / "models"
    for model in MODELS:
        (repository / model).mkdir(parents=True)
        shutil.copy(servers.MLSERVER_MODEL, repository / model / "simple_model.py")
        settings = {"name": model, "implementation": "simple_model.SimpleModel"}
        (repository / model / "model-settings.json").write_text(json.dumps(settings))
    server = {
        "preset": "mlserver",
        "env": {
            "PATH": f"{servers.MLSERVER.parent}:{os.environ.get('PATH', '')}",
            "MLSERVER_PARALLEL_WORKERS": "0",
            "PYTHONUNBUFFERED": "1",
        },
        "startup_seconds": START_SECONDS,
    }
    path = node_file(directory, repository, server)
    with serving(directory, str(path), "--gpus", "2", "--mode", "lpt_packing") as running:
        yield running


def test_two_mlservers_one_per_gpu_behind_the_gateway(node: NodeProcess) -> None:
    workers = node.serving["workers"]
    assert sorted(workers) == ["gpu0", "gpu1"]
    for index, name in enumerate(("gpu0", "gpu1")):
        env = environ(workers[name]["pid"])
        assert env["CUDA_VISIBLE_DEVICES"] == str(index)
        assert env["MLSERVER_GRPC_PORT"] == str(workers[name]["grpc_port"])
        assert env["MLSERVER_LOAD_MODELS_AT_STARTUP"] == "false"
    http_target = f"127.0.0.1:{node.serving['http_port']}"
    for seed, model in enumerate(MODELS):
        infer_grpc(node.target, model, seed)
        infer_http(http_target, model, seed)

    def placed_once() -> bool:
        held = [ready_on(w["grpc_port"]) for w in workers.values()]
        return all(sum(model in h for h in held) == 1 for model in MODELS)

    # Loaded where placed: each model on one MLServer.
    wait_until(placed_once, 30, interval=0.5, what="each model on one MLServer")
    assert "[gpu0] " in node.log() and "[gpu1] " in node.log()
