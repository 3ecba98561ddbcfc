"""The shell commands of README.md and docs/**/*.md, run as a reader would run them.

Every fenced code block whose info string is `sh`, `bash`, `shell` or `console` is
collected (other blocks, `python` included, are out of scope; in a `console` block the
commands are the lines that start with `$ `, the rest is output and not compared). A
block is run unless the line just before its fence is a marker:

    <!-- doc-test: skip (REASON) -->
        Not run: it needs what CI has not (kubectl and a cluster, docker, another host).
    <!-- doc-test: help-only (REASON) -->
        Not run (a benchmark that takes minutes, a file only the reader has): each of its
        commands that is rsgw's or the repository's (`rsgw ...`, `bench/NAME`, `python
        bench/NAME`) runs as its words before the first option (less files and
        addresses) plus `--help`, which must exit 0 and name every `--option` the doc
        uses. Other commands are not checked; a block with none of these is refused
        (mark it skip).
    <!-- doc-test: serve until URL -->
        Each command starts a server: it must answer URL with 200 within START_SECONDS,
        then it gets SIGINT, as Ctrl-C sends it to the terminal's process group, and must
        exit 0 within STOP_SECONDS, leaving no process of its group behind.
    <!-- doc-test: while-serving -->
        Run while a node started as `rsgw node --mode lpt_packing` (WHILE_SERVING) is
        ready: commands that call a running node. One node serves all such blocks.

A REASON is required. A marker that is not right before a shell block, an unknown
marker, and an unmarked block with a placeholder such as `<path>` (it cannot run as
written) fail `test_every_shell_block_is_runnable_or_marked`; an unmarked block that
fails to run fails its own test, with the file, the line, the command and its output:
fix the doc, or mark the block.

Rules:
- The install prefix of the README's quick start (`python3 -m venv .venv && .
  .venv/bin/activate && pip install -e .` or `-e '.[test]'`) is already done by the test
  run (tests/test_deploy.py checks it against the Containerfile): it is dropped, and the
  rest of the line runs in the current environment.
- Commands run with bash (`set -eo pipefail`), PATH with this Python's bin first, in a
  temporary directory holding a symlink to each of the repository's top-level entries,
  so the docs' relative paths resolve and the files they write land outside the tree.
  Each block has a deadline and runs in its own process group, killed afterwards.
- The docs' servers use fixed ports (DOC_PORTS): a server starts only when these and its
  URL's port are free (else another server would answer); the test fails, naming the
  port, when one is not.
- A block that would run pytest (the README's test command) must be marked skip: the
  suite holds this test.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
SHELL = frozenset({"sh", "bash", "shell", "console"})
BIN = Path(sys.executable).parent
#: The node, workers and gateway the docs start listen here (README, Quick start).
DOC_PORTS = (8000, 8001, 8002, *range(8080, 8084), *range(9100, 9104))
WHILE_SERVING = "rsgw node --mode lpt_packing"
WHILE_SERVING_URL = "http://127.0.0.1:8000/v2/health/ready"
RUN_SECONDS = 30.0
HELP_SECONDS = 60.0
START_SECONDS = 60.0
STOP_SECONDS = 30.0
OUTPUT_CHARS = 4000

MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<body>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
INSTALL = re.compile(
    r"^python3 -m venv \.venv && \. \.venv/bin/activate && "
    r"pip install -e (?:\.|'\.\[[\w,-]+\]')(?: && |[ \t]*$)",
    re.M,
)
PLACEHOLDER = re.compile(r"(?<!<)<(?![<(])[A-Za-z0-9][^<>\n]*>")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
OPTION = re.compile(r"^\[?(--[A-Za-z0-9][\w-]*)")
PYTEST = re.compile(r"\bpytest\b")
#: Before every script: stop at the first failing command, and say which it was.
PRELUDE = "set -eo pipefail\ntrap 'echo \"doc-test: exit $? from: $BASH_COMMAND\" >&2' ERR\n"


@dataclass(frozen=True)
class Block:
    """One shell code block: where it is, what it holds, how it is marked."""

    page: str
    line: int
    lang: str
    text: str
    #: The marker's text after `doc-test:`, or None.
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def kind(self) -> str:
        """run, skip, help-only, serve or while-serving; `bad` for a marker not understood."""
        if self.marker is None:
            return "run"
        if self.marker == "while-serving":
            return "while-serving"
        if re.fullmatch(r"serve until https?://[^\s/]+\S*", self.marker):
            return "serve"
        match = re.fullmatch(r"(skip|help-only) \((.*\S.*)\)", self.marker)
        return match[1] if match else "bad"

    @property
    def url(self) -> str:
        return self.marker.rpartition(" ")[2] if self.marker else ""

    def commands(self) -> list[str]:
        """The block's commands: continuation lines joined, comment lines and the install
        prefix dropped; in a console block, the `$ ` lines."""
        lines = self.text.splitlines()
        if self.lang == "console":
            lines = [line[2:] for line in lines if line.startswith("$ ")]
        commands: list[str] = []
        pending = ""
        for line in lines:
            pending += line
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            command = INSTALL.sub("", pending.strip()).strip()
            pending = ""
            if command and not command.startswith("#"):
                commands.append(command)
        return commands

    def script(self) -> str:
        if self.lang == "console":
            return "\n".join(self.commands()) + "\n"
        return INSTALL.sub("", self.text)


def parse(name: str, text: str) -> tuple[list[Block], list[str]]:
    """A page's shell blocks, and its marker problems (a marker on no shell block)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    marked: dict[int, str] = {}  # 1-based line number -> marker
    for number, line in enumerate(lines, 1):
        match = MARKER.match(line)
        if match:
            marked[number] = match["body"]
        elif line.lstrip().startswith("<!--") and "doc-test" in line:
            problems.append(f"{name}:{number}: not a doc-test marker: {line.strip()}")
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        closing = re.compile(rf"\s*{re.escape(fence[0])}{{{len(fence)},}}\s*")
        end = index + 1
        while end < len(lines) and not closing.fullmatch(lines[end]):
            end += 1
        info = opening["info"].split()
        if info and info[0].lower() in SHELL:
            body = [re.sub(rf"^ {{0,{indent}}}", "", line) for line in lines[index + 1 : end]]
            # `index` is also the 1-based number of the line before the fence.
            marker = marked.pop(index, None)
            blocks.append(Block(name, index + 1, info[0].lower(), "\n".join(body) + "\n", marker))
        index = end + 1
    problems += [
        f"{name}:{number}: a doc-test marker must be the line just before a shell block's fence"
        for number in marked
    ]
    return blocks, problems


