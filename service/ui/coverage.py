"""What a posterior's credible intervals were tested to cover, for the job page (issue 51).

Measured by bench/calibration.py on 20 (DP-SEP-BLR: 100) synthetic datasets of known weights (d 10,
N 10,000) with nominal 90% marginal intervals, each algorithm given only epsilon 0.3, 1 and 3, or sigma 0
(the ranges span the tuning seeds and the unseen seeds from 1000); docs/calibration.md has the tables.
Update these lines with that file when an algorithm's posterior changes."""

from __future__ import annotations

#: (model, algorithm) -> (coverage of private fits at epsilon 0.3-3, at sigma 0, a caution for private fits
#: or "").
TESTED: dict[tuple[str, str], tuple[str, str, str]] = {
    ("blr", "vips"): ("83-87%", "90-92%", ""),
    ("blr", "dpvi"): ("82-97% (88-97% from epsilon 1)", "86-91%", ""),
    ("blr", "dpsep"): (
        "80-88%",
        "89-90%",
        "below epsilon x N x sqrt(10 / d) = 2,000 the service takes the paper's update, whose intervals "
        "leave out the release noise (read them as far too narrow there)",
    ),
    ("linreg", "vips"): ("86-93%", "91%", ""),
    ("linreg", "dpsep"): (
        "65% at epsilon 0.3, 99-100% at 1-3",
        "100%",
        "it assumes a noise variance of 1, so its intervals are wide",
    ),
}


def interval_note(model: str, algorithm: str, private: bool) -> str | None:
    """One sentence on how often intervals of this kind held the true weights in tests; None if untested."""
    found = TESTED.get((model, algorithm))
    if found is None:
        return None
    at_epsilon, at_zero, caution = found
    measured = (
        f"covered {at_epsilon} of the true weights given only epsilon 0.3-3"
        if private
        else f"covered {at_zero} of the true weights at sigma 0"
    )
    return (
        f"Tested on data of known weights (docs/calibration.md), nominal 90% intervals of {model} by "
        f"{algorithm} {measured}" + (f": {caution}." if caution and private else ".")
    )
