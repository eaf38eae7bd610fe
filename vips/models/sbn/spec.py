"""The sigmoid belief network's facts (vips.models.spec): binary images (rows of 0/1 pixels), fitted by
VIPS. The upper bounds keep one job's memory reasonable: the SBN holds J (K+1) x (K+1) covariances."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from vips.models.spec import ModelSpec, OptionSpec, Rule, whole

#: The default number of hidden units (the paper's K = 50), which planning reads too (its memory, its
#: rule's scale; the model reads it from here).
DEFAULTS = {"hidden": 50}


def statistic_size(options: Mapping[str, float], dimension: int) -> int:
    """The entries of the SBN's J x K pixel-unit statistics (the weights' drive s6, Delta sqrt(J K) /
    (2 S): privacy_wall/queries/sbn.py), whose signal to noise its rule reads."""
    return int(options.get("hidden", DEFAULTS["hidden"])) * dimension


#: The schedule rule of each algorithm (control.planning.schedules; docs/schedules.md has the table each
#: was read off).
RULES: dict[str, Rule] = {
    # Small scales: no unit learns reliably, so the fit is the pixel means and the release weights them (8
    # copies); up to 25,000 single fits of the units spread around the pixel means (held-out NLL 345.1-347.8
    # at 20,000 against the fallback's 346.7, 10 fits), from 25,000 all beat them (340.8-345.2). Above: one
    # release from weights spread wide enough (init_scale 3) that units switch on, then T 3, and T 10 once
    # the noise is small. Read at 28 x 28 digits (J 784 pixels) and K 50 units: the noise on each entry of the
    # weights' drive grows as sqrt(J K), so a job's epsilon x N is read times sqrt(39,200 / (J K))
    # (docs/schedules.md, "VIPS-SBN").
    "vips": Rule(
        iterations=((25_000.0, 3), (100_000.0, 1), (400_000.0, 3), (math.inf, 10)),
        options=(
            (25_000.0, {"frequency_copies": 8}),
            (math.inf, {"frequency_copies": 1, "init_scale": 3.0}),
        ),
        source="the SBN's epsilon curve on 28 x 28 digits (bench/sbn.py --images), by held-out NLL",
        expect=((25_000.0, "about the pixel means: no hidden unit learns reliably at this scale"),),
        reference_size=784 * 50,
        size_exponent=0.5,
    ),
}


def public_extra(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The pixels' column names."""
    return {"columns": list(schema["columns"])} if "columns" in schema else {}


SPEC = ModelSpec(
    name="sbn",
    kind="binary",
    title="a sigmoid belief network",
    # frequency_copies: the copies of the pixel frequencies in each release (privacy_wall.queries.sbn);
    # init_scale: the spread of the initial weights (vips.models.sbn.model; public, it shapes only the start).
    options={
        "hidden": whole(1, 500),
        "frequency_copies": whole(1, 64),
        "init_scale": OptionSpec(lambda v: 0 <= v <= 100, "must be in [0, 100]"),
    },
    defaults=DEFAULTS,
    aliases=("sigmoid",),
    rules=RULES,
    statistic_size=statistic_size,
    public_extra=public_extra,
)
