"""Automatic schedules: the iterations T and batch size S of a job that gives only its epsilon, chosen
from public facts alone (the model, the algorithm, the population N, epsilon) and deterministically, so a
quote and the job it admits agree and the choice reveals nothing about the data (docs/schedules.md).

What a private fit can learn is set by how large the noise is against the signal, which scales as
1 / (epsilon N): a dataset of N rows at epsilon e behaves like one of 10 N rows at e / 10. The rules are
therefore keyed on epsilon x N ("the privacy scale"), and their rows come from grids on public data
(bench/blr_schedules.py on Adult), never from data treated as private. Explicit
values win: a job that gives T or S keeps it and the rule fills only what is missing. A job that gives
sigma instead of epsilon has no epsilon to choose by: it gets the rule's row for the largest scale (for
VIPS-BLR the long-standing T 10, S N).

A rule may also choose model options by the same privacy scale (for instance how many copies of the SBN's
pixel frequencies each release carries): only options the job does not give, and only when it gives epsilon
(a job that gives sigma keeps the model's defaults). They are public choices like T and S, stored with the
job's options."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from control.planning.coverage import tested_lines
from control.planning.options import LDA_DEFAULTS, SBN_DEFAULTS


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


#: What a logistic fit was measured to give at the smallest scales (epsilon x N x sqrt(10 / d) up to 250).
BASE_RATE = (
    "probabilities about as good as a constant prediction at the base rate, or worse: at this scale no "
    "algorithm beat it reliably on Adult, Telco or Credit (vips evaluate says which a fit did)"
)

#: The rules, one per (model, algorithm): docs/schedules.md has the table each was read off.
RULES: dict[tuple[str, str], Rule] = {
    # Whole-batch releases, chosen by held-out log loss and coverage (issue 51), read at epsilon x N x
    # sqrt(10 / d) (H's noise grows with the spectral norm of a d x d noise matrix): one Polya-Gamma
    # release up to 400 (more diverge there); above, Laplace (Newton) releases from the first (the one at
    # w = 0, whose curvature is left out of the pool) with each record's gradient term bounded
    # (gradient_bound: less noise for a bias on the misclassified records): three with bound 0.2 up to
    # 2,000, where three Polya-Gamma releases' intervals covered 0.26-0.57 (these 0.62-0.88, with the same
    # or lower log loss on Adult, Telco and synthetic data but Adult at 1,000, +0.002; docs/schedules.md,
    # "VIPS-BLR: small scales"), then five with bound 0.25 up to 4,000 and 0.3 up to 8,000, then five after
    # one Polya-Gamma release with bound 0.35, where the smaller bounds' bias shows in the coverage
    # (docs/schedules.md, "VIPS-BLR: the gradient bound"). T 10 for a job that gives sigma, whose row is
    # the one for infinite scale (with the model's defaults: Laplace releases from the second, no bound).
    # Up to 250 no schedule of any algorithm beat a constant prediction at the base rate reliably on Adult,
    # Telco or Credit (docs/schedules.md, "The smallest scales, re-read and left"): the quote says so.
    ("blr", "vips"): Rule(
        iterations=((400.0, 1), (2_000.0, 3), (sys.float_info.max, 5), (math.inf, 10)),
        options=(
            (400.0, {"laplace_from": 0}),
            (2_000.0, {"laplace_from": 1, "pool_from": 2, "gradient_bound": 0.2}),
            (4_000.0, {"laplace_from": 1, "pool_from": 2, "gradient_bound": 0.25}),
            (8_000.0, {"laplace_from": 1, "pool_from": 2, "gradient_bound": 0.3}),
            (math.inf, {"laplace_from": 2, "gradient_bound": 0.35}),
        ),
        reference_size=10,
        size_exponent=0.5,
        source="VIPS-BLR's grid by log loss and coverage on Adult, Telco and synthetic data "
        "(python -m bench.calibration --rule)",
        expect=((250.0, BASE_RATE),),
    ),
    # Full batches up to epsilon x N = 150,000: the budget's filter prices a release on the whole dataset
    # exactly and a subsampled one by its Renyi curve (at 0.002 of delta), and there 300 full-batch steps
    # beat the usual 1,000 steps on N/50 in held-out log loss (Adult at 97,683 by 0.0012, tie at worst);
    # at 325,610 the usual schedule wins by 0.0014 and takes a tenth of the computation (docs/schedules.md,
    # "DPVI-BLR under the filter").
    # AdaGrad's learning rate 1 above epsilon x N = 2,000: with the noise-aware posterior (the iterates'
    # average) the larger steps no longer leave the means shrunk; below, on Telco at 0.3, the default 0.5's
    # shorter steps add less noise. Between 2,000 and 5,000, 1.5: there 300 steps of 1 still leave the
    # average short of the posterior (coverage 0.81, slope 0.90 on 60 datasets at 3,000; 1.5: 0.87 / 0.97,
    # the same log loss; Telco at 4,930 ties) (docs/schedules.md, "DPVI-BLR: the learning rate").
    ("blr", "dpvi"): Rule(
        iterations=((150_000.0, 300), (math.inf, 1000)),
        batch_fractions=((150_000.0, 1.0), (math.inf, 1 / 50)),
        min_batch=100,
        options=(
            (2_000.0, {"learning_rate": 0.5}),
            (5_000.0, {"learning_rate": 1.5}),
            (math.inf, {"learning_rate": 1.0}),
        ),
        source="DPVI's grid on Adult and Telco under the budget's filter (bench/dpvi_schedules.py); above "
        "epsilon x N = 150,000 its usual schedule (Jalko et al.)",
    ),
    # Read at epsilon x N x sqrt(10 / d), as VIPS-BLR's rule. Above 2,000 the noise-aware mode (centred
    # releases, a noise-aware Newton step: vips.models.dpsep), whose intervals cover, with the site clip
    # 0.3 up to 8,000 and 0.35 above: on 100 synthetic datasets at epsilon 0.3 / 0.6 / 1 / 3 coverage
    # 0.88 / 0.86 / 0.84 / 0.84, slope 0.95-0.99, and the lowest held-out log loss measured on Adult and
    # Telco or within 0.002 of it (Adult 0.3530 / 0.3409 / 0.3389 / 0.3334); a smaller clip biases the
    # means outward (0.25: slope 1.05-1.07, coverage 0.53-0.74 from epsilon 0.6), and 0.3 does so from
    # 10,000 (coverage 0.81, 0.74 at 30,000). Below 2,000, where five Newton steps from a site precision
    # the noise dominates diverge in some fits (Telco at 730: log loss 1.53 on average over 8 fits, up to
    # 3.9), fewer of them: two up to 1,000 (Telco at 730: 0.4658, at most 0.4775; synthetic at 500 / 1,000:
    # coverage 0.64 / 0.66, the paper's update 0.09 / 0.13), three up to 2,000 (Telco at 1,460: 0.4554;
    # synthetic at 1,500: coverage 0.80, the paper's 0.17; Adult at 1,929: 0.3642 against the paper's
    # 0.4060) (docs/schedules.md, "DP-SEP-BLR: small scales"). The model's defaults (noise-aware, clip 1,
    # T 5) for a job that gives sigma.
    ("blr", "dpsep"): Rule(
        iterations=((1_000.0, 2), (2_000.0, 3), (math.inf, 5)),
        options=(
            (8_000.0, {"clip": 0.3, "noise_aware": 1}),
            (math.inf, {"clip": 0.35, "noise_aware": 1}),
        ),
        reference_size=10,
        size_exponent=0.5,
        source="DP-SEP's grid on Adult (bench/compare_algorithms.py); its mode and clip by held-out log loss "
        "and coverage on Adult, Telco and synthetic data (bench/calibration.py --dpsep-clip)",
        expect=((250.0, BASE_RATE),),
    ),
    ("linreg", "vips"): Rule(
        iterations=((math.inf, 5),), source="the regression section of bench/compare_algorithms.py"
    ),
    # The noise-aware mode's clip of each record's site P(z z^T) (vips.models.dpsep): 0.7 against 0.5, 1
    # and sqrt(3) (nothing clipped) on 30 synthetic datasets at epsilon 0.3 / 1 / 3 (N 10,000), the lowest
    # held-out negative log density or within 0.001 of it at each, with coverage 0.89-0.93 (0.5: 0.81 at
    # epsilon 3; sqrt(3): 0.09 worse at 0.3); docs/schedules.md, "DP-SEP linear regression: the clip".
    ("linreg", "dpsep"): Rule(
        iterations=((math.inf, 5),),
        options=((math.inf, {"clip": 0.7}),),
        source="the regression section of bench/compare_algorithms.py; the clip by held-out log density "
        "and coverage on synthetic data (bench/calibration.py)",
        other_modes={"noise_aware": 0},  # the paper's model keeps its clip, the bound of its own sites
    ),
    # Small epsilon x D: most of each release on the word frequencies (the unigram fallback) and few
    # iterations; the topics get more as the scale grows. T 10 for a job that gives sigma. Read off V about
    # 5,000 and K 20-50 (docs/schedules.md, "VIPS-LDA"); a topic-word count's signal to noise grows as
    # epsilon x D / (K V), so K topics over V words read the rows at epsilon x D x 100,000 / (K V). Above
    # 600,000 the topic statistics stand far above their noise and the fallback only costs.
    ("lda", "vips"): Rule(
        iterations=((10_000.0, 3), (200_000.0, 10), (sys.float_info.max, 20), (math.inf, 10)),
        options=(
            (10_000.0, {"unigram_share": 0.97, "unigram_clip": 3.0}),
            (60_000.0, {"unigram_share": 0.8, "unigram_clip": 3.0}),
            (200_000.0, {"unigram_share": 0.5, "unigram_clip": 3.0}),
            (600_000.0, {"unigram_share": 0.3, "unigram_clip": 3.0}),
            (math.inf, {"unigram_share": 0.0}),
        ),
        source="VIPS-LDA's grids on the bundled Wikipedia corpus and planted-topic corpora "
        "(bench/lda.py --sweep-unigram)",
        reference_size=100_000,
        # What the sweeps measured against the private unigram at the same epsilon (docs/schedules.md,
        # "What the topics buy over a private unigram at the same epsilon").
        expect=(
            (
                10_000.0,
                "about the private word frequencies the fit falls back to (its posterior's private_unigram): "
                "at this scale topics clear the noise only where they are very strong",
            ),
            (
                60_000.0,
                "strong topics to pay; on encyclopedia or news text, about the private word frequencies",
            ),
        ),
    ),
    # Small scales: no unit learns reliably, so the fit is the pixel means and the release weights them (8
    # copies); up to 25,000 single fits of the units spread around the pixel means (held-out NLL 345.1-347.8
    # at 20,000 against the fallback's 346.7, 10 fits), from 25,000 all beat them (340.8-345.2). Above: one
    # release from weights spread wide enough (init_scale 3) that units switch on, then T 3, and T 10 once
    # the noise is small. Read at 28 x 28 digits (J 784 pixels) and K 50 units: the noise on each entry of the
    # weights' drive grows as sqrt(J K), so a job's epsilon x N is read times sqrt(39,200 / (J K))
    # (docs/schedules.md, "VIPS-SBN").
    ("sbn", "vips"): Rule(
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


@dataclass(frozen=True)
class Schedule:
    """T and S of a job, the model options the rule chose, which of them all the rule chose (`auto`) and
    why, in words for the quote."""

    iterations: int
    batch_size: int
    auto: tuple[str, ...]
    why: str
    options: dict[str, float] = field(default_factory=dict)


def rule_for(model: str, algorithm: str) -> Rule:
    try:
        return RULES[(model, algorithm)]
    except KeyError:
        raise ValueError(f"no schedule rule for model {model} by {algorithm}") from None


def statistic_size(model: str, options: Mapping[str, float], dimension: int) -> int:
    """The entries of the statistic whose signal to noise a rule reads: LDA's K x V topic-word counts
    (K the job's topics, else the model's default), the SBN's J x K pixel-unit statistics (its weights'
    drive s6, Delta sqrt(J K) / (2 S): privacy_wall/queries/sbn.py), other models' d."""
    if model == "lda":
        return int(options.get("topics", LDA_DEFAULTS["topics"])) * dimension
    if model == "sbn":
        return int(options.get("hidden", SBN_DEFAULTS["hidden"])) * dimension
    return dimension


