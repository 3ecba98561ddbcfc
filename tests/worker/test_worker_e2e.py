"""End to end: tritonclient against an `rsgw worker` subprocess (issue acceptance 3).

The worker runs as operators run it (`python -m rsgw worker`), and the client is
the one users run (tritonclient.grpc), so these tests check the wire behaviour
rsgw promises, not our own reading of it. Both are blocking, so the tests are
plain sync functions. Shared-memory keys are unique per test and every region
is destroyed (unlinked) afterwards, whatever the outcome.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from rsgw.worker._shm import SHM_ROOT
from rsgw.worker.models._catalogue import builtin_catalogue
from tests.helpers import model_status, simple_inputs

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    import numpy.typing as npt

    from tests.helpers import WorkerProcess

# tritonclient ships no type information: its client is `Any` to mypy.
Client: TypeAlias = Any

SIMPLE_BYTES = 16 * 4  # one [1,16] INT32 tensor


@pytest.fixture
def client(worker_process: WorkerProcess) -> Iterator[Client]:
    with grpcclient.InferenceServerClient(worker_process.target) as c:
        yield c


class Regions:
    """System shared-memory regions a test creates; all destroyed at teardown."""

    def __init__(self) -> None:
        self.handles: list[object] = []
        self.tag = uuid.uuid4().hex[:12]

    def create(self, name: str, byte_size: int) -> tuple[object, str, str]:
        """Create a region; returns (handle, region name, key)."""
        region = f"{name}_{self.tag}"
        key = f"/rsgw_test_{name}_{self.tag}"
        handle = shm.create_shared_memory_region(region, key, byte_size, create_only=True)
        self.handles.append(handle)
        return handle, region, key

    def destroy_all(self) -> None:
        while self.handles:
            shm.destroy_shared_memory_region(self.handles.pop())


@pytest.fixture
def regions() -> Iterator[Regions]:
    made = Regions()
    try:
        yield made
    finally:
        made.destroy_all()


def _infer_input(name: str, value: npt.NDArray[np.generic], datatype: str) -> object:
    tensor = grpcclient.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


def _outputs(*names: str) -> list[object]:
    return [grpcclient.InferRequestedOutput(name) for name in names]


# ---------------------------------------------------------------------------
# Inference through tritonclient.


@pytest.mark.parametrize("rows", [1, 4])
def test_simple_sum_and_difference(client: Client, rows: int) -> None:
    inputs = simple_inputs(seed=rows, rows=rows)
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    result = client.infer(
        "simple",
        [_infer_input("INPUT0", a, "INT32"), _infer_input("INPUT1", b, "INT32")],
        outputs=_outputs("OUTPUT0", "OUTPUT1"),
        request_id="e2e-simple",
    )
    # Full-range random int32: numpy's int32 arithmetic wraps as the worker's does.
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0").dtype == np.int32
    response = result.get_response()
    assert response.model_name == "simple"
    assert response.id == "e2e-simple"


def test_simple_through_system_shared_memory(
    client: Client, worker_process: WorkerProcess, regions: Regions
) -> None:
    inputs = simple_inputs(seed=11)
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    in_handle, in_region, in_key = regions.create("input", 2 * SIMPLE_BYTES)
    out_handle, out_region, out_key = regions.create("output", 2 * SIMPLE_BYTES)
    shm.set_shared_memory_region(in_handle, [a, b])
    client.register_system_shared_memory(in_region, in_key, 2 * SIMPLE_BYTES)
    client.register_system_shared_memory(out_region, out_key, 2 * SIMPLE_BYTES)
    try:
        status = client.get_system_shared_memory_status()
        listed = {name: (r.key, r.byte_size) for name, r in status.regions.items()}
        assert listed[in_region] == (in_key, 2 * SIMPLE_BYTES)
        assert listed[out_region] == (out_key, 2 * SIMPLE_BYTES)
        only = client.get_system_shared_memory_status(region_name=in_region)
        assert list(only.regions) == [in_region]

        tensors = []
        for i, name in enumerate(("INPUT0", "INPUT1")):
            tensor = grpcclient.InferInput(name, [1, 16], "INT32")
            tensor.set_shared_memory(in_region, SIMPLE_BYTES, offset=i * SIMPLE_BYTES)
            tensors.append(tensor)
        outputs = []
        for i, name in enumerate(("OUTPUT0", "OUTPUT1")):
            output = grpcclient.InferRequestedOutput(name)
            output.set_shared_memory(out_region, SIMPLE_BYTES, offset=i * SIMPLE_BYTES)
            outputs.append(output)
        result = client.infer("simple", tensors, outputs=outputs)

        # The results live in the output region, not in the response: an empty
        # placeholder for each output, as Triton writes them (its C++ client indexes
        # them by output position; perf_analyzer crashed on none).
        assert list(result.get_response().raw_output_contents) == [b"", b""]
        for i, (name, expected) in enumerate((("OUTPUT0", a + b), ("OUTPUT1", a - b))):
            meta = result.get_output(name)
            assert meta.parameters["shared_memory_region"].string_param == out_region
            assert meta.parameters["shared_memory_byte_size"].int64_param == SIMPLE_BYTES
            # Copied at once: a live view into the region would keep it from closing.
            got = np.array(
                shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=i * SIMPLE_BYTES)
            )
            np.testing.assert_array_equal(got, expected)
    finally:
        client.unregister_system_shared_memory()
    assert dict(client.get_system_shared_memory_status().regions) == {}


def test_simple_mixing_shared_memory_and_raw_inputs(
    client: Client, worker_process: WorkerProcess, regions: Regions
) -> None:
    inputs = simple_inputs(seed=12)
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    handle, region, key = regions.create("mixed", SIMPLE_BYTES)
    shm.set_shared_memory_region(handle, [a])
    client.register_system_shared_memory(region, key, SIMPLE_BYTES)
    try:
        from_shm = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        from_shm.set_shared_memory(region, SIMPLE_BYTES)
        result = client.infer("simple", [from_shm, _infer_input("INPUT1", b, "INT32")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    finally:
        client.unregister_system_shared_memory(region)


def test_simple_int8_wraps_around(client: Client) -> None:
    rng = np.random.default_rng(8)
    a = rng.integers(-128, 127, size=(2, 16), dtype=np.int8, endpoint=True)
    b = rng.integers(-128, 127, size=(2, 16), dtype=np.int8, endpoint=True)
    # Pin the edges: 127 + 1, -128 - 1, -128 + -128 and 127 - -128 all wrap.
    a[0, :4] = [127, -128, -128, 127]
    b[0, :4] = [1, 1, -128, -128]
    result = client.infer(
        "simple_int8", [_infer_input("INPUT0", a, "INT8"), _infer_input("INPUT1", b, "INT8")]
    )
    total, diff = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert total.dtype == np.int8
    assert total[0, :4].tolist() == [-128, -127, 0, -1]
    assert diff[0, :4].tolist() == [126, 127, 0, -1]
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(diff, a - b)


def test_simple_string(client: Client) -> None:
    a = np.arange(16, dtype=np.int64).reshape(1, 16) * 7 - 50
    b = np.full((1, 16), 13, dtype=np.int64)
    a_str = np.array([str(x).encode() for x in a.flat], dtype=np.object_).reshape(1, 16)
    b_str = np.array([str(x).encode() for x in b.flat], dtype=np.object_).reshape(1, 16)
    result = client.infer(
        "simple_string",
        [_infer_input("INPUT0", a_str, "BYTES"), _infer_input("INPUT1", b_str, "BYTES")],
    )
    total = [int(x) for x in result.as_numpy("OUTPUT0").flat]
    diff = [int(x) for x in result.as_numpy("OUTPUT1").flat]
    assert total == (a + b).flatten().tolist()
    assert diff == (a - b).flatten().tolist()
    assert result.get_output("OUTPUT0").datatype == "BYTES"


def test_simple_identity(client: Client) -> None:
    items = [b"", b"a", b"\x00\xff binary", "héllo ✓".encode(), b"x" * 300, b"end"]
    value = np.array(items, dtype=np.object_).reshape(2, 3)
    result = client.infer("simple_identity", [_infer_input("INPUT0", value, "BYTES")])
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (2, 3)
    assert out.flatten().tolist() == items


# ---------------------------------------------------------------------------
# Health, metadata, repository.


def test_health_and_metadata(client: Client) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True
    assert client.is_model_ready("simple") is True
    assert client.is_model_ready("no_such_model") is False

    server = client.get_server_metadata()
    assert server.name == "triton"
    assert "system_shared_memory" in server.extensions

    meta = client.get_model_metadata("simple")
    assert meta.name == "simple"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("OUTPUT0", "INT32", [-1, 16]),
        ("OUTPUT1", "INT32", [-1, 16]),
    ]
    identity = client.get_model_metadata("simple_identity")
    assert [(t.datatype, list(t.shape)) for t in identity.inputs] == [("BYTES", [-1, -1])]

    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("no_such_model")
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in info.value.message()


def test_repository_index(client: Client) -> None:
    index = client.get_model_repository_index()
    assert [(m.name, m.state) for m in index.models] == [
        (m.name, "READY") for m in builtin_catalogue().routable
    ]
    assert {m.name for m in index.models} >= {
        "simple",
        "simple_int8",
        "simple_string",
        "simple_identity",
    }


# ---------------------------------------------------------------------------
# Regions outlive the worker; --models FILE.


def test_regions_survive_worker_exit(
    worker_process_factory: Callable[..., WorkerProcess], regions: Regions
) -> None:
    worker = worker_process_factory("--name", "short-lived")
    inputs = simple_inputs(seed=5)
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    in_handle, in_region, in_key = regions.create("in", 2 * SIMPLE_BYTES)
    out_handle, out_region, out_key = regions.create("out", 2 * SIMPLE_BYTES)
    shm.set_shared_memory_region(in_handle, [a, b])
    with grpcclient.InferenceServerClient(worker.target) as c:
        c.register_system_shared_memory(in_region, in_key, 2 * SIMPLE_BYTES)
        c.register_system_shared_memory(out_region, out_key, 2 * SIMPLE_BYTES)
        tensors = []
        for i, name in enumerate(("INPUT0", "INPUT1")):
            tensor = grpcclient.InferInput(name, [1, 16], "INT32")
            tensor.set_shared_memory(in_region, SIMPLE_BYTES, offset=i * SIMPLE_BYTES)
            tensors.append(tensor)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(out_region, SIMPLE_BYTES)
        c.infer("simple", tensors, outputs=[output])
        # Deliberately no unregister: the worker still maps both regions as it exits.

    assert worker.stop() == 0, worker.log()

    for key in (in_key, out_key):
        assert os.path.exists(SHM_ROOT + key.lstrip("/")), f"{key} was unlinked by the worker"
    got_in = np.array(shm.get_contents_as_numpy(in_handle, np.int32, [2, 16]))
    np.testing.assert_array_equal(got_in, np.concatenate([a, b]))
    got_out = np.array(shm.get_contents_as_numpy(out_handle, np.int32, [1, 16]))
    np.testing.assert_array_equal(got_out, a + b)

    regions.destroy_all()
    for key in (in_key, out_key):
        assert not os.path.exists(SHM_ROOT + key.lstrip("/"))


CUSTOM_CATALOGUE = textwrap.dedent(
    """\
    models:
      - name: adder
        inputs:
          - {name: A, datatype: FP32, shape: [-1, 4]}
          - {name: B, datatype: FP32, shape: [-1, 4]}
        outputs:
          - {name: SUM, datatype: FP32, shape: [-1, 4]}
          - {name: DIFF, datatype: FP32, shape: [-1, 4]}
        max_batch_size: 4
        launch_ms: 2
        item_ms: 0.5
        compute: add_sub
    """
)


def test_models_file(worker_process_factory: Callable[..., WorkerProcess], tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(CUSTOM_CATALOGUE, encoding="utf-8")
    worker = worker_process_factory("--models", str(path), "--time-scale", "0.5")
    with grpcclient.InferenceServerClient(worker.target) as c:
        assert [m.name for m in c.get_model_repository_index().models] == ["adder"]
        assert c.is_model_ready("simple") is False
        meta = c.get_model_metadata("adder")
        assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
            ("A", "FP32", [-1, 4]),
            ("B", "FP32", [-1, 4]),
        ]
        a = np.array([[1.5, -2.0, 3.25, 1e30], [0.0, 7.0, -0.5, 2.0]], dtype=np.float32)
        b = np.array([[0.5, 2.0, -3.25, 1e30], [1.0, -7.0, 0.5, 0.125]], dtype=np.float32)
        result = c.infer("adder", [_infer_input("A", a, "FP32"), _infer_input("B", b, "FP32")])
        np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
        np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)
    status = model_status(worker.target, "adder")
    assert (status.dispatch_count, status.requests_served, status.rows_served) == (1, 1, 2)
    assert status.max_batch_size == 4
    # (2 ms launch + 0.5 ms x 2 rows) x time-scale 0.5
    assert status.total_compute_seconds == pytest.approx(0.0015)


def test_bad_models_file_exits_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - name: x\n    max_bach_size: 3\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "rsgw", "worker", "--port", "0", "--models", str(path)],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert b"max_bach_size" in done.stderr
