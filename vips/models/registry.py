"""Which public half and which wall query a job runs, from its model, algorithm and options
(docs/design.md sections 5-6).

One place maps (model, algorithm, options) to (VipsModel, Query), for the worker's jobs, the in-process
estimators and `vips fit --local` alike: each model's folder has its `setup` (vips.models.<model>.setup),
imported when a job of that model is set up, so a process that fits LDA (`vips fit --local`) does not load
the SBN, DPVI or DP-SEP code. The rules on options live in the models' facts (vips.models.<model>.spec; the
API checks them first through control.planning.options).
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import import_module
from typing import Any

from control.planning.options import MODEL_KINDS, algorithm_problem, option_problem, schedule_problem
from vips.models.base import ModelSetup
from vips.models.catalog import MODELS

__all__ = ["ModelOptionError", "ModelSetup", "check_model_options", "model_setup", "public_schema_extra"]


class ModelOptionError(ValueError):
    """Options that are not valid for the model (the message names the option)."""


def check_model_options(model: str, options: dict[str, float], sigma: float, algorithm: str = "vips") -> None:
    """Raise ModelOptionError naming the first invalid option (the API checks the same rules first)."""
    if model not in MODEL_KINDS:
        raise ModelOptionError(f"unknown model {model!r}; expected one of {', '.join(MODEL_KINDS)}")
    pairing = algorithm_problem(model, algorithm)
    if pairing is not None:
        raise ModelOptionError(pairing)
    for name, value in options.items():
        problem = option_problem(model, name, float(value), algorithm)
        if problem is not None:
            raise ModelOptionError(problem)
    conflict = schedule_problem(model, options, sigma)
    if conflict is not None:
        raise ModelOptionError(conflict[1])


def model_setup(
    model: str,
    options: dict[str, float],
    *,
    sigma: float,
    algorithm: str = "vips",
    vocabulary: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
) -> ModelSetup:
    """The model and query a job of `model` fitted by `algorithm` with `options` runs (step-size options
    tau0, kappa are the VIPS loop's, not the model's): the options checked, then the model folder's
    `setup` (vips.models.<model>.setup, loaded only for a job of that model). `vocabulary`: an LDA
    dataset's public word list, for the unigram fallback's public prior (option word_prior). `columns`: a
    tabular dataset's public feature names, for VIPS-BLR's intercept step."""
    check_model_options(model, options, sigma, algorithm)
    folder = import_module(f"vips.models.{model}.setup")
    found: ModelSetup = folder.setup(options, algorithm=algorithm, vocabulary=vocabulary, columns=columns)
    return found


def public_schema_extra(model: str, schema: dict[str, Any]) -> dict[str, Any]:
    """What a posterior carries from the dataset's public schema so that clients can use it on their own
    files (the model's spec's `public_extra`: LDA the vocabulary, SBN the column names, BLR and linreg the
    feature columns' names and the label's, by which inputs are matched; docs/posterior-format.md)."""
    spec = MODELS.get(model)
    extra = spec.public_extra if spec is not None else None
    return {} if extra is None else extra(schema)
