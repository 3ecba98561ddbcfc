"""The shared value checks and the strict YAML reader (rsgw.base._values).

Each file format's own tests (test_config, test_node, worker/test_catalogue) check the
messages their keys produce; here we pin the building blocks they share.
"""

from __future__ import annotations

import enum
import math
import pathlib
from collections.abc import Callable

import pytest

from rsgw.base._errors import ConfigError
from rsgw.base._values import (
    check_bool,
    check_float,
    check_int,
    check_str,
    choice,
    one_of,
    parse_yaml,
    ranged,
    read_yaml,
    show,
    split_host_port,
    words,
)


class Colour(enum.StrEnum):
    RED = "red"
    GREEN = "green"


def test_show_quotes_the_repr_and_cuts_it_at_60() -> None:
    assert show("x") == "'x'"
    assert show(None) == "None"
    long = show("y" * 100)
    assert len(long) == 60
    assert long == repr("y" * 100)[:57] + "..."


@pytest.mark.parametrize(
    ("values", "text"),
    [(["a"], "'a'"), (["a", "b"], "'a' or 'b'"), (["a", "b", "c"], "'a', 'b', or 'c'")],
)
def test_one_of_lists_choices_as_messages_do(values: list[str], text: str) -> None:
    assert one_of(values) == text


@pytest.mark.parametrize(
    ("check", "good", "normal"),
    [
        (check_int, 3, 3),
        (check_float, 2, 2.0),
        (check_float, 0.5, 0.5),
        (check_bool, False, False),
        (check_str, "", ""),
    ],
)
def test_type_checks_accept_and_normalise(
    check: Callable[[object, str], object], good: object, normal: object
) -> None:
    result = check(good, "k")
    assert result == normal
    assert type(result) is type(normal)


@pytest.mark.parametrize(
    ("check", "bad", "what"),
    [
        (check_int, True, "an integer"),
        (check_int, 1.0, "an integer"),
        (check_int, "1", "an integer"),
        (check_float, False, "a number"),
        (check_float, "1.5", "a number"),
        (check_float, math.inf, "a finite number"),
        (check_float, math.nan, "a finite number"),
        (check_float, 10**400, "a finite number"),
        (check_bool, 1, "a boolean"),
        (check_bool, "yes", "a boolean"),
        (check_str, 1, "a string"),
        (check_str, None, "a string"),
    ],
)
def test_type_checks_name_the_key_and_the_value(
    check: Callable[[object, str], object], bad: object, what: str
) -> None:
    with pytest.raises(ConfigError) as info:
        check(bad, "a.b")
    assert str(info.value) == f"config 'a.b' must be {what}, got {show(bad)}"


def test_ranged_applies_the_type_then_the_rule() -> None:
    percent = ranged(check_float, lambda x: 0 <= x <= 1, "in [0, 1]")
    assert percent(1, "k") == 1.0
    with pytest.raises(ConfigError, match=r"^k must be in \[0, 1\], got 2$"):
        percent(2, "k")
    with pytest.raises(ConfigError, match="must be a number"):
        percent("0.5", "k")


def test_choice_is_case_insensitive_and_returns_the_member() -> None:
    colour = choice(Colour)
    assert colour(" RED ", "k") is Colour.RED
    with pytest.raises(ConfigError, match=r"^k must be 'red' or 'green', got 'blue'$"):
        colour("blue", "k")
    only_red = choice(Colour, ("red",))
    with pytest.raises(ConfigError, match=r"^k must be 'red', got 'green'$"):
        only_red("green", "k")


def test_words_returns_the_lower_cased_word() -> None:
    level = words(("debug", "info", "error"))
    assert level(" Info ", "k") == "info"
    with pytest.raises(ConfigError, match=r"^k must be 'debug', 'info', or 'error', got 'x'$"):
        level("x", "k")


@pytest.mark.parametrize(
    ("address", "parts"),
    [("a:1", ("a", 1)), ("0.0.0.0:0", ("0.0.0.0", 0)), ("[::1]:80", ("::1", 80)), (":5", ("", 5))],
)
def test_split_host_port(address: str, parts: tuple[str, int]) -> None:
    assert split_host_port(address) == parts


@pytest.mark.parametrize("address", ["a", "a:", "a:x", "a:-1"])
def test_split_host_port_rejects_what_is_not_host_port(address: str) -> None:
    with pytest.raises(ValueError, match="is not host:port"):
        split_host_port(address)


# -- YAML -------------------------------------------------------------------------------------


def test_parse_yaml_is_safe_and_plain() -> None:
    assert parse_yaml("a: [1, x]\nb: {c: null}\n", "s") == {"a": [1, "x"], "b": {"c": None}}
    assert parse_yaml("", "s") is None
    with pytest.raises(ConfigError, match=r"^s: invalid YAML at line 1, column 1: "):
        parse_yaml("!!python/object:os.system {}\n", "s")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("a: 1\na: 2\n", "line 2, column 1: duplicate key 'a'"),
        ("x:\n  b: 1\n  b: 2\n", "line 3, column 3: duplicate key 'b'"),
        ("- {1: a, 1: b}\n", "line 1, column 10: duplicate key 1"),
    ],
)
def test_parse_yaml_rejects_a_duplicate_key_where_it_is(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "s")
    assert str(info.value) == f"s: invalid YAML at {where}"


def test_parse_yaml_keeps_distinct_keys_in_sibling_mappings() -> None:
    assert parse_yaml("a: {k: 1}\nb: {k: 2}\n", "s") == {"a": {"k": 1}, "b": {"k": 2}}


def test_parse_yaml_syntax_error_is_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml("a: [1\n", "s")
    message = str(info.value)
    assert message.startswith("s: invalid YAML at line ")
    assert "\n" not in message


def test_read_yaml_reads_a_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "f.yml"
    path.write_text("a: 1\n", encoding="utf-8")
    assert read_yaml(str(path), what="thing") == {"a": 1}


def read_error(path: object, **kwargs: str) -> str:
    with pytest.raises(ConfigError) as info:
        read_yaml(str(path), what="thing", **kwargs)
    return str(info.value)


def test_read_yaml_failures_name_what_and_where(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "none.yml"
    assert read_error(missing) == f"thing not found: {missing}"
    assert read_error(missing, missing="gone") == "gone"
    assert read_error(tmp_path).startswith(f"cannot read thing {tmp_path}: ")
    binary = tmp_path / "bin.yml"
    binary.write_bytes(b"\xff\xfe\x00")
    assert read_error(binary).startswith(f"thing {binary}: not UTF-8 text (")
    twice = tmp_path / "twice.yml"
    twice.write_text("a: 1\na: 2\n", encoding="utf-8")
    assert (
        read_error(twice) == f"thing {twice}: invalid YAML at line 2, column 1: duplicate key 'a'"
    )
