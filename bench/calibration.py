"""Do the posteriors tell the truth? Coverage and slope on data of known weights (issue 51).

For each algorithm with a posterior (VIPS, DPVI and DP-SEP for logistic regression; VIPS and DP-SEP for
linear regression) and each privacy setting (epsilon 0.3 / 1 / 3 with only epsilon given, as the service
schedules it, and sigma 0), fit `--datasets` synthetic datasets of known weights and report:

- coverage: the share of true weights inside their nominal 90% marginal credible intervals
  (mean +- 1.645 sd of the posterior), over every weight of every dataset;
- slope: the least-squares slope through 0 of the posterior means on the true weights (1: unbiased;
  0.5: means shrunk to half the truth);
- held-out log loss of the predictive probabilities (logistic) or held-out log density (linear), a proper
  score on rows drawn like the training ones, and for the logistic models the expected calibration error
  (ECE: the mean |observed rate - mean predicted probability| over 10 equal-width probability bins,
  weighted by their rows).

`--public` also scores the logistic posteriors on held-out public data (Adult and Telco: train on the
train split, score the test split): AUC, log loss and ECE, each algorithm given only epsilon. `--rule`
scores VIPS-BLR's candidate schedules (Polya-Gamma releases T 1-3, Laplace releases T 3 and 5) by held-out
log loss on Adult, Telco and synthetic data, with the scale the rule reads: the table the rule
(control.planning.schedules) was read from. `--dpsep-clip` scores DP-SEP-BLR's modes (the paper's damped
site average, the noise-aware centred releases) and site clips C the same way (public data: log loss / AUC;
synthetic: coverage / slope / log loss), the table its rule's mode and clip come from.

Logistic data: d 10, column 0 the intercept (a constant c = 0.3, named "intercept"), the other 9 drawn
uniformly in direction with norm sqrt(1 - c^2) U(0, 1)^(1/2) (every row has norm <= 1, as the service
requires), w ~ N(0, 3^2 I), y ~ Bernoulli(sigmoid(w^T x)); `--weight-sd 1` draws weights of the size the
models' default prior expects (N(0, 1)), against which the small scales' intervals are read (at little
information a posterior is mostly its prior). Linear data: the same rows, y = w^T x + N(0, 0.1^2) with
w ~ N(0, 0.3^2 I), clipped to [-1, 1]. Dataset k is drawn from seed `--first-seed` + k: tune
on seeds 0-99, judge on 1000 and up (data the methods were not tuned on).
A non-private reference: the Laplace approximation at scikit-learn's maximum a posteriori (prior
N(0, 10^2 I)).

    python -m bench.calibration [--models blr,linreg] [--datasets 20] [--rows 10000] [--first-seed 0]
                                [--epsilons 0.3,1,3] [--algorithms VIPS,DPVI,DP-SEP] [--weight-sd 3]
                                [--public] [--rule]
                                [--dpsep-clip] [--repeats 3] [--out DIR]

Writes calibration.md to --out (bench/out by default).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from bench.adult_blr import log

DIMENSION = 10
INTERCEPT = 0.3
LOGISTIC_WEIGHT_SD = 3.0
LINEAR_WEIGHT_SD = 0.3
LINEAR_NOISE_SD = 0.1
TEST_ROWS = 5_000
Z90 = 1.6448536269514722
LAPLACE_PRIOR_VARIANCE = 100.0

Array = NDArray[np.float64]


@dataclass(frozen=True)
class Dataset:
    train: pd.DataFrame
    y: Array
    test: pd.DataFrame
    y_test: Array
    weights: Array


def rows(rng: np.random.Generator, count: int) -> pd.DataFrame:
    """Rows of norm <= 1: the intercept c, then 9 features uniform in direction with norm
    sqrt(1 - c^2) sqrt(U)."""
    directions = rng.normal(size=(count, DIMENSION - 1))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    radius = math.sqrt(1.0 - INTERCEPT**2) * np.sqrt(rng.uniform(size=(count, 1))) * (1 - 1e-12)
    features = np.column_stack([np.full(count, INTERCEPT), directions * radius])
    return pd.DataFrame(features, columns=["intercept", *(f"x{j}" for j in range(1, DIMENSION))])


def draw(model: str, seed: int, count: int, weight_sd: float = LOGISTIC_WEIGHT_SD) -> Dataset:
    """Dataset `seed` of the model's synthetic family (module docstring); `weight_sd`: the logistic
    weights' standard deviation."""
    rng = np.random.default_rng([51, seed])
    train, test = rows(rng, count), rows(rng, TEST_ROWS)
    if model == "blr":
        weights = rng.normal(0.0, weight_sd, DIMENSION)

        def labels(x: pd.DataFrame) -> Array:
            return (rng.uniform(size=len(x)) < 1.0 / (1.0 + np.exp(-(x.to_numpy() @ weights)))).astype(float)
    else:
        weights = rng.normal(0.0, LINEAR_WEIGHT_SD, DIMENSION)

        def labels(x: pd.DataFrame) -> Array:
            return np.clip(x.to_numpy() @ weights + rng.normal(0.0, LINEAR_NOISE_SD, len(x)), -1.0, 1.0)

    return Dataset(train, labels(train), test, labels(test), weights)