def simple_commands(command: str) -> list[list[str]]:
    """A command line's simple commands (split at `&&`, `|`, `;`...), as words."""
    lexer = shlex.shlex(PLACEHOLDER.sub("PLACEHOLDER", command), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for word in lexer:
        if word and set(word) <= set("();<>|&"):
            commands.append([])
        else:
            commands[-1].append(word)
    return [words for words in commands if words]


def own_command(words: list[str]) -> list[str] | None:
    """rsgw's or the repository's command, or None: its words up to the first option, less
    files and addresses (`--help` needs none)."""
    while words and ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]

    def in_repository(word: str) -> bool:
        return "/" in word and not word.startswith("/") and (ROOT / word.split("/")[0]).is_dir()

    if not words:
        return None
    if words[0] == "rsgw" or in_repository(words[0]):
        length = 1
    elif words[0] in ("python", "python3") and len(words) > 1 and in_repository(words[1]):
        length = 2
    else:
        return None
    prefix = words[:length]
    for word in words[length:]:
        if word.startswith(("-", "[")):
            break
        if not re.search(r"[/.:]", word):  # a subcommand, not a file or an address
            prefix.append(word)
    return prefix


def help_checks(block: Block) -> list[tuple[list[str], list[str], str]]:
    """(the command's prefix, the options it uses, the command line) for each own command."""
    checks = []
    for command in block.commands():
        for words in simple_commands(command):
            prefix = own_command(words)
            if prefix is not None:
                used = [m[1] for word in words if (m := OPTION.match(word))]
                checks.append((prefix, used, command))
    return checks


def block_problems(block: Block) -> list[str]:
    how = "mark it <!-- doc-test: help-only (why) --> or <!-- doc-test: skip (why) -->"
    kind = block.kind
    if kind == "bad":
        return [
            f"{block.where}: doc-test marker {block.marker!r} is none of: skip (REASON), "
            "help-only (REASON), serve until URL, while-serving"
        ]
    if kind == "skip":
        return []
    if kind == "help-only":
        if help_checks(block):
            return []
        return [f"{block.where}: help-only, but no rsgw or repository command in it: mark it skip"]
    executed = block.script() if kind == "run" else "\n".join(block.commands())
    problems = []
    placeholder = PLACEHOLDER.search(executed)
    if placeholder:
        problems.append(
            f"{block.where}: {placeholder[0]} is a placeholder, so the block cannot run as "
            f"written: {how}"
        )
    if PYTEST.search(executed):
        problems.append(f"{block.where}: runs pytest, whose suite holds this test: mark it skip")
    if not block.commands():
        problems.append(f"{block.where}: no command to run: {how}")
    return problems


def collect() -> tuple[list[Block], list[str]]:
    blocks: list[Block] = []
    problems: list[str] = []
    for page in PAGES:
        found, wrong = parse(page.relative_to(ROOT).as_posix(), page.read_text())
        blocks += found
        problems += wrong
    for block in blocks:
        problems += block_problems(block)
    return blocks, problems


