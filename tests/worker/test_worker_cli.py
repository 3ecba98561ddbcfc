"""`rsgw worker`'s flags for the GPU model, and the purity of the worker's new cores."""

from __future__ import annotations

import pytest

from rsgw._flags import build_parser


def parse(*argv: str) -> dict[str, object]:
    return vars(build_parser().parse_args(["worker", *argv]))


def test_defaults() -> None:
    args = parse()
    assert args["discipline"] == "fifo"
    assert args["weight_cache_bytes"] == 0
    assert args["residency_mode"] == "self_managed"
    assert args["load_bandwidth"] is None  # the worker's 8 GiB/s
    assert args["pin"] == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("536870912", 512 << 20),
        ("512MiB", 512 << 20),
        ("8GiB", 8 << 30),
        ("8 gib", 8 << 30),
        ("1.5GB", 1_500_000_000),
        ("100k", 100_000),
    ],
)
def test_weight_cache_bytes_takes_units(text: str, expected: int) -> None:
    assert parse("--weight-cache-bytes", text)["weight_cache_bytes"] == expected


def test_the_new_flags() -> None:
    args = parse(
        "--discipline",
        "fair",
        "--residency-mode",
        "externally_managed",
        "--load-bandwidth",
        "2GiB",
        "--pin",
        "simple",
        "--pin",
        "reranker",
    )
    assert args["discipline"] == "fair"
    assert args["residency_mode"] == "externally_managed"
    assert args["load_bandwidth"] == 2 << 30
    assert args["pin"] == ["simple", "reranker"]
    assert parse("--discipline", "edf")["discipline"] == "edf"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--discipline", "lifo"), "invalid choice: 'lifo'"),
        (("--weight-cache-bytes", "-1"), "not a byte size"),
        (("--weight-cache-bytes", "12 parsecs"), "not a byte size"),
        (("--residency-mode", "explicit"), "invalid choice: 'explicit'"),
        (("--load-bandwidth", "0"), "must be > 0"),
    ],
)
def test_bad_flags_exit_2(
    argv: tuple[str, ...], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2
    assert needle in capsys.readouterr().err
