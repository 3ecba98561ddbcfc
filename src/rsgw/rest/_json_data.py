"""Large JSON tensor data, read and written without a Python object per element.

Pure. `json.loads` of a REST infer body makes a Python number for every element,
and a list slot beside it: 32 bytes for each `1.5,` of four characters, so a
47 MiB body of FP32 numbers cost the gateway 257 MB (issue 47: four such bodies
grew its RSS by 1,028 MB before it answered). So an infer body is read in two
parts:

- `cut_data` finds the large numeric `"data"` arrays in the body's text, with one
  regular-expression pass that steps over strings whole (a `"data": [` inside a
  string is not one), and returns the body's text without them (`Skeleton`: each
  array's place holds a small marker object); that small remainder is what
  `json.loads` parses, so the request's model, inputs, datatypes and shapes are all
  known, and checked, before any number is read;
- `pack_numbers` then turns one array's text into its packed little-endian bytes
  a slice at a time (`SLICE_BYTES` of text, split at a comma), each slice parsed by
  the json module's own C scanner and packed at once: what a slice makes is freed
  before the next, so reading a tensor costs its packed size and one slice.

Nesting is taken as row-major order (brackets are dropped, the elements counted
against the shape), and every element is typed as `json.loads` types it, so a
request means the same as it did when the whole body went through `json.loads`;
anything the fast path does not take (an array holding strings, `NaN`, objects)
stays in the remainder and goes through `json.loads` as before.

The other way, `numbers_json` writes a raw tensor's JSON text in slices too.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass

#: Arrays shorter than this stay in the remainder (`json.loads` is fine for them).
MIN_CUT_BYTES = 64 * 1024
#: How much text one slice of `pack_numbers` parses at once (a slice makes about 30
#: bytes of Python objects per number it holds: a few MB, freed before the next).
SLICE_BYTES = 256 * 1024
#: How many elements one slice of `numbers_json` formats at once.
SLICE_ELEMENTS = 32 * 1024
#: The key of the marker object that stands for a cut array in the remainder.
MARK = "\x00rsgw.cut"

# One pass over the text, left to right: a "data" key followed by a long run of what
# a numeric array is made of (digits, signs, points, exponents, commas, brackets,
# whitespace, true and false), or any other string, stepped over whole.
_TOKENS = re.compile(
    rb'"data"\s*:\s*(\[[-+0-9.eE,\[\]\s]*(?:(?:true|false)[-+0-9.eE,\[\]\s]*)*)'
    rb'|"[^"\\]*(?:\\.[^"\\]*)*"'
)
_BRACKETS = re.compile(rb"[\[\]]")
_MARKER = b'{"\\u0000rsgw.cut":%d}'  # JSON for {MARK: index}
_DROP_BRACKETS = bytes.maketrans(b"[]", b"  ")


@dataclass(frozen=True, slots=True)
class Skeleton:
    """A body's text with its large numeric arrays cut out.

    `text` is valid JSON exactly when the body was; the array that stood at
    position `i` of `spans` is now `{MARK: i}`, and `spans[i]` is its (start, end)
    in the body.
    """

    text: bytes
    spans: tuple[tuple[int, int], ...]


def cut_data(body: bytes | bytearray | memoryview, min_bytes: int = MIN_CUT_BYTES) -> Skeleton:
    """`body` with its numeric `"data"` arrays of `min_bytes` or more cut out."""
    if len(body) < min_bytes:
        return Skeleton(bytes(body), ())
    data = body if isinstance(body, bytes) else memoryview(body).cast("B")
    parts: list[bytes | memoryview] = []
    spans: list[tuple[int, int]] = []
    kept = 0
    for match in _TOKENS.finditer(data):
        start = match.start(1)
        if start < 0 or match.end(1) - start < min_bytes:
            continue
        end = _array_end(data, start, match.end(1))
        if end is None or end - start < min_bytes:
            continue
        parts += (data[kept:start], _MARKER % len(spans))
        spans.append((start, end))
        kept = end
    if not spans:
        return Skeleton(bytes(data), ())
    parts.append(data[kept:])
    return Skeleton(b"".join(parts), tuple(spans))


def _array_end(data: bytes | memoryview, start: int, stop: int) -> int | None:
    """Where the array opening at `start` closes (None: not within `stop`)."""
    depth = 0
    for bracket in _BRACKETS.finditer(data, start, stop):
        depth += 1 if bracket.group() == b"[" else -1
        if depth == 0:
            return bracket.end()
    return None


def span_of(value: object, skeleton: Skeleton) -> tuple[int, int] | None:
    """The body span a value of the parsed remainder stands for (None: a real value)."""
    if type(value) is dict and len(value) == 1:
        index = value.get(MARK)
        if type(index) is int and 0 <= index < len(skeleton.spans):
            return skeleton.spans[index]
    return None


class NumbersError(ValueError):
    """Why an array's text does not hold the numbers its tensor needs."""


def pack_numbers(
    text: bytes | memoryview,
    count: int,
    kinds: frozenset[type],
    pack: Callable[[list[object]], bytes],
    slice_bytes: int = SLICE_BYTES,
) -> bytearray:
    """The JSON array `text` (flat or nested) as packed bytes, a slice at a time.

    `kinds` are the element types the datatype takes (as `json.loads` types them);
    `pack` packs one slice's values (raising `ValueError` out of range).

    Raises:
        NumbersError: the text is not an array of `count` such elements.
    """
    view = memoryview(text).cast("B")
    end = len(view)
    out = bytearray()
    seen = 0
    position = 0
    while position < end:
        stop = min(end, position + slice_bytes)
        cut = stop  # the slice is view[position:cut]; the next starts at stop
        if stop < end:  # cut between two elements, at a comma (which goes with neither)
            comma = _comma_from(view, max(position, stop - 64), end)
            cut, stop = comma, comma + 1
        piece = bytes(view[position:cut]).translate(_DROP_BRACKETS).strip()
        if not piece and (position > 0 or cut < end):  # ",," or a comma at an end
            raise NumbersError(f"not an array of numbers near element {seen}")
        position = stop
        if not piece:
            continue
        try:
            values = json.loads(b"[" + piece + b"]")
        except ValueError:
            raise NumbersError(f"not an array of numbers near element {seen}") from None
        if not set(map(type, values)) <= kinds:
            bad = next(i for i, v in enumerate(values) if type(v) not in kinds)
            raise NumbersError(f"{json.dumps(values[bad])} at element {seen + bad}")
        if seen + len(values) > count:
            raise NumbersError(f"expected {count} elements, got more")
        try:
            out += pack(values)
        except ValueError as exc:
            raise NumbersError(f"{exc} (elements {seen} to {seen + len(values) - 1})") from None
        seen += len(values)
    if seen != count:
        raise NumbersError(f"expected {count} elements, got {seen}")
    return out


def _comma_from(view: memoryview, start: int, end: int) -> int:
    """Where the first comma at or after `start` is (`end` if none)."""
    while start < end:
        window = bytes(view[start : start + 4096])
        found = window.find(b",")
        if found >= 0:
            return start + found
        start += len(window)
    return end


def numbers_json(elements: array[int] | array[float]) -> Iterator[str]:
    """A numeric tensor's JSON array text, in pieces of `SLICE_ELEMENTS` elements each."""
    yield "["
    for start in range(0, len(elements), SLICE_ELEMENTS):
        text = json.dumps(elements[start : start + SLICE_ELEMENTS].tolist(), separators=(",", ":"))
        yield text[1:-1] if start == 0 else "," + text[1:-1]
    yield "]"
