"""Bounded path and query parameters shared by the routes: every integer has an upper bound and every
name a pattern, so no input reaches the database as something it cannot hold (a 422 names the parameter).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from privacy_wall.names import NAME_MAX_LENGTH, NAME_REGEX, NAME_RULE

#: The largest integer a request may carry: every integer column (SQLite and PostgreSQL) holds it.
INT_MAX = 2**31 - 1

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
JobIdPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="the job id, or a prefix of 8 or more characters that starts exactly one job",
        examples=["3f2a9c0e"],
    ),
]
Offset = Annotated[int, Query(ge=0, le=INT_MAX, description="skip this many")]
