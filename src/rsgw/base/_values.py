"""Value checks and the strict YAML reader that every rsgw file format shares.

Pure: no trio, no sockets, no logging, no clock. `read_yaml` opens one file; everything
else is a function of its arguments.

A check has the shape `check(value, key) -> normal form` and raises a `ConfigError`
that names `key` and quotes the bad value (`show`), so gateway.yml, the node file, the
environment and the runtime control plane all word their errors alike. The checks
here know nothing of any one file: the gateway's keys are in `rsgw.config._blocks`,
`rsgw.config._endpoints` and `rsgw.config._schema`, the scheduling knobs in
`rsgw.scheduling.knobs._knobs`, the node file's in `rsgw.node._node`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

import yaml

from rsgw.base._errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

#: A check: `check(value, key) -> normal form`, raising ConfigError that names `key`.
Check: TypeAlias = "Callable[[object, str], Any]"


def show(value: object) -> str:
    """A bad value as messages quote it: its repr, cut short if it is long."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def one_of(values: Iterable[str]) -> str:
    """`'a' or 'b'`, or `'a', 'b', or 'c'`: the choices as a message lists them."""
    quoted = [f"'{v}'" for v in values]
    return ", ".join(quoted[:-1]) + f", or {quoted[-1]}" if len(quoted) > 2 else " or ".join(quoted)


def must_be(key: str, what: str, value: object) -> ConfigError:
    """The error for a value of the wrong type: "config 'KEY' must be WHAT, got VALUE"."""
    return ConfigError(f"config '{key}' must be {what}, got {show(value)}")


def check_int(value: object, key: str) -> int:
    # bool is an int subclass; `max_concurrent_streams: yes` is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise must_be(key, "an integer", value)
    return value


def check_float(value: object, key: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise must_be(key, "a number", value)
    try:
        number = float(value)
    except OverflowError:  # an int past float range
        number = math.inf
    if not math.isfinite(number):
        raise must_be(key, "a finite number", value)
    return number


def check_bool(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise must_be(key, "a boolean", value)
    return value


def check_str(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise must_be(key, "a string", value)
    return value


def ranged(base: Check, test: Callable[[Any], bool], rule: str) -> Check:
    """A check that applies `base` (the type) and then `test`, failing with `rule`."""

    def check(value: object, key: str) -> Any:
        result = base(value, key)
        if not test(result):
            raise ConfigError(f"{key} must be {rule}, got {show(value)}")
        return result

    return check


def choice(enum_type: type[enum.StrEnum], allowed: tuple[str, ...] | None = None) -> Check:
    """A check for one of the (case-insensitive, stripped) values of `enum_type`."""
    names = allowed or tuple(m.value for m in enum_type)

    def check(value: object, key: str) -> Any:
        text = check_str(value, key).strip().lower()
        if text not in names:
            raise ConfigError(f"{key} must be {one_of(names)}, got {show(value)}")
        return enum_type(text)

    return check


def words(allowed: tuple[str, ...]) -> Check:
    """A check for one of `allowed` (case-insensitive, stripped); returns it lower-cased."""

    def check(value: object, key: str) -> str:
        text = check_str(value, key).strip().lower()
        if text not in allowed:
            raise ConfigError(f"{key} must be {one_of(allowed)}, got {show(value)}")
        return text

    return check


def split_host_port(address: str) -> tuple[str, int]:
    """`host:port` (IPv6 in brackets) to its parts; ValueError if malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


# ---------------------------------------------------------------------------
# YAML.


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that rejects a key given twice in one mapping (plain safe_load keeps
    the last one without a word, so half of an operator's block would silently vanish)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Hashable] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # the base class reports unhashable keys itself
            if key in seen:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str) -> object:
    """Parse YAML text safely, rejecting duplicate keys; errors are one line.

    Args:
        text: the document.
        source: what to start an error with ("models.yaml", "node file n.yml").

    Raises:
        ConfigError: "<source>: invalid YAML at line L, column C: <problem>".
    """
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(exc.problem or exc.context or "syntax error").split())
        raise ConfigError(f"{source}: invalid YAML{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {' '.join(str(exc).split())}") from None


def read_yaml(path: str, *, what: str, missing: str | None = None) -> object:
    """Read and parse one YAML file; every failure is a one-line ConfigError.

    Args:
        path: the file.
        what: what the file is, for messages ("gateway config", "node file").
        missing: the message when the file does not exist; default "<what> not found: <path>".
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(missing or f"{what} not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path}: not UTF-8 text ({exc.reason})") from None
    return parse_yaml(text, f"{what} {path}")


BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(count: int) -> str:
    """`1536` -> `1.5 KiB`; binary units, as worker weight budgets are written."""
    if abs(count) < 1024:
        return f"{count} B"
    value = float(count)
    for unit in BYTE_UNITS:
        value /= 1024
        if abs(value) < 1024 or unit == BYTE_UNITS[-1]:
            break
    return f"{value:.1f} {unit}"


def check_fields(obj: object, prefix: str, checks: Mapping[str, Check]) -> None:
    """Run each field of a frozen dataclass through its check and store the normal form."""
    for name, check in checks.items():
        object.__setattr__(obj, name, check(getattr(obj, name), f"{prefix}{name}"))