BLOCKS, PROBLEMS = collect()
SOUND = [block for block in BLOCKS if not block_problems(block)]


def test_every_shell_block_is_runnable_or_marked() -> None:
    assert BLOCKS, "no shell block found"
    assert not PROBLEMS, "\n".join(PROBLEMS)


def test_the_marker_grammar() -> None:
    text = (
        "<!-- doc-test: skip (needs kubectl (and a cluster)) -->\n```sh\nkubectl get pods\n```\n"
        "1. A step\n\n   <!-- doc-test: serve until http://127.0.0.1:8000/x -->\n"
        "   ```bash\n   rsgw node \\\n     --gpus 2   # two\n   ```\n"
        "<!-- doc-test: help-only -->\n```console\n$ rsgw worker --port 1\noutput\n```\n"
        "<!-- doc-test: serve until http://127.0.0.1:1/ -->\n~~~~shell\n~~~\n~~~~\n"
        "<!-- doc-test: skip (no shell block) -->\n```python\nprint()\n```\n"
        "```sh\npython3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
        "ls <path>\n```\n<!-- doc-test skip -->\n"
    )
    blocks, problems = parse("page.md", text)
    skip, serve, bad, tildes, run = blocks
    assert [(b.line, b.kind) for b in blocks] == [
        (2, "skip"),
        (8, "serve"),
        (13, "bad"),
        (18, "serve"),
        (25, "run"),
    ]
    assert skip.marker == "skip (needs kubectl (and a cluster))"
    assert serve.url == "http://127.0.0.1:8000/x"
    assert serve.commands() == ["rsgw node    --gpus 2   # two"]
    assert bad.commands() == ["rsgw worker --port 1"]
    assert tildes.url == "http://127.0.0.1:1/"
    assert tildes.commands() == ["~~~"]
    assert run.commands() == ["ls <path>"]
    assert problems == [
        "page.md:28: not a doc-test marker: <!-- doc-test skip -->",
        "page.md:21: a doc-test marker must be the line just before a shell block's fence",
    ]
    assert "placeholder" in block_problems(run)[0]
    assert "none of" in block_problems(bad)[0]
    assert help_checks(bad) == [(["rsgw", "worker"], ["--port"], "rsgw worker --port 1")]
    line = "PYTHONPATH=<a b>/src bench/x --y 1 && python bench/f [--load 0.7[,0.9]] # --z"
    assert [own_command(words) for words in simple_commands(line)] == [
        ["bench/x"],
        ["python", "bench/f"],
    ]
    assert own_command(["kserve-env/bin/python", "server.py", "--grpc_port", "1"]) is None
    assert own_command(["rsgw", "ctl", "add-worker", "10.0.0.7:8001", "--name", "a"]) == [
        "rsgw",
        "ctl",
        "add-worker",
    ]


# ---------------------------------------------------------------------------
# Running.


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory that looks like the repository's root but is not: writes land here."""
    path = tmp_path_factory.mktemp("doc-commands")
    for entry in ROOT.iterdir():
        if entry.name != ".git":
            (path / entry.name).symlink_to(entry)
    return path


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTANT_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def tail(text: str) -> str:
    return text if len(text) <= OUTPUT_CHARS else "..." + text[-OUTPUT_CHARS:]


