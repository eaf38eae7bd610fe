"""What a posterior's credible intervals were tested to cover, for the job page (issue 51).

Measured by bench/calibration.py on synthetic datasets of known weights (d 10, N 10,000) with nominal 90%
marginal intervals, each algorithm given only epsilon (its rule's schedule) or sigma 0, on the tuning seeds
and the unseen seeds from 1000; docs/calibration.md has the tables. VIPS's and DP-SEP's logistic lines are
of posteriors widened along their last step (vips.models.blr.model, "The last step"): the job page gives no
line for one stored without it (service.ui.routes). A job's line is the one for its scale, read as its rule
reads it (control.planning.schedules.job_scale: epsilon x N x sqrt(10 / d) for VIPS's and DP-SEP's logistic
regression, epsilon x N otherwise). Update these lines with that file when an algorithm's posterior
changes (the lines are each model's facts: TESTED and PAPER_MODE in vips/models/<model>/spec.py).

The weights are drawn N(0, 3^2); below epsilon x N (x sqrt(10 / d)) 2,000 a posterior is mostly its prior,
N(0, 1) by default, so the small bands also give what weights of the prior's size (sd 1) measured (`python
-m bench.calibration --weight-sd 1`): the intervals hold those and shrink larger ones towards 0."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from vips.models.catalog import MODELS
from vips.models.spec import Tested

__all__ = ["PAPER_MODE", "TESTED", "Tested", "interval_note", "tested_lines"]


#: The lines of every (model, algorithm) with measured intervals, from the models' facts
#: (vips.models.<model>.spec, TESTED), and of the paper modes a job selects with noise_aware 0 (PAPER_MODE).
TESTED: dict[tuple[str, str], Tested] = {
    (name, algorithm): lines for name, spec in MODELS.items() for algorithm, lines in spec.tested.items()
}
PAPER_MODE: dict[tuple[str, str], Tested] = {
    (name, algorithm): lines for name, spec in MODELS.items() for algorithm, lines in spec.paper_mode.items()
}


def tested_lines(model: str, algorithm: str, options: Mapping[str, Any] | None = None) -> Tested | None:
    """The lines measured for intervals of this kind: TESTED's, or PAPER_MODE's for a job whose options
    give noise_aware 0 (the paper's mode); None where none were measured."""
    paper = (options or {}).get("noise_aware", 1) == 0
    return (PAPER_MODE if paper else TESTED).get((model, algorithm))


def interval_note(
    model: str,
    algorithm: str,
    private: bool,
    options: Mapping[str, Any] | None = None,
    scale: float = math.inf,
) -> str | None:
    """One sentence on how often intervals of this kind held the true weights in tests; None if untested
    (a paper mode without a PAPER_MODE line among them). `options`: the job's, whose noise_aware 0 picks
    the paper's mode; `scale`: the job's (control.planning.schedules.job_scale), which picks the band."""
    found = tested_lines(model, algorithm, options)
    if found is None:
        return None
    paper = found is PAPER_MODE.get((model, algorithm))
    words, at_epsilon, caution = found.band(scale)
    measured = (
        f"covered {at_epsilon} of the true weights given only epsilon, at {words}"
        if private
        else f"covered {found.at_zero} of the true weights at sigma 0"
    )
    mode = " (the paper's mode, noise_aware=0)" if paper else ""
    return (
        f"Tested on data of known weights (docs/calibration.md), nominal 90% intervals of {model} by "
        f"{algorithm}{mode} {measured}" + (f": {caution}." if caution and private else ".")
    )
