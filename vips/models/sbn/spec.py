"""The sigmoid belief network's facts (vips.models.spec): binary images (rows of 0/1 pixels), fitted by
VIPS. The upper bounds keep one job's memory reasonable: the SBN holds J (K+1) x (K+1) covariances."""

from __future__ import annotations

from vips.models.spec import ModelSpec, OptionSpec, whole

#: The default number of hidden units (the paper's K = 50), which planning reads too (its memory, its
#: rule's scale; the model reads it from here).
DEFAULTS = {"hidden": 50}

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
)