def job_scale(
    model: str,
    algorithm: str,
    population: int,
    epsilon: float | None,
    options: Mapping[str, float] | None = None,
    dimension: int | None = None,
) -> float:
    """The scale a job reads its rule's rows at: epsilon x N, times reference_size / statistic_size for a
    rule read at a reference size when the job's d is known; infinite without epsilon (sigma given)."""
    if epsilon is None:
        return math.inf
    rule = rule_for(model, algorithm)
    scale = epsilon * population
    if rule.reference_size is not None and dimension is not None and dimension > 0:
        scale *= (rule.reference_size / statistic_size(model, options or {}, dimension)) ** rule.size_exponent
    return scale


def chosen_options(
    model: str,
    algorithm: str,
    population: int,
    epsilon: float | None,
    options: Mapping[str, float] | None = None,
    dimension: int | None = None,
) -> dict[str, float]:
    """The model options the rule chooses for a job: its scale's row less the options the job gives; none
    without epsilon (a job that gives sigma keeps the model's defaults)."""
    if epsilon is None:
        return {}
    scale = job_scale(model, algorithm, population, epsilon, options, dimension)
    return rule_options(rule_for(model, algorithm), scale, options or {})


def rule_iterations(rule: Rule, scale: float) -> int:
    """T of the first row whose bound on epsilon x N is at least `scale`."""
    return next(iterations for bound, iterations in rule.iterations if scale <= bound)


