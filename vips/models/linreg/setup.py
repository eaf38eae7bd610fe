"""Which public half and wall query a linear regression job runs, by algorithm (vips.models.registry
calls `setup`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vips.models.base import ModelSetup, model_options


def setup(
    options: Mapping[str, float],
    *,
    algorithm: str,
    vocabulary: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
) -> ModelSetup:
    """VIPS's or DP-SEP's public half and query."""
    given: dict[str, Any] = model_options(options)
    if algorithm == "dpsep":
        from vips.models.linreg.dpsep import DpSepLinearRegression

        if "noise_aware" in given:
            given["noise_aware"] = bool(given["noise_aware"])
        dpsep = DpSepLinearRegression(**given)
        return ModelSetup(dpsep, dpsep.query())
    from vips.models.linreg.model import BayesianLinearRegression

    linreg = BayesianLinearRegression(**given)
    return ModelSetup(linreg, linreg.query())
