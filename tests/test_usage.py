"""`rsgw.base._usage`: command lines that say which option was meant (issue 40)."""

from __future__ import annotations

import pytest

from rsgw.base._usage import StrictParser, nearest, unrecognized


def test_nearest_names_a_close_choice_and_nothing_else() -> None:
    assert nearest("--gpu", ["--gpus", "--models"]) == " (did you mean --gpus?)"
    assert nearest("stauts", ["status", "repack"]) == " (did you mean status?)"
    assert nearest("--frobnicate", ["--gpus", "--models"]) == ""


def test_unrecognized_hints_from_the_first_option_and_its_value() -> None:
    assert unrecognized(["--confg=x.yml"], ["--config"]) == (
        "unrecognized arguments: --confg=x.yml (did you mean --config?)"
    )
    assert unrecognized(["extra"], ["--config"]) == "unrecognized arguments: extra"


def test_a_subcommand_reports_its_own_unknown_option(capsys: pytest.CaptureFixture[str]) -> None:
    parser = StrictParser(prog="tool")
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("serve")
    sub.add_argument("--port")
    assert parser.parse_args(["serve", "--port", "1"]).port == "1"
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["serve", "--prot", "1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tool serve ")
    assert "tool serve: error: unrecognized arguments: --prot 1 (did you mean --port?)" in err
    with pytest.raises(SystemExit):  # no prefix matching
        parser.parse_args(["serve", "--po", "1"])
