"""Every message docs/troubleshooting.md lists is still one rsgw's code prints.

The page lists each message as a `###` heading whose one code span is the message as the
code words it (anything outside the span frames it: the command's `rsgw run:` prefix, a
gRPC status, a log level); `<like-this>` marks a value the code fills in.

The code's side is every string in src/rsgw (docstrings and the generated `*_pb2.py`
modules aside), read with `ast`: string literals (adjacent literals are one already),
f-strings with each `{...}` as a *slot*, and `+` chains of them (an operand that is not a
string literal is a slot). Text the code itself writes in angle brackets (`<token>`)
counts as a slot too.

A listed message is found when some string of the code matches all of it, where
- its literal text is the string's own text, character for character;
- each `<placeholder>` stands where the string has a slot;
- a slot may also stand for literal text of the message, when the code formats a
  constant or a message piece into it (`f"{ENV_FILE} points at a missing file: ..."`,
  `_denied(key, "system shared memory can only ...")`): each run of that text between
  placeholders that is at least MIN_PIECE characters long must be written in a string of
  the same module (shorter runs, `: ` or `'`, are not checked);
- the string has at least MIN_OWN_TEXT characters of its own text (`f"{a}: {b}"` matches
  anything, so it never counts).
A message reworded in the code therefore no longer matches, and fails the test.

Pure and fast: no server, no import of rsgw, one parse of each source file.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "troubleshooting.md"
SOURCE = ROOT / "src" / "rsgw"

#: The page must list at least this many messages (an empty page must not pass).
MIN_MESSAGES = 25
#: A string must bring at least this many characters of its own text to match.
MIN_OWN_TEXT = 8
#: Runs of message text a slot stands for are checked from this length on.
MIN_PIECE = 4

HEADING = re.compile(r"^###[ \t]+(?P<text>.+?)[ \t]*$", re.MULTILINE)
CODE_SPAN = re.compile(r"(?P<ticks>`+)(?P<body>.+?)(?P=ticks)")
PLACEHOLDER = re.compile(r"<[A-Za-z][^<>]*>")
#: A slot of a source string, and a placeholder of a listed message, once rendered.
SLOT = "\x00"
HOLE = "\x01"


# ---------------------------------------------------------------------------
# The page.


def listed_messages(markdown: str) -> list[str]:
    """The message of each `###` heading: the text of its one code span.

    Raises:
        ValueError: a `###` heading without exactly one code span (every `###` of the
            page is a message).
    """
    messages = []
    for heading in HEADING.finditer(markdown):
        spans = list(CODE_SPAN.finditer(heading["text"]))
        if len(spans) != 1:
            raise ValueError(f"heading without exactly one code span: {heading[0]!r}")
        body = spans[0]["body"]
        if body.startswith(" ") and body.endswith(" ") and body.strip():
            body = body[1:-1]  # CommonMark: one space each side lets a span hold a backtick
        messages.append(body)
    return messages


# ---------------------------------------------------------------------------
# The code.


@dataclass(frozen=True, slots=True)
class Template:
    """One string of the code: its text with SLOT where a value goes."""

    module: str
    line: int
    text: str


def _literal(text: str) -> str:
    """A literal's text; its own `<placeholders>` become slots."""
    return PLACEHOLDER.sub(SLOT, text.replace(SLOT, "").replace(HOLE, ""))


def _rendered(node: ast.expr) -> str:
    """A string expression as text with slots; any other expression is one slot."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _literal(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(_rendered(part) for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _is_text(node):
        return _rendered(node.left) + _rendered(node.right)
    return SLOT


def _is_text(node: ast.expr) -> bool:
    """A string literal, an f-string, or a `+` chain with one of them in it."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_text(node.left) or _is_text(node.right)
    return False


_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def templates_of(source: str, module: str) -> list[Template]:
    """Every string of one module's source, docstrings aside.

    One pass, parents before children (`ast.walk`): a docstring, an f-string's literal
    parts and its format specs are marked before they are reached, and skipped.
    """
    skip: set[int] = set()
    found: list[Template] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, _OWNERS):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str) and id(node) not in skip:
                found.append(Template(module, node.lineno, _literal(node.value)))
        elif isinstance(node, ast.JoinedStr):
            if id(node) in skip:
                continue
            for part in node.values:
                if isinstance(part, ast.Constant):
                    skip.add(id(part))
                elif isinstance(part, ast.FormattedValue) and part.format_spec is not None:
                    skip.add(id(part.format_spec))
            found.append(Template(module, node.lineno, _rendered(node)))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _is_text(node):
            found.append(Template(module, node.lineno, _rendered(node)))
    return found


@functools.cache
def source_templates() -> tuple[Template, ...]:
    """Every string of src/rsgw."""
    found: list[Template] = []
    for path in sorted(SOURCE.rglob("*.py")):
        if path.name.endswith("_pb2.py"):
            continue  # protoc's output: serialized descriptors, no messages
        module = path.relative_to(ROOT).as_posix()
        found += templates_of(path.read_text(encoding="utf-8"), module)
    return tuple(found)


# ---------------------------------------------------------------------------
# The match.


