"""Timestamps of the control database: every one is written in UTC."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload


@overload
def aware(moment: datetime) -> datetime: ...
@overload
def aware(moment: None) -> None: ...
@overload
def aware(moment: datetime | None) -> datetime | None: ...
def aware(moment: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; every timestamp of the control database is written in UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)
