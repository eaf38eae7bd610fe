"""The noise multipliers the service calibrates to and admits. Imports nothing, so the API's schemas and the
CLI can check a given sigma without loading the accountants."""

from __future__ import annotations

#: The smallest sigma > 0 a job may run at, given or calibrated (below it the noise is negligible and the
#: epsilon astronomical: a quote could admit what its own largest_epsilon, found over sigma >= SIGMA_MIN,
#: says does not fit; issue 52). 0 is separate: public data only.
SIGMA_MIN = 1e-3
#: The largest sigma calibration searches up to.
SIGMA_MAX = 1e4


def sigma_problem(sigma: float) -> str | None:
    """Why a given sigma cannot be run, or None: it must be 0 (public data) or at least SIGMA_MIN (a larger
    sigma than calibration searches is allowed: its epsilon is merely near 0; the gate checks its grid)."""
    if sigma == 0 or sigma >= SIGMA_MIN:
        return None
    return (
        f"sigma must be 0 (public data only) or at least {SIGMA_MIN:g}, not {sigma:g}: below {SIGMA_MIN:g} "
        "the noise is negligible and the epsilon astronomical"
    )