def rule_options(rule: Rule, scale: float, given: Mapping[str, float]) -> dict[str, float]:
    """The options of the first row whose bound on epsilon x N is at least `scale`, less those given; none
    for a job that gives one of the rule's other modes."""
    if any(given.get(name) == value for name, value in rule.other_modes.items()):
        return {}
    row = next((options for bound, options in rule.options if scale <= bound), {})
    return {name: float(value) for name, value in row.items() if name not in given}


def rule_option_names(model: str, algorithm: str) -> frozenset[str]:
    """The model options the rule of (model, algorithm) may choose."""
    rule = RULES.get((model, algorithm))
    return frozenset(name for _, options in rule.options for name in options) if rule else frozenset()


def rule_expectation(rule: Rule, scale: float) -> str | None:
    """What a fit at `scale` was measured to give (the first `expect` row whose bound is at least it)."""
    return next((words for bound, words in rule.expect if scale <= bound), None)


def rule_batch(rule: Rule, population: int, scale: float = math.inf) -> int:
    """S = the fraction of N of the first batch row whose bound is at least `scale`, at least min_batch and
    at most max_batch rows, and 1..N."""
    fraction = next(f for bound, f in rule.batch_fractions if scale <= bound)
    size = max(round(fraction * population), rule.min_batch)
    if rule.max_batch is not None:
        size = min(size, rule.max_batch)
    return max(1, min(size, population))


