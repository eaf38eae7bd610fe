"""Privacy events: what the ledger records of each release (docs/design.md section 2): a Gaussian
mechanism with noise multiplier sigma on S of N records drawn uniformly without replacement, under
replace-one neighbours, alone or repeated; and their JSON form, stored with each ledger entry.
Accountants price them (privacy_wall.accounting.accountants).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any


class Neighbouring(enum.Enum):
    """Which datasets count as neighbours."""

    REPLACE_ONE = "replace_one"


class Sampling(enum.Enum):
    """How a minibatch is drawn."""

    WITHOUT_REPLACEMENT = "without_replacement"


@dataclass(frozen=True)
class SubsampledGaussianEvent:
    """One Gaussian release (noise multiplier sigma on a sensitivity-1 query) on S of N records."""

    noise_multiplier: float
    sample_size: int
    population: int
    sampling: Sampling = Sampling.WITHOUT_REPLACEMENT
    neighbouring: Neighbouring = Neighbouring.REPLACE_ONE

    def __post_init__(self) -> None:
        if not (self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier)):
            raise ValueError("noise_multiplier must be a finite number >= 0")
        if self.population < 1:
            raise ValueError("population must be >= 1")
        if not 0 <= self.sample_size <= self.population:
            raise ValueError("sample_size must be between 0 and population")

    @property
    def sampling_rate(self) -> float:
        return self.sample_size / self.population


@dataclass(frozen=True)
class SelfComposedEvent:
    """The same event repeated `count` times (adaptive composition)."""

    event: SubsampledGaussianEvent
    count: int

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError("count must be >= 0")


Event = SubsampledGaussianEvent | SelfComposedEvent


def event_to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready description of an event (stored with each ledger entry)."""
    if isinstance(event, SelfComposedEvent):
        return {"type": "self_composed", "count": event.count, "event": event_to_dict(event.event)}
    return {
        "type": "subsampled_gaussian",
        "noise_multiplier": event.noise_multiplier,
        "sample_size": event.sample_size,
        "population": event.population,
        "sampling": event.sampling.value,
        "neighbouring": event.neighbouring.value,
    }


def event_from_dict(payload: dict[str, Any]) -> Event:
    """Inverse of event_to_dict through a closed set of event types."""
    kind = payload.get("type")
    if kind == "self_composed":
        inner = event_from_dict(payload["event"])
        if not isinstance(inner, SubsampledGaussianEvent):
            raise ValueError("nested self-composition is not supported")
        return SelfComposedEvent(inner, int(payload["count"]))
    if kind == "subsampled_gaussian":
        return SubsampledGaussianEvent(
            noise_multiplier=float(payload["noise_multiplier"]),
            sample_size=int(payload["sample_size"]),
            population=int(payload["population"]),
            sampling=Sampling(payload["sampling"]),
            neighbouring=Neighbouring(payload["neighbouring"]),
        )
    raise ValueError(f"unknown event type {kind!r}")


def vips_job_event(sigma: float, sample_size: int, population: int, iterations: int) -> SelfComposedEvent:
    """The event of a T-iteration job: T subsampled Gaussian releases with multiplier sigma."""
    return SelfComposedEvent(SubsampledGaussianEvent(sigma, sample_size, population), iterations)
