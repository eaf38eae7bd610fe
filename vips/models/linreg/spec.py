"""Bayesian linear regression's facts (vips.models.spec): real targets in [-1, 1] on tabular rows, fitted
by VIPS and DP-SEP."""

from __future__ import annotations

from vips.models.spec import DPSEP_OPTIONS, SCALE, SWITCH, ModelSpec

SPEC = ModelSpec(
    name="linreg",
    kind="regression",
    title="linear regression",
    options={"prior_precision": SCALE, "a0": SCALE, "b0": SCALE},
    algorithms={
        # noise_aware 1 (default): Normal-Gamma, the noise variance learned and the release noise propagated
        # (vips.models.dpsep); 0: the paper's known noise_variance (1 unless given).
        "dpsep": {**DPSEP_OPTIONS, "noise_variance": SCALE, "noise_aware": SWITCH},
    },
    aliases=("linearregression", "linear", "ols"),
)
