"""Model options a job may set (docs/design.md section 6), shared by the API's validation and the CLI; the
options themselves are each model's facts (vips.models.<model>.spec, listed by vips.models.catalog)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from vips.models.catalog import ALGORITHM_MODELS, MODELS
from vips.models.spec import COMMON_OPTIONS, OptionSpec

__all__ = [
    "ALGORITHM_MODELS",
    "COMMON_OPTIONS",
    "DPVI_DEFAULTS",
    "MODEL_KINDS",
    "OptionSpec",
    "algorithm_problem",
    "option_problem",
    "option_specs",
    "option_summary",
    "schedule_problem",
    "typed_options",
]

#: DPVI-BLR's defaults that the dashboard's convergence replay reads, from BLR's spec.
DPVI_DEFAULTS: Mapping[str, float] = MODELS["blr"].algorithm_defaults["dpvi"]
#: The dataset kind each model fits.
MODEL_KINDS: dict[str, str] = {name: spec.kind for name, spec in MODELS.items()}


def option_summary() -> str:
    """Every option by model and algorithm in one line, for the CLI's help."""
    parts = [f"{', '.join(COMMON_OPTIONS)} for every model"]
    parts += [f"{', '.join(spec.options)} for {name}" for name, spec in MODELS.items()]
    parts += [
        f"{', '.join(options)} for {name} by {algorithm}"
        for name, spec in MODELS.items()
        for algorithm, options in spec.algorithms.items()
    ]
    return "; ".join(parts)


def algorithm_problem(model: str, algorithm: str) -> str | None:
    """Why `algorithm` cannot fit `model`, or None when it can."""
    models = ALGORITHM_MODELS.get(algorithm)
    if models is None:
        return f"algorithm {algorithm!r} is not available (available: {', '.join(ALGORITHM_MODELS)})"
    if model not in models:
        return f"algorithm {algorithm} fits model {' or '.join(models)}, not {model}"
    return None


def option_specs(model: str, algorithm: str = "vips") -> dict[str, OptionSpec]:
    """Every option a job of `model` fitted by `algorithm` may set (the common ones only for an unknown
    model)."""
    spec = MODELS.get(model)
    return spec.option_specs(algorithm) if spec is not None else dict(COMMON_OPTIONS)


def typed_options(model: str, options: dict[str, float], algorithm: str = "vips") -> dict[str, int | float]:
    """`options` with its whole-number ones as ints (`topics: 50`, not 50.0), the others as they are."""
    specs = option_specs(model, algorithm)
    return {
        name: int(value) if name in specs and specs[name].whole and value == int(value) else value
        for name, value in options.items()
    }


def option_problem(model: str, name: str, value: float, algorithm: str = "vips") -> str | None:
    """Why `name=value` is not a valid option of `model` fitted by `algorithm`, or None when it is."""
    specs = option_specs(model, algorithm)
    spec = specs.get(name)
    if spec is None:
        fitted = model if algorithm == "vips" else f"{model} with algorithm {algorithm}"
        return f"unknown option {name!r} for model {fitted}; valid: {', '.join(sorted(specs))}"
    if not (math.isfinite(value) and spec.check(value)):
        return f"option {name!r} {spec.requirement}"
    return None


def schedule_problem(model: str, options: dict[str, float], sigma: float) -> tuple[str, str] | None:
    """(option name, why) when valid options conflict with the job's sigma, or None: the model's own rule
    (its spec's `conflict`: LDA's doc_length 0 only without noise, DP-SEP's damping and noise_variance only
    with noise_aware 0)."""
    spec = MODELS.get(model)
    conflict = spec.conflict if spec is not None else None
    return None if conflict is None else conflict(options, sigma)
