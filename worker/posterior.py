"""The posterior document (DESIGN section 6): what clients download and predict with.

{"model", "algorithm", "dataset", "job_id", "privacy": {"epsilon", "delta", "sigma", "iterations",
"batch_size", "sampling", "accountant"}, "natural_parameters", "sufficient_statistics",
"variational_parameters", plus what prediction needs (BLR: "mean", "covariance").}
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.models.base import Array

FORMAT_VERSION = 1
MODELS = ("blr",)
ALGORITHMS = ("vips",)


class PosteriorError(ValueError):
    """A posterior document that cannot be used, with the reason."""


@dataclass(frozen=True)
class Privacy:
    """How a posterior was released: its total (epsilon, delta) and the schedule behind it."""

    epsilon: float
    delta: float
    sigma: float
    iterations: int
    batch_size: int
    population: int
    accountant: str
    sampling: str = "without_replacement"

    def as_json(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon if math.isfinite(self.epsilon) else None,
            "epsilon_is_infinite": not math.isfinite(self.epsilon),
            "delta": self.delta,
            "sigma": self.sigma,
            "iterations": self.iterations,
            "batch_size": self.batch_size,
            "population": self.population,
            "sampling": self.sampling,
            "neighbouring": "replace_one",
            "accountant": self.accountant,
        }


def build_posterior(
    *,
    model: str,
    algorithm: str,
    dataset: str,
    job_id: str,
    privacy: Privacy,
    parameters: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "model": model,
        "algorithm": algorithm,
        "dataset": dataset,
        "job_id": job_id,
        "privacy": privacy.as_json(),
    }
    document.update(parameters)
    document.update(extra or {})
    return document


def save_posterior(document: dict[str, Any], path: Path) -> None:
    """Write atomically: a partial file never replaces a good one."""
    text = json.dumps(document, allow_nan=False)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def load_posterior(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise PosteriorError(f"posterior file {path} does not exist") from exc
    except json.JSONDecodeError as exc:
        raise PosteriorError(f"posterior file {path} is not JSON: {exc.msg} at line {exc.lineno}") from exc
    if not isinstance(document, dict):
        raise PosteriorError("a posterior is a JSON object")
    model = document.get("model")
    if model not in MODELS:
        raise PosteriorError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")
    return document


def blr_parameters(document: dict[str, Any]) -> tuple[Array, Array]:
    """(mean, covariance) of a BLR posterior, validated."""
    try:
        mean = np.asarray(document["mean"], dtype=np.float64)
        covariance = np.asarray(document["covariance"], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as exc:
        raise PosteriorError("a blr posterior needs numeric 'mean' and 'covariance'") from exc
    d = mean.shape[0] if mean.ndim == 1 else -1
    if d < 1 or covariance.shape != (d, d):
        raise PosteriorError(
            "blr posterior: 'mean' must be a vector and 'covariance' a matching square matrix"
        )
    return mean, covariance
