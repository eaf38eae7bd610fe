"""What a model is, written once (issue 53): the dataset kind it fits, its options with their bounds, the
algorithms that fit it with theirs, and the defaults that planning reads. Each model's folder holds its
`spec.py` (a ModelSpec); vips.models.catalog lists them. The API's validation (control.planning.options),
the CLI's choices and help and the dashboard read them, so this module and every spec import nothing
beyond the standard library: `vips --help` and the API load them without the models' numerical code
(pyproject.toml's import contracts)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OptionSpec:
    """A numeric option: its check and how the check reads in an error message."""

    check: Callable[[float], bool]
    requirement: str
    whole: bool = False  # a count or a switch (topics, hidden, noise_aware): an int wherever it is shown


def whole(low: int, high: int) -> OptionSpec:
    """A whole-number option in [low, high]."""
    return OptionSpec(
        lambda v: v == int(v) and low <= v <= high, f"must be a whole number in [{low}, {high}]", whole=True
    )


def between(low: float, high: float) -> OptionSpec:
    """A real option in [low, high]: finite bounds, so that no admitted value overflows or divides by zero
    in an update (issue 52: tau0 1e300 and unigram_clip 1e-300 were admitted, spent, then failed)."""
    return OptionSpec(lambda v: low <= v <= high, f"must be in [{low:g}, {high:g}]")


#: A scale (a prior's variance or precision, a Gamma parameter, a clip, a step size): from 1e-6 to 1e6,
#: twelve orders of magnitude around the unit scale every row is normalised to.
SCALE = between(1e-6, 1e6)
NON_NEGATIVE = between(0.0, 1e6)
UNIT_INTERVAL = OptionSpec(lambda v: 0 <= v <= 1, "must be in [0, 1]")
CLIP_FRACTION = OptionSpec(lambda v: 0 < v <= 1, "must be in (0, 1]")
SHARE = OptionSpec(lambda v: 0 <= v < 1, "must be in [0, 1)")
#: A switch between two modes (noise_aware, word_prior): 1 or 0.
SWITCH = whole(0, 1)

#: Options every model takes: the VIPS loop's step sizes rho_t = (tau0 + t)^-kappa.
COMMON_OPTIONS: dict[str, OptionSpec] = {"tau0": between(0.0, 1e9), "kappa": UNIT_INTERVAL}


def step_size(t: int, tau0: float, kappa: float) -> float:
    """The VIPS loop's step size rho_t = (tau0 + t)^-kappa for t = 1, 2, ..., capped at 1 (options tau0,
    kappa); read by vips.runner and by the dashboard's replay of a job's releases."""
    return float(min(1.0, (tau0 + t) ** -kappa))


#: The algorithms, VIPS first (docs/design.md sections 4-5).
ALGORITHMS = ("vips", "dpvi", "dpsep")
#: The options DP-SEP takes for every model it fits (its site clip, the paper's damping, the prior).
DPSEP_OPTIONS: dict[str, OptionSpec] = {"clip": SCALE, "damping": CLIP_FRACTION, "prior_variance": SCALE}


@dataclass(frozen=True)
class Rule:
    """One model/algorithm's schedule: T and S (a fraction of N, with a floor and a cap in rows) by privacy
    scale (the first row whose bound on epsilon x N is at least the job's holds)."""

    #: (largest epsilon x N of the row, iterations T), increasing; the last row's bound is infinite.
    iterations: tuple[tuple[float, int], ...]
    #: (largest epsilon x N of the row, S as a fraction of N), increasing, the last bound infinite.
    batch_fractions: tuple[tuple[float, float], ...] = ((math.inf, 1.0),)
    min_batch: int = 1
    max_batch: int | None = None
    source: str = ""
    #: (largest epsilon x N of the row, model options it chooses), increasing; empty: the model's defaults.
    options: tuple[tuple[float, Mapping[str, float]], ...] = ()
    #: The size of the released statistics the rows were read at (statistic_size), when the signal per
    #: entry is what matters (LDA's K x V topic-word counts): a job's scale is then epsilon x N x
    #: reference_size / its size. None: epsilon x N.
    reference_size: int | None = None
    #: The power of reference_size / size that scales epsilon x N (1: signal per entry; 1/2: signal against
    #: the spectral norm of a d x d noise matrix, which grows as sqrt(d)).
    size_exponent: float = 1.0
    #: (largest epsilon x N of the row, what a fit there was measured to give, in words for the quote),
    #: increasing; scales past the last row (and jobs that give sigma) get no such words.
    expect: tuple[tuple[float, str], ...] = ()
    #: Option values that select another mode of the model, which the rows were not read for: a job that
    #: gives one of them gets none of the rows' options (its mode's defaults).
    other_modes: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Tested:
    """Coverage of one kind of interval: of private fits by scale band, and at sigma 0."""

    #: (largest scale of the band, the band in words, coverage there, a caution or ""), increasing; the
    #: last band's bound is infinite.
    bands: tuple[tuple[float, str, str, str], ...]
    at_zero: str

    def band(self, scale: float) -> tuple[str, str, str]:
        """(the band in words, coverage, caution) of the first band whose bound is at least `scale`."""
        return next((words, found, caution) for bound, words, found, caution in self.bands if scale <= bound)


@dataclass(frozen=True)
class Footprint:
    """Float64 counts of one job (control.planning.resources) and what drives them, for the refusal's
    message: the arrays alive at its busiest moment (working), one stored release and the posterior."""

    working: int
    release: int
    posterior: int
    driver: tuple[str, ...]  # the spec field that makes the arrays large
    why: str  # the shape in words, e.g. "hidden 500 x 256 pixels"


#: privacy_wall.queries.base.CHUNK_ELEMENTS and MIN_CHUNK_ROWS, mirrored (the facts import no numpy;
#: tests/control/planning/test_resources.py checks they agree): the per-record queries (BLR, linear
#: regression, DPVI, DP-SEP) compute on chunks of rows, so their temporaries are C x d, not S x d.
QUERY_CHUNK_ELEMENTS = 1 << 18
QUERY_MIN_CHUNK_ROWS = 256


def chunk_rows(d: int, s: int) -> int:
    """C: the rows of one chunk of a per-record query's batch (privacy_wall.queries.base.chunked_sums)."""
    return min(s, max(QUERY_MIN_CHUNK_ROWS, QUERY_CHUNK_ELEMENTS // max(1, d)))


#: A model's footprint for one algorithm: (the job's options, the data's d / V / J, the batch size S).
FootprintRule = Callable[[Mapping[str, float], int, int], Footprint]


@dataclass(frozen=True)
class ModelSpec:
    """One model's facts.

    `options`: VIPS's options for it (beside COMMON_OPTIONS); `algorithms`: each other algorithm that fits
    it and its options, which replace VIPS's (a fixed prior variance for a0, b0, say); `defaults` and
    `algorithm_defaults`: the defaults planning or the dashboard read too (the model's code reads them
    from here); `aliases`: names other tools give the model, so a mistyped --model names it; `rules`:
    each algorithm's schedule rule."""

    name: str
    kind: str
    title: str
    options: Mapping[str, OptionSpec]
    algorithms: Mapping[str, Mapping[str, OptionSpec]] = field(default_factory=dict)
    defaults: Mapping[str, float] = field(default_factory=dict)
    algorithm_defaults: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    #: The schedule rule of each algorithm that fits the model (control.planning.schedules reads them).
    rules: Mapping[str, Rule] = field(default_factory=dict)
    #: The entries of the statistic whose signal to noise a rule reads, given the job's options and the
    #: data's d (a rule with a reference_size reads it); None: d.
    statistic_size: Callable[[Mapping[str, float], int], int] | None = None
    #: What each algorithm's intervals were tested to cover (control.planning.coverage), and for a paper
    #: mode a job selects with noise_aware 0; none measured: no line.
    tested: Mapping[str, Tested] = field(default_factory=dict)
    paper_mode: Mapping[str, Tested] = field(default_factory=dict)
    #: (option name, why) when the job's options conflict with its sigma, else None (given valid options;
    #: control.planning.options.schedule_problem); None: no such conflicts.
    conflict: Callable[[Mapping[str, float], float], tuple[str, str] | None] | None = None
    #: What a posterior carries from the dataset's public schema so that clients can use it on their own
    #: files (docs/posterior-format.md); None: nothing.
    public_extra: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    #: Each algorithm's resource footprint (control.planning.resources turns it into bytes).
    footprints: Mapping[str, FootprintRule] = field(default_factory=dict)

    def fitted_by(self) -> tuple[str, ...]:
        """The algorithms that fit this model, VIPS first."""
        return ("vips", *(name for name in ALGORITHMS if name in self.algorithms))

    def option_specs(self, algorithm: str = "vips") -> dict[str, OptionSpec]:
        """Every option a job of this model fitted by `algorithm` may set."""
        own = self.options if algorithm == "vips" else self.algorithms.get(algorithm, {})
        return {**COMMON_OPTIONS, **own}