@dataclass
class Cell:
    """Pooled results of one method at one privacy setting."""

    truths: list[Array] = field(default_factory=list)
    means: list[Array] = field(default_factory=list)
    sds: list[Array] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    eces: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def coverage(self) -> float:
        truth, mean, sd = (np.concatenate(v) for v in (self.truths, self.means, self.sds))
        return float(np.mean(np.abs(truth - mean) <= Z90 * sd))

    def slope(self) -> float:
        truth, mean = np.concatenate(self.truths), np.concatenate(self.means)
        return float(truth @ mean / (truth @ truth))

    def score(self) -> str:
        values = np.asarray(self.scores)
        error = values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else 0.0
        return f"{values.mean():.4f} +- {error:.4f}"


def expected_calibration_error(p: Array, y: Array, bins: int = 10) -> float:
    """sum_b (n_b / n) |mean y - mean p| over equal-width bins of p."""
    which = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            total += inside.mean() * abs(float(y[inside].mean()) - float(p[inside].mean()))
    return total


def log_loss(p: Array, y: Array) -> float:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def linear_log_density(mean: Array, sd: Array, y: Array) -> float:
    """Mean negative log predictive density of y (lower is better, like log loss)."""
    return float(np.mean(0.5 * np.log(2 * np.pi * sd**2) + 0.5 * ((y - mean) / sd) ** 2))


def laplace_blr(data: Dataset) -> tuple[Array, Array, float, float]:
    """(mean, sd, held-out log loss, ECE) of the Laplace approximation at the MAP (non-private reference)."""
    from scipy.special import expit
    from sklearn.linear_model import LogisticRegression

    x, y = data.train.to_numpy(), data.y
    fit = LogisticRegression(C=LAPLACE_PRIOR_VARIANCE, fit_intercept=False, max_iter=1000).fit(x, y)
    mean = fit.coef_[0]
    p = expit(x @ mean)
    precision = (x * (p * (1 - p))[:, None]).T @ x + np.eye(DIMENSION) / LAPLACE_PRIOR_VARIANCE
    sd = np.sqrt(np.diag(np.linalg.inv(precision)))
    p = expit(data.test.to_numpy() @ mean)
    return mean, sd, log_loss(p, data.y_test), expected_calibration_error(p, data.y_test)


def private_fit(make: Callable[[], Any], model: str, data: Dataset) -> tuple[Array, Array, float, float]:
    """(mean, sd, held-out score, held-out ECE (nan for linear models)) of one estimator fit."""
    estimator = make()
    estimator.fit(data.train, data.y)
    mean, sd = estimator.coef_, np.sqrt(np.diag(estimator.covariance_))
    if model == "blr":
        p = estimator.predict_proba(data.test)[:, 1]
        return mean, sd, log_loss(p, data.y_test), expected_calibration_error(p, data.y_test)
    predicted, spread = estimator.predict(data.test, return_std=True)
    return mean, sd, linear_log_density(predicted, spread, data.y_test), math.nan


