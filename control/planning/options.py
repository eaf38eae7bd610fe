"""Model options a job may set (docs/design.md section 6), shared by the API's validation and the CLI."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class OptionSpec:
    """A numeric option: its check and how the check reads in an error message."""

    check: Callable[[float], bool]
    requirement: str
    whole: bool = False  # a count or a switch (topics, hidden, noise_aware): an int wherever it is shown


def _whole(low: int, high: int) -> OptionSpec:
    return OptionSpec(
        lambda v: v == int(v) and low <= v <= high, f"must be a whole number in [{low}, {high}]", whole=True
    )


def _between(low: float, high: float) -> OptionSpec:
    """A real option in [low, high]: finite bounds, so that no admitted value overflows or divides by zero
    in an update (issue 52: tau0 1e300 and unigram_clip 1e-300 were admitted, spent, then failed)."""
    return OptionSpec(lambda v: low <= v <= high, f"must be in [{low:g}, {high:g}]")


#: A scale (a prior's variance or precision, a Gamma parameter, a clip, a step size): from 1e-6 to 1e6,
#: twelve orders of magnitude around the unit scale every row is normalised to.
_SCALE = _between(1e-6, 1e6)
_NON_NEGATIVE = _between(0.0, 1e6)
_UNIT_INTERVAL = OptionSpec(lambda v: 0 <= v <= 1, "must be in [0, 1]")
_CLIP_FRACTION = OptionSpec(lambda v: 0 < v <= 1, "must be in (0, 1]")
_SHARE = OptionSpec(lambda v: 0 <= v < 1, "must be in [0, 1)")

#: LDA's defaults for its options that planning reads too (the worker's model setup reads them from here).
LDA_DEFAULTS = {"topics": 10, "doc_length": 500, "clip": 0.1}
#: DPVI-BLR's defaults that the dashboard's convergence replay reads too (vips.models.blr.dpvi's fields take
#: them from here; the learning rate's reason is there).
DPVI_DEFAULTS = {"prior_variance": 1.0, "learning_rate": 0.5}
#: The SBN's default number of hidden units, which planning reads too (its memory, its rule's scale; the
#: worker's model reads it from here).
SBN_DEFAULTS = {"hidden": 50}
#: The dataset kind each model fits.
MODEL_KINDS = {"blr": "tabular", "linreg": "regression", "lda": "bow", "sbn": "binary"}
#: Options every model takes (the step-size schedule rho_t = (tau0 + t)^-kappa).
COMMON_OPTIONS: dict[str, OptionSpec] = {"tau0": _between(0.0, 1e9), "kappa": _UNIT_INTERVAL}
#: Options of each model (docs/design.md section 6). The upper bounds keep one job's memory reasonable: LDA
#: holds K x V topic parameters and resamples S x N_w tokens; the SBN holds J (K+1) x (K+1) covariances.
MODEL_OPTIONS: dict[str, dict[str, OptionSpec]] = {
    # noise_aware 1 (default): the M-step that accounts for s1's noise; 0: the paper's Eq. 53-55.
    # laplace_from k: releases k, k + 1, ... are Laplace-mode (Newton) releases at q's mean
    # (vips.models.blr.model); 0: the Polya-Gamma E-step throughout (the paper's). pool_from k: the first
    # Laplace release whose curvature is pooled (0: laplace_from). gradient_bound A: the wall's per-record
    # bound on s1 (privacy_wall.queries.blr; 1/2, the default, clips nothing).
    "blr": {
        "a0": _SCALE,
        "b0": _SCALE,
        "noise_aware": _whole(0, 1),
        "laplace_from": _whole(0, 1_000_000),
        "pool_from": _whole(0, 1_000_000),
        "gradient_bound": OptionSpec(lambda v: 0.001 <= v <= 0.5, "must be in [0.001, 0.5]"),
    },
    "linreg": {"prior_precision": _SCALE, "a0": _SCALE, "b0": _SCALE},
    "lda": {
        "topics": _whole(1, 1000),
        "alpha": _SCALE,
        "eta": _SCALE,
        # The M-step's pull of the topics towards the corpus's word frequencies (vips.models.lda.model; 0: the
        # paper's M-step).
        "smoothing": _NON_NEGATIVE,
        "doc_length": _whole(0, 100_000),
        "clip": _CLIP_FRACTION,
        # The unigram fallback (privacy_wall.queries.lda): the release's share for the word frequencies
        # (0: topic statistics alone) and each document's clip for them.
        "unigram_share": _SHARE,
        "unigram_clip": _SCALE,
        # word_prior 1 (default): the fallback's unigram shrinks towards public English word frequencies
        # when the vocabulary is English (vips.models.lda.word_prior); 0: towards nothing but the release.
        "word_prior": _whole(0, 1),
    },
    # frequency_copies: the copies of the pixel frequencies in each release (privacy_wall.queries.sbn);
    # init_scale: the spread of the initial weights (vips.models.sbn.model; public, it shapes only the start).
    "sbn": {
        "hidden": _whole(1, 500),
        "frequency_copies": _whole(1, 64),
        "init_scale": OptionSpec(lambda v: 0 <= v <= 100, "must be in [0, 100]"),
    },
}
#: The models each algorithm fits (docs/design.md section 5: DPVI and DP-SEP are alternatives for regression).
ALGORITHM_MODELS: dict[str, tuple[str, ...]] = {
    "vips": ("blr", "linreg", "lda", "sbn"),
    "dpvi": ("blr",),
    "dpsep": ("blr", "linreg"),
}
_DPSEP_OPTIONS = {"clip": _SCALE, "damping": _CLIP_FRACTION, "prior_variance": _SCALE}
#: Options of the alternative algorithms, per model; they replace the VIPS model's own (e.g. a0, b0:
#: VIPS-BLR's prior on the weights' precision) with a fixed prior variance on the weights.
ALGORITHM_OPTIONS: dict[tuple[str, str], dict[str, OptionSpec]] = {
    ("dpvi", "blr"): {
        "clip": _SCALE,
        "learning_rate": _SCALE,
        "draws": _whole(1, 100),
        "prior_variance": _SCALE,
        # noise_aware 1 (default): the posterior from the iterates' trace (vips.models.blr.dpvi); 0: q_T.
        "noise_aware": _whole(0, 1),
    },
    # noise_aware 1 (default): centred releases and the noise-aware Newton step (vips.models.dpsep);
    # 0: the paper's damped site average.
    ("dpsep", "blr"): {**_DPSEP_OPTIONS, "noise_aware": _whole(0, 1)},
    # noise_aware 1 (default): Normal-Gamma, the noise variance learned and the release noise propagated
    # (vips.models.dpsep); 0: the paper's known noise_variance (1 unless given).
    ("dpsep", "linreg"): {**_DPSEP_OPTIONS, "noise_variance": _SCALE, "noise_aware": _whole(0, 1)},
}


def option_summary() -> str:
    """Every option by model and algorithm in one line, for the CLI's help."""
    parts = [f"{', '.join(COMMON_OPTIONS)} for every model"]
    parts += [f"{', '.join(specs)} for {model}" for model, specs in MODEL_OPTIONS.items()]
    parts += [
        f"{', '.join(specs)} for {model} by {algorithm}"
        for (algorithm, model), specs in ALGORITHM_OPTIONS.items()
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
    if algorithm == "vips":
        return {**COMMON_OPTIONS, **MODEL_OPTIONS.get(model, {})}
    return {**COMMON_OPTIONS, **ALGORITHM_OPTIONS.get((algorithm, model), {})}


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
    """(option name, why) when valid options conflict with the job's sigma, or None.

    LDA's doc_length 0 keeps documents as they are; their length then bounds each contribution, and a
    private dataset does not publish it, so it is allowed only without noise (docs/design.md section 6).
    DP-SEP-BLR's damping weighs the paper's damped site average, which its noise-aware mode (the default,
    and the rule's choice above its smallest scales) replaces by Newton steps: it is taken only with
    noise_aware 0 (damping is an option of no other logistic model). DP-SEP linear regression's
    noise_variance is the paper's known one; its noise-aware mode (the default) learns it: it is taken only
    with noise_aware 0 (noise_variance is an option of no other linear model).
    """
    if model == "lda" and options.get("doc_length") == 0 and sigma > 0:
        return "doc_length", "doc_length 0 (documents kept as they are) is only allowed with sigma 0"
    if model == "blr" and "damping" in options and options.get("noise_aware", 1) != 0:
        return "damping", "damping weighs DP-SEP's damped site average: give it with noise_aware=0"
    if model == "linreg" and "noise_variance" in options and options.get("noise_aware", 1) != 0:
        return (
            "noise_variance",
            "DP-SEP's noise-aware mode learns the noise variance: give it with noise_aware=0",
        )
    return None
