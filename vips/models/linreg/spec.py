"""Bayesian linear regression's facts (vips.models.spec): real targets in [-1, 1] on tabular rows, fitted
by VIPS and DP-SEP."""

from __future__ import annotations

import math
from collections.abc import Mapping

from vips.models.blr.spec import dpsep_footprint
from vips.models.blr.spec import public_extra as tabular_public_extra  # the feature and label names
from vips.models.spec import (
    DPSEP_OPTIONS,
    SCALE,
    SWITCH,
    Footprint,
    FootprintRule,
    ModelSpec,
    Rule,
    Tested,
    chunk_rows,
)

#: The schedule rule of each algorithm (control.planning.schedules; docs/schedules.md has the table each
#: was read off).
RULES: dict[str, Rule] = {
    "vips": Rule(iterations=((math.inf, 5),), source="the regression section of bench/compare_algorithms.py"),
    # The noise-aware mode's clip of each record's site P(z z^T) (vips.models.linreg.dpsep): 0.7 against 0.5,
    # 1 and sqrt(3) (nothing clipped) on 30 synthetic datasets at epsilon 0.3 / 1 / 3 (N 10,000), the lowest
    # held-out negative log density or within 0.001 of it at each, with coverage 0.89-0.93 (0.5: 0.81 at
    # epsilon 3; sqrt(3): 0.09 worse at 0.3); docs/schedules.md, "DP-SEP linear regression: the clip".
    "dpsep": Rule(
        iterations=((math.inf, 5),),
        options=((math.inf, {"clip": 0.7}),),
        source="the regression section of bench/compare_algorithms.py; the clip by held-out log density "
        "and coverage on synthetic data (bench/calibration.py)",
        other_modes={"noise_aware": 0},  # the paper's model keeps its clip, the bound of its own sites
    ),
}

#: What the intervals were tested to cover (control.planning.coverage, docs/calibration.md).
TESTED: dict[str, Tested] = {
    "vips": Tested(
        ((2_000.0, "epsilon x N up to 2,000", "95-99%", ""), (math.inf, "epsilon 0.3-3", "86-93%", "")),
        "91%",
    ),
    "dpsep": Tested(
        ((2_000.0, "epsilon x N up to 2,000", "91-96%", ""), (math.inf, "epsilon 0.3-3", "87-93%", "")),
        "90%",
    ),
}
#: The same for a DP-SEP job that gives noise_aware 0 (the paper's model).
PAPER_MODE: dict[str, Tested] = {
    "dpsep": Tested(
        (
            (
                math.inf,
                "epsilon 0.3-3",
                "65% at epsilon 0.3, 99-100% at 1-3",
                "the paper's model assumes a noise variance of 1 unless given, so its intervals are wide",
            ),
        ),
        "100%",
    ),
}


def conflict(options: Mapping[str, float], sigma: float) -> tuple[str, str] | None:
    """DP-SEP's noise_variance is the paper's known one; its noise-aware mode (the default) learns it: it is
    taken only with noise_aware 0 (noise_variance is an option of no other linear model)."""
    if "noise_variance" in options and options.get("noise_aware", 1) != 0:
        return (
            "noise_variance",
            "DP-SEP's noise-aware mode learns the noise variance: give it with noise_aware=0",
        )
    return None


def vips_footprint(d: int, s: int) -> Footprint:
    """Bayesian linear regression (chunks of C rows): the batch (S d) and its labels (S); per chunk, its
    finite-masked copy and the clipped copy (2 C d), the labels' masked and clipped copies, the row norms
    and clip factors (7 C); the (d + 1)^2 joint moment, its
    PSD projection and the state (10 (d + 1)^2). Release xx (d^2) + yx (d) + yy (1). Posterior: Lambda
    twice, the statistics' xx and the covariance (4 d^2), eta, yx and the mean twice (4 d), 8 scalars."""
    return Footprint(
        s * d + s + 2 * chunk_rows(d, s) * d + 7 * chunk_rows(d, s) + 10 * (d + 1) ** 2,
        d * d + d + 1,
        4 * d * d + 4 * d + 8,
        ("batch_size",),
        f"{d} features",
    )


#: Each algorithm's footprint from (options, d, S).
FOOTPRINTS: dict[str, FootprintRule] = {
    "vips": lambda options, d, s: vips_footprint(d, s),
    "dpsep": lambda options, d, s: dpsep_footprint(d, s, logistic=False),
}


SPEC = ModelSpec(
    name="linreg",
    kind="regression",
    title="linear regression",
    options={"prior_precision": SCALE, "a0": SCALE, "b0": SCALE},
    algorithms={
        # noise_aware 1 (default): Normal-Gamma, the noise variance learned and the release noise propagated
        # (vips.models.linreg.dpsep); 0: the paper's known noise_variance (1 unless given).
        "dpsep": {**DPSEP_OPTIONS, "noise_variance": SCALE, "noise_aware": SWITCH},
    },
    aliases=("linearregression", "linear", "ols"),
    rules=RULES,
    tested=TESTED,
    paper_mode=PAPER_MODE,
    conflict=conflict,
    public_extra=tabular_public_extra,
    footprints=FOOTPRINTS,
)
