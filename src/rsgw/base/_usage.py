"""Command lines that say which option was meant: argparse with two habits changed.

Pure. Every rsgw command line (`rsgw`, its subcommands, `rsgw ctl`, `rsgw simulate`)
is parsed by a `StrictParser`:

- no prefix matching (`--gpu 2` is not `--gpus 2`: a silent guess is worse than an
  error);
- an option the command does not know is that command's error, under that command's
  usage, with the nearest option it does know (`rsgw node: error: unrecognized
  arguments: --gpu 2 (did you mean --gpus?)`). Plain argparse lets a subcommand's
  unknown options travel up to the top-level parser, which prints `rsgw`'s usage
  instead of `rsgw node`'s and guesses nothing.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from typing import Any


def nearest(word: str, choices: Sequence[str]) -> str:
    """` (did you mean X?)` for the choice closest to `word`, or "" when none is close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def unrecognized(extra: Sequence[str], options: Sequence[str]) -> str:
    """argparse's message for arguments nobody took, with the nearest known option."""
    flags = [word.split("=", 1)[0] for word in extra if word.startswith("-")]
    hint = nearest(flags[0], options) if flags else ""
    return f"unrecognized arguments: {' '.join(extra)}{hint}"


class StrictParser(argparse.ArgumentParser):
    """An ArgumentParser without prefix matching whose unknown options are its own error.

    Used as its own subparsers' class too (`add_subparsers` inherits it), so a
    subcommand reports its own unknown options: argparse hands each subcommand its
    arguments through `parse_known_args`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:
            options = [s for action in self._actions for s in action.option_strings]
            self.error(unrecognized(extra, options))
        return parsed, extra
