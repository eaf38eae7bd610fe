"""What a posterior's credible intervals were tested to cover, for the job page (issue 51).

Measured by bench/calibration.py on 20 (DP-SEP: 100) synthetic datasets of known weights (d 10,
N 10,000) with nominal 90% marginal intervals, each algorithm given only epsilon 0.3, 1 and 3, or sigma 0
(the ranges span the tuning seeds and the unseen seeds from 1000); docs/calibration.md has the tables.
Update these lines with that file when an algorithm's posterior changes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: (model, algorithm) -> (coverage of private fits at epsilon 0.3-3, at sigma 0, a caution for private fits
#: or "").
TESTED: dict[tuple[str, str], tuple[str, str, str]] = {
    ("blr", "vips"): ("83-87%", "90-92%", ""),
    ("blr", "dpvi"): ("82-97% (88-97% from epsilon 1)", "86-91%", ""),
    ("blr", "dpsep"): (
        "80-88%",
        "89-90%",
        "below epsilon x N x sqrt(10 / d) = 2,000 (two or three releases) they covered 64-80%, the means "
        "shrunk towards 0",
    ),
    ("linreg", "vips"): ("86-93%", "91%", ""),
    ("linreg", "dpsep"): ("87-93%", "90%", ""),
}
#: The same for a DP-SEP job that gives noise_aware 0 (the paper's update).
PAPER_MODE: dict[tuple[str, str], tuple[str, str, str]] = {
    ("blr", "dpsep"): (
        "18-56%",
        "80-84%",
        "the paper's update reads its released site as exact, so its intervals leave out the release noise "
        "(read them as far too narrow)",
    ),
    ("linreg", "dpsep"): (
        "65% at epsilon 0.3, 99-100% at 1-3",
        "100%",
        "the paper's model assumes a noise variance of 1 unless given, so its intervals are wide",
    ),
}


def interval_note(
    model: str, algorithm: str, private: bool, options: Mapping[str, Any] | None = None
) -> str | None:
    """One sentence on how often intervals of this kind held the true weights in tests; None if untested.
    `options`: the job's, whose noise_aware 0 picks the paper's mode."""
    paper = (options or {}).get("noise_aware", 1) == 0
    found = (PAPER_MODE if paper else TESTED).get((model, algorithm)) or TESTED.get((model, algorithm))
    if found is None:
        return None
    at_epsilon, at_zero, caution = found
    measured = (
        f"covered {at_epsilon} of the true weights given only epsilon 0.3-3"
        if private
        else f"covered {at_zero} of the true weights at sigma 0"
    )
    mode = " (the paper's mode, noise_aware=0)" if paper and (model, algorithm) in PAPER_MODE else ""
    return (
        f"Tested on data of known weights (docs/calibration.md), nominal 90% intervals of {model} by "
        f"{algorithm}{mode} {measured}" + (f": {caution}." if caution and private else ".")
    )
