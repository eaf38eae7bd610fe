"""Bayesian logistic regression's facts (vips.models.spec): binary labels on tabular rows, fitted by VIPS,
DPVI and DP-SEP."""

from __future__ import annotations

from vips.models.spec import DPSEP_OPTIONS, SCALE, SWITCH, ModelSpec, OptionSpec, whole

#: DPVI's defaults, which the dashboard's convergence replay reads too (vips.models.blr.dpvi's fields take
#: them from here; the learning rate's reason is there).
DPVI_DEFAULTS = {"prior_variance": 1.0, "learning_rate": 0.5}

SPEC = ModelSpec(
    name="blr",
    kind="tabular",
    title="logistic regression",
    # noise_aware 1 (default): the M-step that accounts for s1's noise; 0: the paper's Eq. 53-55.
    # laplace_from k: releases k, k + 1, ... are Laplace-mode (Newton) releases at q's mean
    # (vips.models.blr.model); 0: the Polya-Gamma E-step throughout (the paper's). pool_from k: the first
    # Laplace release whose curvature is pooled (0: laplace_from). gradient_bound A: the wall's per-record
    # bound on s1 (privacy_wall.queries.blr; 1/2, the default, clips nothing).
    options={
        "a0": SCALE,
        "b0": SCALE,
        "noise_aware": SWITCH,
        "laplace_from": whole(0, 1_000_000),
        "pool_from": whole(0, 1_000_000),
        "gradient_bound": OptionSpec(lambda v: 0.001 <= v <= 0.5, "must be in [0.001, 0.5]"),
    },
    algorithms={
        "dpvi": {
            "clip": SCALE,
            "learning_rate": SCALE,
            "draws": whole(1, 100),
            "prior_variance": SCALE,
            # noise_aware 1 (default): the posterior from the iterates' trace (vips.models.blr.dpvi); 0: q_T.
            "noise_aware": SWITCH,
        },
        # noise_aware 1 (default): centred releases and the noise-aware Newton step (vips.models.dpsep);
        # 0: the paper's damped site average.
        "dpsep": {**DPSEP_OPTIONS, "noise_aware": SWITCH},
    },
    algorithm_defaults={"dpvi": DPVI_DEFAULTS},
    aliases=("logreg", "logistic", "logit", "lr", "logisticregression"),
)