def methods(
    model: str, epsilons: Sequence[float], algorithms: Sequence[str] = ("VIPS", "DPVI", "DP-SEP")
) -> dict[str, Callable[[], Any]]:
    """Label -> estimator factory: each of `algorithms` (that fits `model`) at each epsilon (only epsilon
    given) and at sigma 0."""
    from vips.estimators import (
        DPSEPLinearRegression,
        DPSEPLogisticRegression,
        DPVILogisticRegression,
        VIPSLinearRegression,
        VIPSLogisticRegression,
    )

    classes: dict[str, Any] = (
        {"VIPS": VIPSLogisticRegression, "DPVI": DPVILogisticRegression, "DP-SEP": DPSEPLogisticRegression}
        if model == "blr"
        else {"VIPS": VIPSLinearRegression, "DP-SEP": DPSEPLinearRegression}
    )
    found: dict[str, Callable[[], Any]] = {}
    for name, cls in classes.items():
        if name not in algorithms:
            continue
        for epsilon in epsilons:
            found[f"{name} eps {epsilon:g}"] = lambda cls=cls, epsilon=epsilon: cls(epsilon=epsilon)
        found[f"{name} sigma 0"] = lambda cls=cls: cls(sigma=0.0, random_state=0)
    return found


def run(
    model: str,
    datasets: int,
    count: int,
    first_seed: int,
    epsilons: Sequence[float],
    algorithms: Sequence[str] = ("VIPS", "DPVI", "DP-SEP"),
    weight_sd: float = LOGISTIC_WEIGHT_SD,
) -> list[str]:
    cells: dict[str, Cell] = {}
    factories = methods(model, epsilons, algorithms)
    for k in range(datasets):
        data = draw(model, first_seed + k, count, weight_sd)
        labels = (["Laplace at the MAP (non-private)"] if model == "blr" else []) + list(factories)
        for label in labels:
            started = time.perf_counter()
            mean, sd, score, ece = (
                private_fit(factories[label], model, data) if label in factories else laplace_blr(data)
            )
            cell = cells.setdefault(label, Cell())
            cell.truths.append(data.weights), cell.means.append(mean), cell.sds.append(sd)
            cell.scores.append(score), cell.eces.append(ece)
            cell.seconds += time.perf_counter() - started
        log(f"{model}: dataset {k + 1} of {datasets} done")
    score_name = "held-out log loss | ECE" if model == "blr" else "held-out negative log density"
    lines = [
        f"| {model} method | 90% coverage | slope of means on truth | {score_name} | seconds a fit |",
        "|---|---|---|---|---|" + ("---|" if model == "blr" else ""),
    ]
    for label, cell in cells.items():
        ece = f" {np.mean(cell.eces):.4f} |" if model == "blr" else ""
        lines.append(
            f"| {label} | {cell.coverage():.3f} | {cell.slope():.3f} | {cell.score()} |{ece} "
            f"{cell.seconds / datasets:.2f} |"
        )
    return lines


def public_section(
    epsilons: Sequence[float], repeats: int, algorithms: Sequence[str] = ("VIPS", "DPVI", "DP-SEP")
) -> list[str]:
    """AUC, log loss and ECE on the held-out split of Adult and Telco, each algorithm given only epsilon."""
    from sklearn.metrics import roc_auc_score

    from vips.datasets.adult import load_adult
    from vips.datasets.telco import load_telco

    lines = ["| data | method | AUC | log loss | ECE |", "|---|---|---|---|---|"]
    for name, load in (("adult", load_adult), ("telco", load_telco)):
        train, test = load("train"), load("test")
        x, x_test = (pd.DataFrame(d.features, columns=d.feature_names) for d in (train, test))
        for label, make in methods("blr", epsilons, algorithms).items():
            if "sigma 0" in label:
                continue
            runs = []
            for _ in range(repeats):
                p = make().fit(x, train.labels).predict_proba(x_test)[:, 1]
                runs.append(
                    (
                        roc_auc_score(test.labels, p),
                        log_loss(p, test.labels),
                        expected_calibration_error(p, test.labels),
                    )
                )
            auc, loss, ece = np.mean(runs, axis=0)
            lines.append(f"| {name} | {label} | {auc:.4f} | {loss:.4f} | {ece:.4f} |")
            log(lines[-1])
    return lines


