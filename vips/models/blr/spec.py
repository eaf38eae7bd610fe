"""Bayesian logistic regression's facts (vips.models.spec): binary labels on tabular rows, fitted by VIPS,
DPVI and DP-SEP."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

from vips.models.spec import (
    DPSEP_OPTIONS,
    SCALE,
    SWITCH,
    Footprint,
    FootprintRule,
    ModelSpec,
    OptionSpec,
    Rule,
    Tested,
    chunk_rows,
    whole,
)

#: DPVI's defaults, which the dashboard's convergence replay reads too (vips.models.blr.dpvi's fields take
#: them from here; the learning rate's reason is there).
DPVI_DEFAULTS = {"prior_variance": 1.0, "learning_rate": 0.5}

#: What a logistic fit was measured to give at the smallest scales (epsilon x N x sqrt(10 / d) up to 250).
BASE_RATE = (
    "probabilities about as good as a constant prediction at the base rate, or worse: at this scale no "
    "algorithm beat it reliably on Adult, Telco or Credit (vips evaluate says which a fit did)"
)

#: The schedule rule of each algorithm (control.planning.schedules; docs/schedules.md has the table each
#: was read off).
RULES: dict[str, Rule] = {
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
    "vips": Rule(
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
    "dpvi": Rule(
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
    # releases, a noise-aware Newton step: vips.models.blr.dpsep), whose intervals cover, with the site clip
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
    "dpsep": Rule(
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
}

#: What the intervals were tested to cover (control.planning.coverage, docs/calibration.md): by the scale
#: the rules read, and at sigma 0.
SMALL = "epsilon x N x sqrt(10 / d) 400-2,000"
LARGE = "epsilon 0.3-3 (epsilon x N x sqrt(10 / d) 3,000-30,000)"


def shrunk(at_prior_size: str) -> str:
    """A small band's caution: coverage there is the prior's, given that of weights of its size."""
    return (
        "at this little information the posterior is mostly its prior, N(0, 1) by default: the tests drew "
        f"weights with sd 3, and it held {at_prior_size} of weights of the prior's size (sd 1) and shrinks "
        "larger ones towards 0 (a job anticipating strong effects can widen it: b0 for VIPS, prior_variance "
        "for DPVI and DP-SEP; on Adult and Telco a wider one cost held-out log loss)"
    )


TESTED: dict[str, Tested] = {
    "vips": Tested(
        (
            (
                400.0,
                "epsilon x N x sqrt(10 / d) up to 400",
                "42%",
                f"{shrunk('88%')}; its one Polya-Gamma release is read as exact",
            ),
            (2_000.0, SMALL, "62-73%", shrunk("80-90%")),
            (math.inf, LARGE, "85-89%", ""),
        ),
        "90-92%",
    ),
    "dpvi": Tested(
        (
            (
                2_000.0,
                "epsilon x N up to 2,000",
                "40-53%",
                f"{shrunk('68-94%')}; AdaGrad's iterates have not arrived",
            ),
            (math.inf, "epsilon 0.3-3 (epsilon x N 3,000-30,000)", "82-97% (88-97% from epsilon 1)", ""),
        ),
        "86-91%",
    ),
    "dpsep": Tested(
        (
            (2_000.0, "epsilon x N x sqrt(10 / d) up to 2,000", "46-76%", shrunk("80-92%")),
            (math.inf, LARGE, "83-90%", ""),
        ),
        "89-90%",
    ),
}
#: The same for a DP-SEP job that gives noise_aware 0 (the paper's update).
PAPER_MODE: dict[str, Tested] = {
    "dpsep": Tested(
        (
            (
                math.inf,
                "epsilon 0.3-3",
                "18-56%",
                "the paper's update reads its released site as exact, so its intervals leave out the release "
                "noise (read them as far too narrow)",
            ),
        ),
        "80-84%",
    ),
}


def conflict(options: Mapping[str, float], sigma: float) -> tuple[str, str] | None:
    """DP-SEP's damping weighs the paper's damped site average, which its noise-aware mode (the default,
    and the rule's choice above its smallest scales) replaces by Newton steps: it is taken only with
    noise_aware 0 (damping is an option of no other logistic model)."""
    if "damping" in options and options.get("noise_aware", 1) != 0:
        return "damping", "damping weighs DP-SEP's damped site average: give it with noise_aware=0"
    return None


def public_extra(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The feature columns' names and the label's, by which a client's inputs are matched."""
    if "features" not in schema:
        return {}
    extra: dict[str, Any] = {"columns": list(schema["features"])}
    if schema.get("label") is not None:
        extra["label"] = str(schema["label"])
    return extra


#: privacy_wall.queries.dpsep.QUADRATURE_NODES (the logistic sites' Gauss-Hermite nodes), mirrored.
DPSEP_QUADRATURE_NODES = 64
#: DPVI's default Monte Carlo draws per step (vips.models.blr.dpvi reads it from here).
DPVI_DEFAULT_DRAWS = 1


def vips_footprint(d: int, s: int) -> Footprint:
    """VIPS-BLR (chunks of C rows): the batch (S d) and, per chunk, x E[ww^T] and x * xi (2 C d); the
    d x d blocks of the E-step, the PSD projection of s2 and the Gaussian state (10 d^2). Release s1 (d)
    + s2 mirrored (d^2). Posterior: five d x d matrices and six d-vectors (5 d^2 + 6 d)."""
    working = s * d + 2 * chunk_rows(d, s) * d + 10 * d * d
    return Footprint(working, d + d * d, 5 * d * d + 6 * d, ("batch_size",), f"{d} features")


def dpvi_footprint(d: int, s: int, draws: int) -> Footprint:
    """DPVI-BLR (D draws, chunks of C rows): the batch (S d) and its labels (S); per chunk, at clip_rows'
    norm, the C x 2d per-example gradients, their finite copy, that copy divided by each row's peak and
    its squares inside np.linalg.norm (8 C d; the halves and their concatenation before it peak at
    4 C d); the C x D logits, their NaN-free copy and the residuals (3 C D); the per-row peaks, scales,
    norms and factors (5 C); the posterior's
    d x d diagonals and second moment (4 d^2). Release the 2 d gradient. Posterior: the diagonal precision
    and covariance and -E[w w^T] / 2 (3 d^2), the gradient (2 d) and five d-vectors (7 d)."""
    return Footprint(
        s * d + s + chunk_rows(d, s) * (8 * d + 3 * draws + 5) + 4 * d * d,
        2 * d,
        3 * d * d + 7 * d,
        ("batch_size",),
        f"{d} features",
    )


def dpsep_footprint(d: int, s: int, logistic: bool) -> Footprint:
    """DP-SEP (chunks of C rows): the batch (S d) and its labels (S); per chunk, its finite-masked copy and
    x Sigma (or x beta) (2 C d); for the logistic likelihood, the quadrature's C x K arrays (K = 64 nodes:
    the nodes a, log-weights, weights, sigmoids and the products of g, h and the curvature, 7 C K); the
    labels' copies, cavity marginals, site parameters, norms and clip_sites' temporaries (23 C); the
    site precision, its mirror and PSD projection and the Gaussian states (12 d^2). Release eta (d) +
    precision (d^2); for linear regression's Normal-Gamma sites the chunk's bounded copies of x, z = (x, y),
    z^2 and the scaled z (5 C d in place of 2 C d) and a release of at most (d + 1)^2. Posterior:
    6 d^2 + 6 d."""
    c = chunk_rows(d, s)
    copies = 2 if logistic else 5
    quadrature = 7 * c * DPSEP_QUADRATURE_NODES if logistic else 0
    return Footprint(
        s * d + s + copies * c * d + quadrature + 23 * c + 12 * d * d,
        d + d * d if logistic else (d + 1) ** 2,
        6 * d * d + 6 * d,
        ("batch_size",),
        f"{d} features",
    )


#: Each algorithm's footprint from (options, d, S).
FOOTPRINTS: dict[str, FootprintRule] = {
    "vips": lambda options, d, s: vips_footprint(d, s),
    "dpvi": lambda options, d, s: dpvi_footprint(d, s, int(options.get("draws", DPVI_DEFAULT_DRAWS))),
    "dpsep": lambda options, d, s: dpsep_footprint(d, s, logistic=True),
}


SPEC = ModelSpec(
    name="blr",
    kind="tabular",
    title="logistic regression",
    # noise_aware 1 (default): the M-step that accounts for s1's noise; 0: the paper's Eq. 53-55.
    # laplace_from k: releases k, k + 1, ... are Laplace-mode (Newton) releases at q's mean
    # (vips.models.blr.model); 0: the Polya-Gamma E-step throughout (the paper's). pool_from k: the first
    # Laplace release whose curvature is pooled (0: laplace_from). gradient_bound A: the wall's per-record
    # bound on s1 (privacy_wall.queries.blr; 1/2, the default, clips nothing).
    options={
        "a0": SCALE,
        "b0": SCALE,
        "noise_aware": SWITCH,
        "laplace_from": whole(0, 1_000_000),
        "pool_from": whole(0, 1_000_000),
        "gradient_bound": OptionSpec(lambda v: 0.001 <= v <= 0.5, "must be in [0.001, 0.5]"),
    },
    algorithms={
        "dpvi": {
            "clip": SCALE,
            "learning_rate": SCALE,
            "draws": whole(1, 100),
            "prior_variance": SCALE,
            # noise_aware 1 (default): the posterior from the iterates' trace (vips.models.blr.dpvi); 0: q_T.
            "noise_aware": SWITCH,
        },
        # noise_aware 1 (default): centred releases and the noise-aware Newton step (vips.models.blr.dpsep);
        # 0: the paper's damped site average.
        "dpsep": {**DPSEP_OPTIONS, "noise_aware": SWITCH},
    },
    algorithm_defaults={"dpvi": DPVI_DEFAULTS},
    aliases=("logreg", "logistic", "logit", "lr", "logisticregression"),
    rules=RULES,
    tested=TESTED,
    paper_mode=PAPER_MODE,
    conflict=conflict,
    public_extra=public_extra,
    footprints=FOOTPRINTS,
)