def choose_schedule(
    model: str,
    algorithm: str,
    population: int,
    epsilon: float | None,
    *,
    iterations: int | None = None,
    batch_size: int | None = None,
    max_iterations: int | None = None,
    options: Mapping[str, float] | None = None,
    dimension: int | None = None,
) -> Schedule:
    """The job's (T, S) and chosen model options: given values kept, missing ones from the rule at
    epsilon x N (module docstring); with no epsilon (sigma given), the rule's row for the largest scale
    and no options chosen (the model's defaults)."""
    rule = rule_for(model, algorithm)
    scale = job_scale(model, algorithm, population, epsilon, options, dimension)
    chosen = chosen_options(model, algorithm, population, epsilon, options, dimension)
    auto = tuple(
        name for name, value in (("iterations", iterations), ("batch_size", batch_size)) if value is None
    ) + tuple(chosen)
    chosen_t = rule_iterations(rule, scale) if iterations is None else iterations
    if max_iterations is not None and iterations is None:
        chosen_t = min(chosen_t, max_iterations)
    chosen_s = rule_batch(rule, population, scale) if batch_size is None else batch_size
    if not auto:
        return Schedule(chosen_t, chosen_s, auto, "given")
    takes = ", ".join(
        [f"T = {chosen_t}", f"S = {chosen_s} of N = {population}"]
        + [f"{name} = {value:g}" for name, value in chosen.items()]
    )
    if epsilon is None:
        at = "sigma given (no epsilon to choose by): its row for little noise"
    else:
        at = f"at epsilon x N = {epsilon * population:.3g}"
        if dimension is not None and scale != epsilon * population:
            entries = statistic_size(model, options or {}, dimension)
            power = "" if rule.size_exponent == 1 else f", to the power {rule.size_exponent:g}"
            at += f" (x {rule.reference_size} / {entries} entries{power}: {scale:.3g})"
    why = (
        f"auto ({', '.join(auto)}): {model} by {algorithm} {at} takes {takes}, from {rule.source} "
        "(docs/schedules.md)"
    )
    expected = rule_expectation(rule, scale)
    if expected is not None:
        why += f"; expect {expected}"
    tested = tested_lines(model, algorithm, options)  # the rule's own schedule is what was measured
    own = iterations is not None or bool(set(options or {}) & rule_option_names(model, algorithm))
    if tested is not None and epsilon is not None and not own:
        _, covered, caution = tested.band(scale)
        if caution:
            why += f"; its 90% intervals covered {covered} of known weights in tests at this scale: {caution}"
    return Schedule(chosen_t, chosen_s, auto, why, chosen)
