#!/usr/bin/env python3
"""Run Triton's stock Python example clients, gRPC and HTTP, against an endpoint; report each.

The examples are NVIDIA's (triton-inference-server/client, `src/python/examples/`);
this script ships none of them. Point it at a checkout's examples folder and at a
running endpoint (`rsgw node`, `rsgw worker`, or a Triton server):

    tools/triton_examples.py --examples ~/client/src/python/examples -u localhost:8001
    tools/triton_examples.py --examples ... --protocol http -u localhost:8000
    tools/triton_examples.py --examples ... --protocol both -u host:8001 --http-url host:8000

`--protocol` picks the table: `grpc` (the default, as before: the gRPC examples,
with the arguments Triton's qa/L0_grpc runs them with), `http` (the HTTP/REST
examples, with qa/L0_http's arguments) or `both` (gRPC, then HTTP, each
model-control example last). `-u` is the endpoint of the protocol run (default
localhost:8001 for gRPC, localhost:8000 for HTTP); with `both` it is the gRPC one
and `--http-url` the REST one (default: -u's host, port 8000). memory_growth_test.py
takes no URL: it runs against localhost:8001 (`-i grpc`).

Each example runs unchanged except for its URL (and the model, image or protocol
flags the examples themselves take), in the interpreter given by `--python`, which
needs `tritonclient[all]`, `numpy` and `pillow` (the image examples decode an
image; one is generated) and, for image_client.py over HTTP, `attrdict` (as
Triton's SDK image installs it; a run that lacks a module fails saying which). An
example passes when it exits 0 and prints its own PASS line where it has one; the
one negative run (simple_http_infer_client.py at `-u URL/base_path`, which
qa/L0_http expects to fail having sent `POST /base_path/v2/models/simple/infer`)
passes when it exits non-zero and printed that line.

The model-control examples count the repository: simple_grpc_model_control.py
expects eight models (qa/L0_grpc's repository: run it against
`rsgw node --models triton-docs`, see docs/models.md), simple_http_model_control.py
seven (qa/L0_http's: densenet_onnx, simple, simple_dyna_sequence, simple_identity,
simple_sequence, simple_string, simple_string_dyna_sequence: run it against
`rsgw node --models triton-l0-http`). Both end with `simple` unloaded, so they run
last; against one node, one of the two fails on its count: pick each with `--only`
(which selects examples whose label contains the text). The rest run against the
builtin catalogue (`rsgw node`). simple_{grpc,http}_cudashm_client.py need CUDA on
the client and are not run.

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
    #: Put after the URL given to `-u` (a base path).
    url_path: str = ""
    #: Whether it must fail (exit non-zero, `passes` still printed): a negative run.
    fails: bool = False
    #: Modules it imports beyond tritonclient, numpy and pillow.
    needs: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        url = (f"-u URL{self.url_path}",) if self.url_path else ()
        return " ".join((self.script, *url, *self.args)).replace("{image}", "IMAGE")

    @property
    def model_control(self) -> bool:
        return "model_control" in self.script


#: Every gRPC example that needs no CUDA on the client, with the arguments Triton's own
#: CI (qa/L0_grpc) runs it with.
GRPC_EXAMPLES = (
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


#: Every HTTP example that needs no CUDA on the client, with the arguments Triton's own
#: CI (qa/L0_http) runs it with, in its order. image_client.py and
#: reuse_infer_objects_client.py speak HTTP by default (no `-i`). Not here, as
#: qa/L0_http does not run them: ensemble_image_client.py (commented out there) and
#: memory_growth_test.py (qa/L0_client_memory_growth runs it, `-i http`).
HTTP_EXAMPLES = (
    Example("simple_http_health_metadata.py", ("-v",)),
    Example("simple_http_aio_infer_client.py", ("-v",), passes="PASS: infer"),
    Example("simple_http_infer_client.py", ("-v",)),
    Example("simple_http_async_infer_client.py", ("-v",)),
    Example(
        "image_client.py",
        ("-m", "densenet_onnx", "-s", "INCEPTION", "-a", "-c", "1", "-b", "1", "{image}"),
        passes="PASS",
        needs=("attrdict",),
    ),
    Example(
        "image_client.py",
        ("-m", "densenet_onnx", "-s", "INCEPTION", "-c", "1", "-b", "1", "{image}"),
        passes="PASS",
        needs=("attrdict",),
    ),
    Example("simple_http_shm_string_client.py", ("-v",), passes="PASS: system shared memory"),
    Example("simple_http_shm_client.py", ("-v",), passes="PASS: system shared memory"),
    Example("simple_http_string_infer_client.py", ("-v",), passes="PASS: string"),
    Example("simple_http_sequence_sync_infer_client.py", ("-v",), passes="PASS: Sequence"),
    Example("reuse_infer_objects_client.py", ("-v",)),
    # qa/L0_http's negative run: a base path the server does not serve must fail the
    # example, and the request must have gone to it.
    Example(
        "simple_http_infer_client.py",
        ("-v",),
        passes="POST /base_path/v2/models/simple/infer",
        url_path="/base_path",
        fails=True,
    ),
    Example("simple_http_sequence_sync_infer_client.py", ("-v", "-d"), passes="PASS: Sequence"),
    # Last: it ends with `simple` unloaded; it counts seven models (see the docstring).
    Example("simple_http_model_control.py", ("-v",), passes="PASS: model control"),
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


def missing_modules(example: Example) -> list[str]:
    """The modules `example` needs that the examples' interpreter does not have."""
    missing = []
    for module in example.needs:
        # Found, not imported: attrdict imports only once the example patches collections.
        code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        probe = subprocess.run([PYTHON, "-c", code], capture_output=True)
        if probe.returncode != 0:
            missing.append(module)
    return missing


