"""The sigmoid belief network's facts (vips.models.spec): binary images (rows of 0/1 pixels), fitted by
VIPS. The upper bounds keep one job's memory reasonable: the SBN holds J (K+1) x (K+1) covariances."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from vips.models.spec import Footprint, ModelSpec, OptionSpec, Rule, whole

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


#: privacy_wall.queries.sbn.CHUNK_ROWS and DEFAULT_FREQUENCY_COPIES, mirrored
#: (tests/control/planning/test_resources.py).
SBN_CHUNK_ROWS = 1024
SBN_DEFAULT_FREQUENCY_COPIES = 4


def sbn_footprint(j: int, s: int, hidden: int, frequency_copies: int = 1) -> Footprint:
    """SBN (J pixels, K hidden units; Q = (K + 1)^2, P = K (K + 1) / 2, chunks of C = min(S, 1024) rows):
    the J Q blocks, i.e. precision, covariance and running data precision of the state, E[w w^T], its
    symmetrised copy, the M-step's new average, its shrinkage target and residual, and the PSD projection
    (9 J Q); the packed J P arrays of the E-step and the gate (sums per chunk,
    means, noise: (3 + ceil(S / C)) J P); the last release's and the E-step's J K^2 (2 J K^2); per chunk
    C (2 K^2 + 2 P); the batch (3 S J). Release s1 (K), s3 (J, frequency_copies times), s4 (J), s5, s6
    (J K), s7 mirrored (J K^2). Posterior: three J Q matrices, four J (K + 1) blocks, the statistics, and
    vectors (6 K + 2 J)."""
    k = hidden
    q, p = (k + 1) ** 2, k * (k + 1) // 2
    chunk = min(s, SBN_CHUNK_ROWS)
    chunks = -(-s // SBN_CHUNK_ROWS)
    release = k + (1 + frequency_copies) * j + 2 * j * k + j * k * k
    working = 9 * j * q + (3 + chunks) * j * p + 2 * j * k * k + chunk * (2 * k * k + 2 * p) + 3 * s * j
    posterior = 3 * j * q + 4 * j * (k + 1) + release + 6 * k + 2 * j
    return Footprint(working, release, posterior, ("options", "hidden"), f"hidden {k} x {j} pixels")


def footprint(options: Mapping[str, float], j: int, s: int) -> Footprint:
    """VIPS-SBN's footprint from the job's options (the defaults where it gives none)."""
    copies = int(options.get("frequency_copies", SBN_DEFAULT_FREQUENCY_COPIES))
    return sbn_footprint(j, s, int(options.get("hidden", DEFAULTS["hidden"])), copies)


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
    footprints={"vips": footprint},
)
