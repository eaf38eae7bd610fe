"""Which public half and wall query a logistic regression job runs, by algorithm (vips.models.registry
calls `setup`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vips.models.base import ModelSetup, model_options


def intercept_column(columns: Sequence[str] | None) -> int:
    """The column VIPS-BLR's intercept step treats as the intercept: the first one named "intercept" (as
    `vips scale` and PublicBoundsScaler name the column of 1s they add), or "<step>__intercept" (the name a
    scikit-learn ColumnTransformer gives it), else column 0, where they put it; the step itself checks that
    the column carries the features' means (vips.models.blr.model)."""
    names = [] if columns is None else [str(name) for name in columns]
    found = [j for j, name in enumerate(names) if name == "intercept" or name.endswith("__intercept")]
    return found[0] if found else 0


def setup(
    options: Mapping[str, float],
    *,
    algorithm: str,
    vocabulary: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
) -> ModelSetup:
    """VIPS's, DPVI's or DP-SEP's public half and query; `columns` for the intercept step
    (`intercept_column`)."""
    given: dict[str, Any] = model_options(options)
    if algorithm == "dpvi":
        from vips.models.blr.dpvi import DpviLogisticRegression

        if "draws" in given:
            given["draws"] = int(given["draws"])
        if "noise_aware" in given:
            given["noise_aware"] = bool(given["noise_aware"])
        dpvi = DpviLogisticRegression(**given)
        return ModelSetup(dpvi, dpvi.query())
    if algorithm == "dpsep":
        from vips.models.blr.dpsep import DpSepLogisticRegression

        if "noise_aware" in given:
            given["noise_aware"] = bool(given["noise_aware"])
        dpsep = DpSepLogisticRegression(**given, intercept=intercept_column(columns))
        return ModelSetup(dpsep, dpsep.query())
    from privacy_wall.queries.blr import S1_BOUND, LogisticRegressionQuery
    from vips.models.blr.model import BayesianLogisticRegression

    if "noise_aware" in given:
        given["noise_aware"] = bool(given["noise_aware"])
    for whole in ("laplace_from", "pool_from"):
        if whole in given:
            given[whole] = int(given[whole])
    query = LogisticRegressionQuery(float(given.pop("gradient_bound", S1_BOUND)))
    blr = BayesianLogisticRegression(**given, intercept=intercept_column(columns))
    return ModelSetup(blr, query)