#: VIPS-BLR schedules the rule chooses between (--rule): label -> (T, laplace_from).
#: VIPS-BLR's candidate schedules compared by --rule (options given to the estimator; a bound below 1/2
#: clips each record's gradient term, privacy_wall.queries.blr).
RULE_CANDIDATES: dict[str, dict[str, float]] = {
    "PG T1": {"iterations": 1, "laplace_from": 0},
    "PG T3": {"iterations": 3, "laplace_from": 0},
    "Laplace T3": {"iterations": 3, "laplace_from": 2},
    "Laplace T5": {"iterations": 5, "laplace_from": 2},
    **{
        f"Laplace from 1, T{t}, bound {bound:g}": {
            "iterations": t,
            "laplace_from": 1,
            "pool_from": 2,
            "gradient_bound": bound,
        }
        for t, bound in ((5, 0.5), (3, 0.25), (5, 0.25), (5, 0.35))
    },
}


def rule_section(epsilons: Sequence[float], repeats: int) -> list[str]:
    """Held-out log loss (and AUC) of VIPS-BLR's candidate schedules at each epsilon on Adult, Telco,
    bench.compare_algorithms's synthetic split (d 20, N 20,000) and three datasets of this module's family
    (seeds 0-2), with the scale the rule reads (epsilon x N x sqrt(10 / d)); mean over `repeats` fits."""
    from sklearn.metrics import roc_auc_score

    from bench.compare_algorithms import synthetic_split
    from vips.datasets.adult import load_adult
    from vips.datasets.telco import load_telco
    from vips.estimators import DPVILogisticRegression, VIPSLogisticRegression

    sets: list[tuple[str, pd.DataFrame, Array, pd.DataFrame, Array]] = []
    for name, split in (("adult", load_adult), ("telco", load_telco), ("synthetic d20", None)):
        train, test = (split("train"), split("test")) if split is not None else synthetic_split()
        frames = [pd.DataFrame(d.features, columns=d.feature_names) for d in (train, test)]
        sets.append((name, frames[0], train.labels, frames[1], test.labels))
    for seed in range(3):
        data = draw("blr", seed, 10_000)
        sets.append((f"calibration {seed}", data.train, data.y, data.test, data.y_test))
    header = ["data", "epsilon (scale)", *RULE_CANDIDATES, "DPVI"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for epsilon in epsilons:
        for name, x, y, x_test, y_test in sets:
            cells = []
            factories: list[Callable[[], Any]] = [
                lambda e=epsilon, o=options: VIPSLogisticRegression(epsilon=e, **o)
                for options in RULE_CANDIDATES.values()
            ] + [lambda e=epsilon: DPVILogisticRegression(epsilon=e)]
            for make in factories:
                runs = []
                for _ in range(repeats):
                    p = make().fit(x, y).predict_proba(x_test)[:, 1]
                    runs.append((log_loss(p, y_test), roc_auc_score(y_test, p)))
                loss, auc = np.mean(runs, axis=0)
                cells.append(f"{loss:.4f} / {auc:.3f}")
            scale = epsilon * len(y) * math.sqrt(10 / x.shape[1])
            lines.append(f"| {name} | {epsilon:g} ({scale:,.0f}) | " + " | ".join(cells) + " |")
            log(lines[-1])
    return lines


#: DP-SEP-BLR's settings compared by --dpsep-clip: the paper's damped site average (noise_aware 0) at the
#: paper's C 1 and at 0.25, and the noise-aware mode (centred releases, Newton steps) at four clips.
DPSEP_SETTINGS: tuple[tuple[str, dict[str, float]], ...] = (
    ("paper, clip 1", {"noise_aware": 0, "clip": 1.0}),
    ("paper, clip 0.25", {"noise_aware": 0, "clip": 0.25}),
    *((f"noise-aware, clip {c:g}", {"noise_aware": 1, "clip": c}) for c in (0.25, 0.3, 0.35, 0.5)),
)


def dpsep_clip_section(epsilons: Sequence[float], repeats: int, datasets: int) -> list[str]:
    """Held-out log loss / AUC of DP-SEP-BLR in each setting (DPSEP_SETTINGS) on Adult and Telco (mean over
    `repeats` fits, with the scale epsilon x N x sqrt(10 / d) its rule reads), and coverage / slope / log
    loss on `datasets` synthetic datasets (seeds 0..): the table the rule's mode and clip
    (control.planning.schedules) were read from."""
    from sklearn.metrics import roc_auc_score

    from vips.datasets.adult import load_adult
    from vips.datasets.telco import load_telco
    from vips.estimators import DPSEPLogisticRegression

    header = ["data", "epsilon (scale)", *(label for label, _ in DPSEP_SETTINGS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, load in (("adult", load_adult), ("telco", load_telco)):
        train, test = load("train"), load("test")
        x, x_test = (pd.DataFrame(d.features, columns=d.feature_names) for d in (train, test))
        for epsilon in epsilons:
            cells = []
            for _, options in DPSEP_SETTINGS:
                runs = []
                for _ in range(repeats):
                    fit = DPSEPLogisticRegression(epsilon=epsilon, **options).fit(x, train.labels)
                    p = fit.predict_proba(x_test)[:, 1]
                    runs.append((log_loss(p, test.labels), roc_auc_score(test.labels, p)))
                loss, auc = np.mean(runs, axis=0)
                worst = max(loss for loss, _ in runs)
                cells.append(
                    f"{loss:.4f} / {auc:.4f}" + (f" (worst {worst:.2f})" if worst > 2 * loss else "")
                )
            scale = epsilon * len(train.labels) * math.sqrt(10 / x.shape[1])
            lines.append(f"| {name} | {epsilon:g} ({scale:,.0f}) | " + " | ".join(cells) + " |")
            log(lines[-1])
    sets = [draw("blr", seed, 10_000) for seed in range(datasets)]
    for epsilon in [*epsilons, 0.0]:
        cells = []
        for _, options in DPSEP_SETTINGS:
            cell = Cell()
            for data in sets:
                given = {"epsilon": epsilon} if epsilon > 0 else {"sigma": 0.0, "random_state": 0}
                mean, sd, score, ece = private_fit(
                    lambda given=given, options=options: DPSEPLogisticRegression(**options, **given),
                    "blr",
                    data,
                )
                cell.truths.append(data.weights), cell.means.append(mean), cell.sds.append(sd)
                cell.scores.append(score), cell.eces.append(ece)
            cells.append(f"{cell.coverage():.2f} / {cell.slope():.2f} / {np.mean(cell.scores):.4f}")
        label = f"{epsilon:g} ({epsilon * 10_000:,.0f})" if epsilon > 0 else "sigma 0"
        row = f"| synthetic ({datasets}; coverage / slope / log loss) | {label} | "
        lines.append(row + " | ".join(cells) + " |")
        log(lines[-1])
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--models", default="blr,linreg")
    parser.add_argument("--datasets", type=int, default=20)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--epsilons", default="0.3,1,3")
    parser.add_argument("--algorithms", default="VIPS,DPVI,DP-SEP", help="which algorithms' posteriors")
    parser.add_argument(
        "--weight-sd",
        type=float,
        default=LOGISTIC_WEIGHT_SD,
        help="the logistic weights' sd (1: the size the models' default prior expects)",
    )
    parser.add_argument("--public", action="store_true", help="also score on held-out Adult and Telco")
    parser.add_argument("--rule", action="store_true", help="VIPS-BLR's candidate schedules by log loss")
    parser.add_argument("--dpsep-clip", action="store_true", help="DP-SEP-BLR's site clips by log loss")
    parser.add_argument("--repeats", type=int, default=3, help="fits per method with --public and --rule")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args(argv)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    algorithms = args.algorithms.split(",")
    lines = [
        f"{args.datasets} datasets of {args.rows} rows from seed {args.first_seed}, d {DIMENSION}, "
        f"logistic weights of sd {args.weight_sd:g} (bench/calibration.py)",
        "",
    ]
    for model in args.models.split(",") if args.datasets > 0 else []:
        lines += [
            *run(model, args.datasets, args.rows, args.first_seed, epsilons, algorithms, args.weight_sd),
            "",
        ]
    if args.public:
        lines += [*public_section(epsilons, args.repeats, algorithms), ""]
    if args.rule:
        lines += [*rule_section(epsilons, args.repeats), ""]
    if args.dpsep_clip:
        lines += [*dpsep_clip_section(epsilons, args.repeats, max(args.datasets, 1)), ""]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