class Matcher:
    """Finds listed messages among templates (the rule is the module docstring's)."""

    def __init__(self, templates: Sequence[Template]) -> None:
        self._templates = [
            (t, t.text.split(SLOT))
            for t in templates
            if len(t.text) - t.text.count(SLOT) >= MIN_OWN_TEXT
        ]
        self._texts: dict[str, list[str]] = {}
        for t in templates:
            self._texts.setdefault(t.module, []).append(t.text)
        self._patterns: dict[str, re.Pattern[str]] = {}

    def find(self, message: str) -> Template | None:
        """The first string that `message` matches, or None."""
        text = PLACEHOLDER.sub(HOLE, message)
        for template, parts in self._templates:
            if not (text.startswith(parts[0]) and text.endswith(parts[-1])):
                continue
            if not all(part in text for part in parts):
                continue
            match = self._pattern(template.text, parts).fullmatch(text)
            if match is not None and all(
                self._written(template.module, piece)
                for held in match.groups()
                for piece in held.split(HOLE)
            ):
                return template
        return None

    def missing(self, messages: Sequence[str]) -> list[str]:
        """Those of `messages` that no string of the code matches."""
        return [message for message in messages if self.find(message) is None]

    def _pattern(self, text: str, parts: list[str]) -> re.Pattern[str]:
        pattern = self._patterns.get(text)
        if pattern is None:
            pattern = re.compile("(.*?)".join(map(re.escape, parts)), re.DOTALL)
            self._patterns[text] = pattern
        return pattern

    def _written(self, module: str, piece: str) -> bool:
        """Message text a slot stands for: short, or in a string of the module."""
        return len(piece) < MIN_PIECE or any(piece in s for s in self._texts[module])


# ---------------------------------------------------------------------------
# The page against the code.


@functools.cache
def page_messages() -> tuple[str, ...]:
    return tuple(listed_messages(PAGE.read_text(encoding="utf-8")))


def test_the_page_lists_enough_messages() -> None:
    assert len(page_messages()) >= MIN_MESSAGES


def test_each_message_is_listed_once() -> None:
    messages = page_messages()
    assert sorted({m for m in messages if messages.count(m) > 1}) == []


def test_every_listed_message_is_in_the_code() -> None:
    missing = Matcher(source_templates()).missing(page_messages())
    assert missing == [], (
        "docs/troubleshooting.md lists messages no string of src/rsgw matches any more "
        "(reworded? update the page):\n" + "\n".join(missing)
    )


# ---------------------------------------------------------------------------
# The matcher itself.


def _matcher(**modules: str) -> Matcher:
    return Matcher([t for name, source in modules.items() for t in templates_of(source, name)])


def test_an_absent_message_is_reported() -> None:
    absent = "gateway config file is missing: <path>"
    present = "gateway config file not found: <path>"
    assert Matcher(source_templates()).missing([absent, present]) == [absent]


def test_a_reworded_message_no_longer_matches() -> None:
    before = _matcher(m='def f(p):\n    raise E(f"gateway config file not found: {p}")\n')
    after = _matcher(m='def f(p):\n    raise E(f"gateway config file missing: {p}")\n')
    message = "gateway config file not found: <path>"
    assert before.find(message) is not None
    assert after.find(message) is None


def test_placeholders_stand_only_where_the_code_has_a_value() -> None:
    matcher = _matcher(m='X = f"port {port} is used twice"\n')
    assert matcher.find("port <port> is used twice") is not None
    assert matcher.find("<what> <port> is used twice") is None  # "port" is the code's text
    assert matcher.find("port <port> is used twice: by <worker>") is None  # more than it says
    assert matcher.find("port 65535 is used twice") is None  # a value, not a placeholder


def test_a_slot_may_hold_text_of_the_same_module() -> None:
    source = 'ENV = "REACTANT_GATEWAY_FILE"\nX = f"{ENV} points at a missing file: {p}"\n'
    matcher = _matcher(config=source)
    assert matcher.find("REACTANT_GATEWAY_FILE points at a missing file: <path>") is not None
    assert matcher.find("REACTANT_GATEWAY_FOO points at a missing file: <path>") is None
    constant_elsewhere = 'ENV = "REACTANT_GATEWAY_FILE"\n'
    elsewhere = _matcher(
        config='X = f"{ENV} points at a missing file: {p}"\n', other=constant_elsewhere
    )
    assert elsewhere.find("REACTANT_GATEWAY_FILE points at a missing file: <path>") is None


def test_concatenation_and_angle_brackets_of_the_code() -> None:
    matcher = _matcher(
        m='A = "no worker implements " + rpc + (f" ({said})" if said else "")\n'
        "B = \"send 'authorization: Bearer <token>' metadata\"\n"
    )
    assert matcher.find("no worker implements <method> (<why>)") is not None
    assert matcher.find("send 'authorization: Bearer <token>' metadata") is not None


def test_docstrings_and_short_strings_do_not_count() -> None:
    matcher = _matcher(m='"""gateway config file not found: <path>"""\nX = f"{a}: {b}"\n')
    assert matcher.find("gateway config file not found: <path>") is None
    assert matcher.find("anything at all: <value>") is None


def test_every_heading_is_a_message() -> None:
    page = "### rsgw run: `a <b>`\n\n### ``c `d` e``\n\n## group\n"
    assert listed_messages(page) == ["a <b>", "c `d` e"]
    with pytest.raises(ValueError, match="without exactly one code span"):
        listed_messages("### no code span here\n")