def run(
    example: Example, examples: Path, url: str, image: Path, timeout: float
) -> tuple[bool, str, float]:
    missing = missing_modules(example)
    if missing:
        return False, f"not run: --python lacks {', '.join(missing)} (pip install it)", 0.0
    args = [a.replace("{image}", str(image)) for a in example.args]
    where = ["-u", url + example.url_path] if example.url else []
    command = [PYTHON, str(examples / example.script), *where, *args]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=examples
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s", time.monotonic() - started
    output = done.stdout + done.stderr
    exited_as_expected = (done.returncode != 0) if example.fails else (done.returncode == 0)
    passed = exited_as_expected and (not example.passes or example.passes in done.stdout)
    last = summary(output)[:200]
    why = "" if passed else f"exit {done.returncode}: {last}"
    if not passed and exited_as_expected:
        why = f"exit {done.returncode} but no {example.passes!r}: {last}"
    return passed, why, time.monotonic() - started


def summary(output: str) -> str:
    """The exception line of the last traceback in `output`, else its last line."""
    lines = output.strip().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    if starts:
        after = lines[starts[-1] + 1 :]
        found = next((line for line in after if line and not line[0].isspace()), None)
        if found is not None:
            return found
    return lines[-1] if lines else ""


def plan(protocol: str, grpc_url: str, http_url: str) -> list[tuple[Example, str]]:
    """The runs `--protocol` asks for, each with its URL: the model-control ones last."""
    grpc = [(example, grpc_url) for example in GRPC_EXAMPLES]
    http = [(example, http_url) for example in HTTP_EXAMPLES]
    runs = {"grpc": grpc, "http": http, "both": grpc + http}[protocol]
    return [r for r in runs if not r[0].model_control] + [r for r in runs if r[0].model_control]


def http_default(grpc_url: str) -> str:
    """`grpc_url`'s host at Triton's REST port."""
    host = grpc_url.rsplit(":", 1)[0] if grpc_url.rsplit(":", 1)[-1].isdigit() else grpc_url
    return f"{host}:8000"


PYTHON = sys.executable


def main() -> int:
    global PYTHON
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--examples", type=Path, required=True, help="src/python/examples of a client checkout"
    )
    parser.add_argument(
        "--protocol",
        choices=("grpc", "http", "both"),
        default="grpc",
        help="which examples: gRPC (the default), HTTP, or both",
    )
    parser.add_argument(
        "-u",
        "--url",
        help="the endpoint (default localhost:8001, or localhost:8000 with --protocol http); "
        "with --protocol both, the gRPC one",
    )
    parser.add_argument(
        "--http-url",
        help="the REST endpoint with --protocol both (default: -u's host, port 8000)",
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
    if options.protocol == "http":
        grpc_url, http_url = "", options.url or options.http_url or "localhost:8000"
    else:
        grpc_url = options.url or "localhost:8001"
        http_url = options.http_url or http_default(grpc_url)
    chosen = [
        (example, url)
        for example, url in plan(options.protocol, grpc_url, http_url)
        if not options.only or any(o in example.label for o in options.only)
    ]
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        image = make_image(Path(folder))
        for example, url in chosen:
            passed, why, seconds = run(example, options.examples, url, image, options.timeout)
            failed += not passed
            verdict = "PASS" if passed else "FAIL"
            print(f"{verdict} {example.label} ({seconds:.1f} s) {why}".rstrip())
    print(f"{len(chosen) - failed} of {len(chosen)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
