#!/usr/bin/env python3
"""Run Triton's stock Python gRPC example clients against an endpoint and report each.

The examples are NVIDIA's (triton-inference-server/client, `src/python/examples/`);
this script ships none of them. Point it at a checkout's examples folder and at a
running endpoint (`rsgw node`, `rsgw worker`, or a Triton server):

    tools/triton_examples.py --examples ~/client/src/python/examples -u localhost:8001

Each example runs unchanged except for its URL (and the model, image or protocol
flags the examples themselves take), in the interpreter given by `--python`, which
needs `tritonclient[all]`, `numpy` and `pillow` (the image examples decode an
image; one is generated). An example passes when it exits 0 and prints its own
PASS line where it has one. simple_grpc_model_control.py counts the repository
(eight models: run it against `rsgw node --models triton-docs`, see docs/models.md);
`--only` picks examples by name. simple_grpc_cudashm_client.py needs CUDA on the
client and is not run.

Exit status: 0 if every example run passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Example:
    """One run of one example: its script, extra arguments, and the PASS text it prints."""

    script: str
    args: tuple[str, ...] = ()
    passes: str = ""
    #: Whether it takes `-u URL`.
    url: bool = True

    @property
    def label(self) -> str:
        return " ".join((self.script, *self.args)).replace("{image}", "IMAGE")


#: Every gRPC example that needs no CUDA on the client, with the arguments Triton's own
#: CI (qa/L0_grpc) runs it with.
EXAMPLES = (
    Example("grpc_client.py", passes="PASS"),
    Example("grpc_explicit_byte_content_client.py", passes="PASS"),
    Example("grpc_explicit_int_content_client.py", passes="PASS: explicit int"),
    Example("grpc_explicit_int8_content_client.py", passes="PASS: explicit int8"),
    Example(
        "grpc_image_client.py", ("-m", "densenet_onnx", "-s", "INCEPTION", "-c", "3", "{image}")
    ),
    Example(
        "grpc_image_client.py", ("-m", "inception_graphdef", "-s", "INCEPTION", "-a", "{image}")
    ),
    Example(
        "grpc_image_client.py", ("-m", "densenet_onnx", "-s", "INCEPTION", "--streaming", "{image}")
    ),
    Example(
        "image_client.py",
        ("-i", "grpc", "-m", "densenet_onnx", "-s", "INCEPTION", "-c", "1", "{image}"),
    ),
    Example(
        "image_client.py",
        (
            "-i",
            "grpc",
            "-m",
            "inception_graphdef",
            "-s",
            "INCEPTION",
            "-a",
            "--streaming",
            "-b",
            "2",
            "{image}",
        ),
    ),
    Example("ensemble_image_client.py", ("-i", "grpc", "-c", "2", "{image}")),
    Example("reuse_infer_objects_client.py", ("-i", "grpc")),
    # It takes no URL (localhost:8001 is built in): run it against that port.
    Example("memory_growth_test.py", ("-i", "grpc", "-r", "20"), url=False),
    Example("simple_grpc_aio_infer_client.py", passes="PASS"),
    Example("simple_grpc_aio_sequence_stream_infer_client.py", passes="PASS"),
    Example("simple_grpc_aio_sequence_stream_infer_client.py", ("-d",), passes="PASS"),
    Example("simple_grpc_async_infer_client.py", passes="PASS"),
    Example("simple_grpc_custom_args_client.py", passes="PASS"),
    Example("simple_grpc_custom_repeat.py", passes="PASS: Decoupled API"),
    Example("simple_grpc_health_metadata.py"),
    Example("simple_grpc_infer_client.py", passes="PASS"),
    Example("simple_grpc_keepalive_client.py", passes="PASS"),
    Example("simple_grpc_sequence_stream_infer_client.py", passes="PASS: Sequence"),
    Example("simple_grpc_sequence_stream_infer_client.py", ("-d",), passes="PASS: Sequence"),
    Example("simple_grpc_sequence_sync_infer_client.py", passes="PASS: Sequence"),
    Example("simple_grpc_sequence_sync_infer_client.py", ("-d",), passes="PASS: Sequence"),
    Example("simple_grpc_shm_client.py", passes="PASS: system shared memory"),
    Example("simple_grpc_shm_string_client.py", passes="PASS: system shared memory"),
    Example("simple_grpc_string_infer_client.py", passes="PASS"),
    # Last: it ends with `simple` unloaded (as it leaves a Triton server), which the
    # shared memory examples would then find.
    Example("simple_grpc_model_control.py", passes="PASS: model control"),
)


def make_image(folder: Path) -> Path:
    """A 320x240 JPEG with some structure, for the image examples."""
    code = (
        "import sys\n"
        "from PIL import Image\n"
        "img = Image.new('RGB', (320, 240))\n"
        "img.putdata([((x * 7) % 256, (y * 3) % 256, (x * y) % 256)"
        " for y in range(240) for x in range(320)])\n"
        "img.save(sys.argv[1], 'JPEG')\n"
    )
    path = folder / "image.jpg"
    subprocess.run([PYTHON, "-c", code, str(path)], check=True)
    return path


def run(
    example: Example, examples: Path, url: str, image: Path, timeout: float
) -> tuple[bool, str, float]:
    args = [a.replace("{image}", str(image)) for a in example.args]
    command = [PYTHON, str(examples / example.script), *(["-u", url] if example.url else []), *args]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=examples
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s", time.monotonic() - started
    output = done.stdout + done.stderr
    passed = done.returncode == 0 and (not example.passes or example.passes in done.stdout)
    last = output.strip().splitlines()[-1:] if output.strip() else [""]
    why = "" if passed else f"exit {done.returncode}: {last[0][:200]}"
    return passed, why, time.monotonic() - started


PYTHON = sys.executable


def main() -> int:
    global PYTHON
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--examples", type=Path, required=True, help="src/python/examples of a client checkout"
    )
    parser.add_argument(
        "-u", "--url", default="localhost:8001", help="the endpoint (default localhost:8001)"
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter with tritonclient[all], numpy, pillow"
    )
    parser.add_argument(
        "--only", action="append", default=[], help="run examples whose label contains this"
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds per example (default 120)"
    )
    options = parser.parse_args()
    PYTHON = options.python
    chosen = [e for e in EXAMPLES if not options.only or any(o in e.label for o in options.only)]
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        image = make_image(Path(folder))
        for example in chosen:
            passed, why, seconds = run(
                example, options.examples, options.url, image, options.timeout
            )
            failed += not passed
            verdict = "PASS" if passed else "FAIL"
            print(f"{verdict} {example.label} ({seconds:.1f} s) {why}".rstrip())
    print(f"{len(chosen) - failed} of {len(chosen)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
