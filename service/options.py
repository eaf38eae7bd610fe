"""Model options a job may set (DESIGN section 6), shared by the API's validation and the CLI."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class OptionSpec:
    """A numeric option: its check and how the check reads in an error message."""

    check: Callable[[float], bool]
    requirement: str


_NON_NEGATIVE = OptionSpec(lambda v: v >= 0, "must be >= 0")
_POSITIVE = OptionSpec(lambda v: v > 0, "must be > 0")
_UNIT_INTERVAL = OptionSpec(lambda v: 0 <= v <= 1, "must be in [0, 1]")

#: Options every model takes (the step-size schedule rho_t = (tau0 + t)^-kappa).
COMMON_OPTIONS: dict[str, OptionSpec] = {"tau0": _NON_NEGATIVE, "kappa": _UNIT_INTERVAL}
#: Options of each model that runs (DESIGN section 6 lists those still to come).
MODEL_OPTIONS: dict[str, dict[str, OptionSpec]] = {"blr": {"a0": _POSITIVE, "b0": _POSITIVE}}


def option_specs(model: str) -> dict[str, OptionSpec]:
    return {**COMMON_OPTIONS, **MODEL_OPTIONS.get(model, {})}


def option_problem(model: str, name: str, value: float) -> str | None:
    """Why `name=value` is not a valid option of `model`, or None when it is."""
    specs = option_specs(model)
    spec = specs.get(name)
    if spec is None:
        return f"unknown option {name!r} for model {model}; valid: {', '.join(sorted(specs))}"
    if not (math.isfinite(value) and spec.check(value)):
        return f"option {name!r} {spec.requirement}"
    return None
