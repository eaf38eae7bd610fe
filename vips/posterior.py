"""The posterior document (docs/design.md section 6): what clients download and predict with.

{"model", "algorithm", "dataset", "job_id", "privacy": {"epsilon", "delta", "sigma", "iterations",
"batch_size", "sampling", "accountant"}, "natural_parameters", "sufficient_statistics",
"variational_parameters", plus what prediction needs (BLR: "mean", "covariance"; linear regression:
"mean", "covariance", "noise_variance"; LDA: "lambda",
"vocabulary"; SBN: "W", "b", "c" and the column names). BLR and linreg documents also name their feature
columns ("columns") and label ("label") since this was added; older ones do not (feature_columns is None).}
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from vips.models.base import Array

FORMAT_VERSION = 1
MODELS = ("blr", "linreg", "lda", "sbn")
ALGORITHMS = ("vips", "dpvi", "dpsep")


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


def _finite(value: Any) -> bool:
    """Whether every number in a JSON-like value is finite (a vector from numpy's tolist at C speed)."""
    if isinstance(value, float | np.floating):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(item) for item in value.values())
    if isinstance(value, list):
        try:
            return all(map(math.isfinite, value))  # a list of numbers
        except TypeError:  # nested lists, strings, None: item by item
            return all(_finite(item) for item in value)
    return True


def _plain(value: Any) -> Any:
    """orjson's fallback for numpy's scalars, which it does not take as they are."""
    if isinstance(value, float | np.floating):
        return float(value)
    if isinstance(value, int | np.integer):
        return int(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps_posterior(document: dict[str, Any]) -> bytes:
    """The document as JSON text in UTF-8, by orjson (LDA's 20 x 5,000 matrices in ~9 ms instead of json's
    ~150 ms, a tenth of a `vips fit --local` process); any JSON reader gets the document back, floats
    bit for bit. A number that is not finite is refused (ValueError), as json.dumps(allow_nan=False)
    does: orjson would write null."""
    if not _finite(document):
        raise ValueError("Out of range float values are not JSON compliant: a posterior holds finite numbers")
    return orjson.dumps(document, default=_plain)


def save_posterior(document: dict[str, Any], path: Path) -> None:
    """Write atomically: a partial file never replaces a good one."""
    text = dumps_posterior(document)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def load_posterior(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_bytes())
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
    """(mean, covariance) of the weights of a BLR (or linear regression) posterior, validated, for rows in
    the input's units (see data_norm)."""
    model = document.get("model", "blr")
    try:
        mean = np.asarray(document["mean"], dtype=np.float64)
        covariance = np.asarray(document["covariance"], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as exc:
        raise PosteriorError(f"a {model} posterior needs numeric 'mean' and 'covariance'") from exc
    d = mean.shape[0] if mean.ndim == 1 else -1
    if d < 1 or covariance.shape != (d, d):
        raise PosteriorError(
            f"{model} posterior: 'mean' must be a vector and 'covariance' a matching square matrix"
        )
    scale = data_norm(document)
    return mean / scale, covariance / (scale * scale)


def data_norm(document: dict[str, Any]) -> float:
    """The public bound the rows were divided by before the fit ("data_norm", 1 when absent): 'mean' and
    'covariance' apply to rows / data_norm, so blr_parameters divides them by it for the input's units."""
    value = document.get("data_norm", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise PosteriorError("a posterior's 'data_norm' must be a finite number > 0")
    return float(value)


def linreg_parameters(document: dict[str, Any]) -> tuple[Array, Array, float]:
    """(mean, covariance, noise_variance) of a linear regression posterior, validated."""
    mean, covariance = blr_parameters(document)
    try:
        noise_variance = float(document["noise_variance"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PosteriorError("a linreg posterior needs a numeric 'noise_variance'") from exc
    if not (noise_variance > 0 and math.isfinite(noise_variance)):
        raise PosteriorError("linreg posterior: 'noise_variance' must be a finite number > 0")
    return mean, covariance, noise_variance


def _matrix(document: dict[str, Any], key: str, model: str, ndim: int) -> Array:
    try:
        value = np.asarray(document[key], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as exc:
        raise PosteriorError(f"a {model} posterior needs a numeric {key!r}") from exc
    if value.ndim != ndim or 0 in value.shape or not np.isfinite(value).all():
        raise PosteriorError(f"{model} posterior: {key!r} must be a finite non-empty {ndim}-d array")
    return value


def _names(document: dict[str, Any], key: str, count: int, model: str) -> tuple[str, ...] | None:
    names = document.get(key)
    if names is None:
        return None
    if not isinstance(names, list) or len(names) != count or not all(isinstance(n, str) for n in names):
        raise PosteriorError(f"{model} posterior: {key!r} must be a list of {count} strings")
    return tuple(names)


def feature_columns(document: dict[str, Any], dimension: int) -> tuple[str, ...] | None:
    """The names of a blr/linreg/sbn posterior's `dimension` feature columns, in order; None for a document
    written before columns were kept (its inputs are then matched by position)."""
    model = str(document.get("model", "blr"))
    return _names(document, "columns", dimension, model)


def label_column(document: dict[str, Any]) -> str | None:
    """The name of the label (or target) column the posterior was fitted with, if the document keeps it."""
    label = document.get("label")
    if label is not None and not isinstance(label, str):
        raise PosteriorError(f"{document.get('model')} posterior: 'label' must be a string")
    return label


@dataclass(frozen=True)
class LdaPosterior:
    """q(beta) = prod_k Dirichlet(lam_k), the document-topic prior alpha, the vocabulary (if any) and the
    private unigram the fit fell back to (if it had the unigram block)."""

    lam: Array
    alpha: float
    vocabulary: tuple[str, ...] | None
    private_unigram: Array | None = None


def lda_parameters(document: dict[str, Any]) -> LdaPosterior:
    lam = _matrix(document, "lambda", "lda", 2)
    if (lam <= 0).any():
        raise PosteriorError("lda posterior: 'lambda' must be positive")
    try:
        alpha = float(document["variational_parameters"]["alpha"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PosteriorError("an lda posterior needs variational_parameters.alpha") from exc
    if not (alpha > 0 and math.isfinite(alpha)):
        raise PosteriorError("lda posterior: alpha must be a finite number > 0")
    unigram = None
    if document.get("private_unigram") is not None:
        unigram = _matrix(document, "private_unigram", "lda", 1)
        if unigram.shape != (lam.shape[1],) or (unigram <= 0).any() or abs(float(unigram.sum()) - 1.0) > 1e-6:
            raise PosteriorError("lda posterior: 'private_unigram' must be V positive numbers summing to 1")
    return LdaPosterior(lam, alpha, _names(document, "vocabulary", lam.shape[1], "lda"), unigram)


@dataclass(frozen=True)
class SbnPosterior:
    """Posterior means of the SBN's weights W (J x K), hidden biases b (K) and visible biases c (J)."""

    W: Array
    b: Array
    c: Array
    columns: tuple[str, ...] | None


def sbn_parameters(document: dict[str, Any]) -> SbnPosterior:
    W = _matrix(document, "W", "sbn", 2)
    b = _matrix(document, "b", "sbn", 1)
    c = _matrix(document, "c", "sbn", 1)
    visible, hidden = W.shape
    if b.shape != (hidden,) or c.shape != (visible,):
        raise PosteriorError("sbn posterior: W is J x K, b has K entries and c has J")
    return SbnPosterior(W, b, c, _names(document, "columns", visible, "sbn"))
