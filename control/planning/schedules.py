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
from collections.abc import Mapping
from dataclasses import dataclass, field

from control.planning.coverage import tested_lines
from vips.models.catalog import MODELS
from vips.models.spec import Rule

__all__ = ["RULES", "Rule", "Schedule", "choose_schedule", "chosen_options", "job_scale", "rule_for"]


#: The rules, one per (model, algorithm), from each model's facts (vips.models.<model>.spec, where each
#: rule's reasons are): docs/schedules.md has the table each was read off.
RULES: dict[tuple[str, str], Rule] = {
    (name, algorithm): rule for name, spec in MODELS.items() for algorithm, rule in spec.rules.items()
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
    """The entries of the statistic whose signal to noise a rule reads: the model's own count (LDA's K x V
    topic-word counts, the SBN's J x K pixel-unit statistics: their specs), other models' d."""
    spec = MODELS.get(model)
    size = spec.statistic_size if spec is not None else None
    return dimension if size is None else size(options, dimension)


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
