"""Bounded path and query parameters shared by the routes: every integer has an upper bound and every
name a pattern, so no input reaches the database as something it cannot hold (a 422 names the parameter).
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Path, Query

from control.schemas import INT_MAX
from privacy_wall.names import NAME_MAX_LENGTH, NAME_REGEX, NAME_RULE

DatasetNamePath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=NAME_MAX_LENGTH,
        pattern=NAME_REGEX,
        description=NAME_RULE,
        examples=["adult"],
    ),
]
DatasetNameQuery = Annotated[
    str | None,
    Query(min_length=1, max_length=NAME_MAX_LENGTH, pattern=NAME_REGEX, description="only this dataset's"),
]
#: Job ids are 32 hex digits; anything outside this looser shape is a 422, never a database error.
JOB_ID_MAX_LENGTH = 64
JOB_ID_REGEX = r"^[A-Za-z0-9_-]{1,64}$"
JOB_ID_RULE = "a job id (or a prefix of 8 or more of its characters) is 1-64 letters, digits, '_' or '-'"
JobIdPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=JOB_ID_MAX_LENGTH,
        pattern=JOB_ID_REGEX,
        description="the job id, or a prefix of 8 or more characters that starts exactly one job",
        examples=["3f2a9c0e"],
    ),
]
#: Key ids are 16 hex digits (control.store.keys) in a column of 32 characters.
KEY_ID_MAX_LENGTH = 32
KEY_ID_REGEX = r"^[A-Za-z0-9]{1,32}$"
KeyIdPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=KEY_ID_MAX_LENGTH,
        pattern=KEY_ID_REGEX,
        description="the key's id: the part between `vips_` and the next `_` of the key",
        examples=["0123456789abcdef"],
    ),
]

_JOB_ID = re.compile(JOB_ID_REGEX)


def is_job_id(text: str) -> bool:
    """Whether `text` has the shape of JobIdPath (for routes that take a raw str: the dashboard's)."""
    return _JOB_ID.fullmatch(text) is not None


#: A decimal integer as text: ASCII digits only ("²" and "①" pass str.isdigit, and int() refuses them).
_DIGITS = re.compile(r"[0-9]{1,10}")


def decimal_digits(text: str) -> int | None:
    """The integer `text` spells in ASCII digits if it is at most INT_MAX (what an integer column holds),
    or None (a sign, a space, a '_', another digit, or a larger number)."""
    if _DIGITS.fullmatch(text) is None:
        return None
    value = int(text)
    return value if value <= INT_MAX else None


#: A decimal number as text (1e-5, 0.5, 3): ASCII only, so float() never sees "４", "1_0" or "infinity".
_DECIMAL = re.compile(r"[+-]?(?:[0-9]{1,32}(?:\.[0-9]{0,32})?|\.[0-9]{1,32})(?:[eE][+-]?[0-9]{1,3})?")


def decimal_number(text: str) -> float | None:
    """The number `text` spells in ASCII decimal notation (surrounding spaces aside), or None."""
    text = text.strip()
    return float(text) if _DECIMAL.fullmatch(text) is not None else None


Offset = Annotated[int, Query(ge=0, le=INT_MAX, description="skip this many")]
