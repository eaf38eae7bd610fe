"""What every verb's parser shares: the parser class whose errors are one line, and the argument types
(each refuses a bad value with a message naming the argument's rule)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import NoReturn, TypeAlias

from privacy_wall.names import did_you_mean
from vips.choices import MODEL_ALIASES
from vips.errors import UsageError


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are raised (one line, exit 2 from main) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{with_suggestion(message)} (see {self.prog} --help)")


#: argparse's message for a value outside an option's choices.
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)$")


def with_suggestion(message: str) -> str:
    """argparse's "invalid choice" with the closest choices (a model, an algorithm, a kind, a status)."""
    found = _INVALID_CHOICE.search(message)
    if found is None:
        return message
    choices = re.findall(r"'([^']*)'", found["choices"])
    meant = MODEL_ALIASES.get(found["given"].lower().replace("-", "").replace("_", ""))
    if meant is not None and meant[0] in choices:
        return message + f" ({meant[1]} is {meant[0]!r})"
    return message + did_you_mean(found["given"], choices)


def whole(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


#: The units --expires-in takes, in days.
_DAYS_PER_UNIT = {"h": 1 / 24, "d": 1.0, "w": 7.0}


def duration_days(text: str) -> float:
    """A positive duration in days: a plain number is days; 12h, 30d and 2w give their unit."""
    value = text.strip().lower()
    unit = value[-1:] if value[-1:] in _DAYS_PER_UNIT else "d"
    number = value[:-1] if value[-1:] in _DAYS_PER_UNIT else value
    try:
        days = float(number) * _DAYS_PER_UNIT[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected days or a number with h, d or w, got {text!r}") from None
    if not (math.isfinite(days) and days > 0):
        raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}")
    return days


def positive_int(text: str) -> int:
    return whole(text, 1)


def shard(text: str) -> int | str:
    return "auto" if text == "auto" else non_negative_int(text)


def non_negative_int(text: str) -> int:
    return whole(text, 0)


def at_most(limit: int) -> Callable[[str], int]:
    """A whole number in 1..limit (the server's bound), checked before any request."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be <= {limit}, got {value}")
        return value

    return parse


def number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def sigma(text: str) -> float:
    value = number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a noise multiplier must be >= 0, got {text!r}")
    return value


def epsilon(text: str) -> float:
    value = number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"epsilon must be > 0, got {text!r}")
    return value


def key_id(text: str) -> str:
    """A key's id (1-32 letters and digits), never the key: `vips_ID_SECRET` is refused, not split."""
    if not re.fullmatch(r"[A-Za-z0-9]{1,32}", text):
        raise argparse.ArgumentTypeError(
            "give the key's id (the part between `vips_` and the next `_` of the key, as list-keys shows "
            "it), not the key itself"
        )
    return text


def delta(text: str) -> float:
    value = number(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"delta must be in (0, 1), got {text!r}")
    return value


#: The sub-command table each verb module adds its parsers to.
Subparsers: TypeAlias = "argparse._SubParsersAction[Parser]"