def spawn(command: str, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """`bash -c command` in its own process group, its output in `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd,
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def check_ports_free(what: str, ports: Iterable[int]) -> None:
    for port in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("0.0.0.0", port))
            except OSError as exc:
                pytest.fail(
                    f"port {port} is in use ({exc.strerror}), so {what} cannot start (the "
                    f"docs' servers use {', '.join(map(str, DOC_PORTS))}); stop what holds it: "
                    f"ss -ltnp 'sport = :{port}'"
                )


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as reply:
            return bool(reply.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def run_script(script: str, where: str, cwd: Path, log: Path) -> str | None:
    """Run a block's script; None, or why it failed (its output included)."""
    process = spawn(PRELUDE + script, cwd, log)
    try:
        code: int | None = process.wait(RUN_SECONDS)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        kill_group(process)
    if code == 0:
        return None
    if code is None:
        status = (
            f"ran over {RUN_SECONDS:.0f} s (if it starts a server, mark it "
            "<!-- doc-test: serve until URL -->)"
        )
    else:
        status = f"exited {code}"
    return (
        f"{where}: the block {status}; fix the doc, or if it cannot run here, mark it "
        f"(tests/test_doc_commands.py says how):\n{script}--- output:\n"
        f"{tail(log.read_text(errors='replace'))}"
    )


@dataclass
class Server:
    """A server a block started, in its own process group."""

    command: str
    where: str
    log: Path
    process: subprocess.Popen[bytes]

    def fail(self, why: str) -> NoReturn:
        output = tail(self.log.read_text(errors="replace"))
        pytest.fail(f"{self.where}: `{self.command}` {why}; its output:\n{output}")

    def stop(self) -> None:
        """Ctrl-C (SIGINT to the process group): a clean exit, and nothing left behind."""
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            code = self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.fail(f"did not exit within {STOP_SECONDS:.0f} s of SIGINT (Ctrl-C)")
        if code != 0:
            self.fail(f"exited {code} on SIGINT (Ctrl-C), not 0")
        deadline = time.monotonic() + 5.0
        while group_alive(self.process.pid):
            if time.monotonic() > deadline:
                self.fail("exited on SIGINT (Ctrl-C) but left processes of its group running")
            time.sleep(0.05)


def start(command: str, where: str, url: str, cwd: Path, log: Path) -> Server:
    """Start a server and wait until `url` answers 200. DOC_PORTS and the URL's port must
    be free (else another server would answer)."""
    port = urllib.parse.urlsplit(url).port or 80
    check_ports_free(f"{where}'s `{command}`", {*DOC_PORTS, port})
    server = Server(command, where, log, spawn(command, cwd, log))
    try:
        deadline = time.monotonic() + START_SECONDS
        while not answers(url):
            if server.process.poll() is not None:
                server.fail(f"exited {server.process.returncode} before {url} answered 200")
            if time.monotonic() > deadline:
                server.fail(f"did not answer 200 at {url} within {START_SECONDS:.0f} s")
            time.sleep(0.2)
    except BaseException:
        kill_group(server.process)
        raise
    return server


@contextlib.contextmanager
def servers() -> Iterator[list[Server]]:
    """The servers started in a test (append them): stopped by Ctrl-C at its end, last
    started first; killed in any case."""
    started: list[Server] = []
    try:
        yield started
        for server in reversed(started):
            server.stop()
    finally:
        for server in started:
            kill_group(server.process)


def help_output(prefix: tuple[str, ...], cwd: Path) -> tuple[int | None, str]:
    """`prefix --help`: its exit status (None on a timeout) and output."""
    try:
        done = subprocess.run(
            ["bash", "-c", shlex.join([*prefix, "--help"])],
            cwd=cwd,
            env=environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=HELP_SECONDS,
        )
    except subprocess.TimeoutExpired:
        return None, f"ran over {HELP_SECONDS:.0f} s"
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")


Helps = dict[tuple[str, ...], tuple[int | None, str]]


@pytest.fixture(scope="module")
def helps(workdir: Path) -> Helps:
    """Every help-only block's `--help` outputs, made at once (each costs an import)."""
    prefixes = {
        tuple(prefix)
        for block in SOUND
        if block.kind == "help-only"
        for prefix, _, _ in help_checks(block)
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        outputs = pool.map(lambda prefix: help_output(prefix, workdir), prefixes)
        return dict(zip(prefixes, outputs, strict=True))


def check_help(block: Block, helps: Helps) -> None:
    errors = []
    for prefix, used, command in help_checks(block):
        shown = shlex.join([*prefix, "--help"])
        code, text = helps[tuple(prefix)]
        if code != 0:
            errors.append(f"`{shown}` exited {code}:\n{tail(text)}")
            continue
        unknown = [o for o in used if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
        if unknown:
            errors.append(f"`{command}` uses {', '.join(unknown)}, which `{shown}` does not list")
    assert not errors, f"{block.where}: fix the doc:\n" + "\n".join(errors)


#: (command, URL) already served cleanly: the docs repeat the quick start.
SERVED: set[tuple[str, str]] = set()


@pytest.mark.parametrize(
    "block", [pytest.param(b, id=b.where) for b in SOUND if b.kind in ("run", "serve", "help-only")]
)
def test_block(block: Block, workdir: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if block.kind == "run":
        failure = run_script(block.script(), block.where, workdir, tmp_path / "output")
        assert failure is None, failure
    elif block.kind == "help-only":
        check_help(block, request.getfixturevalue("helps"))
    else:
        for number, command in enumerate(block.commands()):
            if (command, block.url) not in SERVED:
                with servers() as started:
                    log = tmp_path / str(number)
                    started.append(start(command, block.where, block.url, workdir, log))
                SERVED.add((command, block.url))


def test_while_serving(workdir: Path, tmp_path: Path) -> None:
    blocks = [block for block in SOUND if block.kind == "while-serving"]
    if not blocks:
        pytest.skip("no block is marked while-serving")
    failures = []
    with servers() as started:
        node = ("the while-serving node", WHILE_SERVING_URL, workdir, tmp_path / "node")
        started.append(start(WHILE_SERVING, *node))
        for number, block in enumerate(blocks):
            log = tmp_path / str(number)
            failures.append(run_script(block.script(), block.where, workdir, log))
    errors = [failure for failure in failures if failure]
    assert not errors, "\n\n".join(errors)
