"""VIPS, DPVI and DP-SEP on one accountant: Adult logistic regression and diabetes linear regression.

Sections (every private fit goes through the same gate, accountant and ledger; sigma is calibrated to the
target epsilon for each algorithm's own schedule; private fits cannot be seeded, so "seeds" are repeats):

- adult: test AUC at epsilon in {0.1, 0.3, 1, 3} (delta = 1e-5) of VIPS-BLR with only epsilon (the
  schedule control.planning.schedules chooses; docs/schedules.md) and with the old T = 10, S = N, DPVI with
  only epsilon (its usual S = N/50, T = 1000) and tuned (S = 1000, T = 300, AdaGrad step 0.5, clip 1), DP-SEP
  (batch S = N, T = 5, clip 0.5, damping rho_t = 1/t) and diffprivlib's LogisticRegression (objective
  perturbation, pure epsilon-DP), with the non-private fits (sigma = 0) of each and scikit-learn's
  LogisticRegression. The tuned DPVI and DP-SEP schedules were picked once from a small grid at epsilon
  0.8 (bench/README.md lists it).
- telco and synthetic (logistic data of known weights, d = 20): the same with only epsilon. Both were used,
  with Adult, to choose VIPS-BLR's default M-step and schedule (issue 35; docs/schedules.md), so they are
  no longer held out for VIPS-BLR.
- mlc_churn: MLC telecom churn (vips/datasets/mlc_churn.py; N 3,500, d 17), the same methods: held out
  from every choice of VIPS-BLR's M-step and schedule (issue 35).
- fig6: the VIPS paper's Fig. 6 setting: sampling rate q = 0.004 (S = 130), T = 100, delta = 1e-3,
  sigma in {0, 1, 6, 12}: VIPS-BLR (rho_t = (1 + t)^-0.7) vs DPVI with a small step size (0.05, the
  kind a fixed-budget comparison uses) and with the step size tuned here (0.5).
- regression: diabetes (scikit-learn; vips.datasets.regression), test RMSE in the target's original
  units at epsilon in {0.1, 0.3, 1, 3} (delta = 1e-5): VIPS linear regression (batch, T = 5) and DP-SEP
  (batch, T = 5, noise variance 0.1), against ridge regression and predicting the training mean.

    python -m bench.compare_algorithms [--quick] [--seeds N] [--out DIR]

Writes compare_algorithms.md and compare_algorithms.png to --out (bench/out by default).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sklearn.linear_model import Ridge

from bench.adult_blr import Row, diffprivlib_row, log, markdown, sklearn_row, test_auc
from vips.datasets.adult import TabularData, load_adult
from vips.datasets.mlc_churn import load_mlc_churn
from vips.datasets.regression import RegressionSplit, load_regression
from vips.datasets.telco import load_telco
from vips.estimators import (
    DPSEPLinearRegression,
    DPSEPLogisticRegression,
    DPVILogisticRegression,
    VipsEstimator,
    VIPSLinearRegression,
    VIPSLogisticRegression,
)

EPSILONS: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0)
SECTIONS: tuple[str, ...] = ("adult", "telco", "synthetic", "mlc_churn", "fig6", "regression")
#: The other tabular datasets' methods (Telco, synthetic): VIPS both ways, DPVI and DP-SEP.
TELCO_METHODS: tuple[str, ...] = ("VIPS-BLR (auto)", "VIPS-BLR (T 10)", "DPVI (auto)", "DP-SEP")
#: The synthetic section: N rows of d features in the unit ball, labels from a known logistic model.
SYNTHETIC_ROWS, SYNTHETIC_TEST_ROWS, SYNTHETIC_DIMENSION = 20_000, 10_000, 20
DELTA = 1e-5
FIG6_RATE, FIG6_ITERATIONS, FIG6_DELTA = 0.004, 100, 1e-3
FIG6_SIGMAS: tuple[float, ...] = (0.0, 1.0, 6.0, 12.0)

#: Each algorithm's schedule on Adult: (name, estimator for a given epsilon or sigma).
Make = Callable[[float | None, float | None, int | None], VipsEstimator]


def adult_makers(population: int) -> dict[str, tuple[str, Make]]:
    """Per method: its setting and a factory (epsilon, sigma, random_state) -> estimator."""
    return {
        "VIPS-BLR (auto)": (
            "only epsilon: T and S chosen by control.planning.schedules (docs/schedules.md), rho = 1/t",
            lambda eps, sigma, seed: VIPSLogisticRegression(
                epsilon=eps, sigma=sigma, delta=DELTA, random_state=seed
            ),
        ),
        "VIPS-BLR (T 10)": (
            "batch S = N, T = 10 (every job's schedule before issue 35), rho = 1/t",
            lambda eps, sigma, seed: VIPSLogisticRegression(
                epsilon=eps, sigma=sigma, delta=DELTA, iterations=10, random_state=seed
            ),
        ),
        "VIPS-BLR (paper's M-step)": (
            "batch S = N, T = 10, rho = 1/t, noise_aware 0",
            lambda eps, sigma, seed: VIPSLogisticRegression(
                epsilon=eps, sigma=sigma, delta=DELTA, iterations=10, random_state=seed, noise_aware=False
            ),
        ),
        "DPVI": (
            "S = 1000, T = 300, AdaGrad 0.5, clip 1",
            lambda eps, sigma, seed: DPVILogisticRegression(
                epsilon=eps,
                sigma=sigma,
                delta=DELTA,
                batch_size=1000,
                iterations=300,
                learning_rate=0.5,
                clip=1.0,
                random_state=seed,
            ),
        ),
        "DPVI (auto)": (
            "only epsilon: its usual S = N/50, T = 1000 (control.planning.schedules), its default options",
            lambda eps, sigma, seed: DPVILogisticRegression(
                epsilon=eps, sigma=sigma, delta=DELTA, random_state=seed
            ),
        ),
        "DP-SEP": (
            "batch S = N, T = 5, clip 0.5, damping 1/t",
            lambda eps, sigma, seed: DPSEPLogisticRegression(
                epsilon=eps,
                sigma=sigma,
                delta=DELTA,
                batch_size=population,
                iterations=5,
                clip=0.5,
                random_state=seed,
            ),
        ),
    }


def estimator_row(
    section: str,
    method: str,
    setting: str,
    train: TabularData,
    test: TabularData,
    fits: Sequence[VipsEstimator],
) -> Row:
    row = Row(section, method, setting, math.nan, DELTA)
    for model in fits:
        model.fit(train.features, train.labels)  # type: ignore[attr-defined]
        row.epsilon = float(model.epsilon_)
        if math.isinf(row.epsilon):
            row.delta = None
        row.aucs.append(test_auc(model.predict_proba, test))  # type: ignore[attr-defined]
    return row


def adult_section(
    train: TabularData,
    test: TabularData,
    seeds: int,
    epsilons: Sequence[float],
    section: str = "adult",
    methods: Sequence[str] | None = None,
) -> list[Row]:
    """Each method's test AUC at each epsilon (and non-private) on one tabular dataset."""
    rows: list[Row] = []

    def add(row: Row) -> None:
        rows.append(row)
        log(
            f"[{row.section}] {row.method} | {row.setting} | eps {row.epsilon:.3g}: "
            f"AUC {row.mean:.4f} +- {row.std:.4f}"
        )

    private_free = "non-private" if section == "adult" else f"{section} non-private"
    reference = sklearn_row(train, test)
    reference.section = private_free
    add(reference)
    makers = {
        name: maker
        for name, maker in adult_makers(train.features.shape[0]).items()
        if methods is None or name in methods
    }
    for method, (setting, make) in makers.items():
        add(estimator_row(private_free, method, setting, train, test, [make(None, 0.0, s) for s in range(3)]))
    for epsilon in epsilons:
        for method, (setting, make) in makers.items():
            row = estimator_row(
                section, method, setting, train, test, [make(epsilon, None, None) for _ in range(seeds)]
            )
            row.target = epsilon
            add(row)
        dp = diffprivlib_row(train, test, epsilon, seeds)
        dp.section = section
        add(dp)
    return rows


def synthetic_split() -> tuple[TabularData, TabularData]:
    """Logistic data of known weights (public, generated): x uniform in direction with norm ~ U(0, 1),
    w ~ N(0, 8^2 I), y ~ Bernoulli(sigmoid(w^T x)) (test AUC of the true weights ~0.85); a fixed seed,
    train and test drawn alike."""
    rng = np.random.default_rng(35)
    weights = rng.normal(0.0, 8.0, SYNTHETIC_DIMENSION)

    def draw(rows: int) -> TabularData:
        directions = rng.normal(size=(rows, SYNTHETIC_DIMENSION))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        x = directions * rng.uniform(0.0, 1.0, size=(rows, 1))
        y = (rng.uniform(size=rows) < 1.0 / (1.0 + np.exp(-(x @ weights)))).astype(np.float64)
        return TabularData(x, y, [f"x{j}" for j in range(SYNTHETIC_DIMENSION)])

    return draw(SYNTHETIC_ROWS), draw(SYNTHETIC_TEST_ROWS)


def fig6_section(train: TabularData, test: TabularData, seeds: int) -> list[Row]:
    batch = round(FIG6_RATE * train.features.shape[0])
    rows: list[Row] = []
    for sigma in FIG6_SIGMAS:
        seed_of = (lambda s: s) if sigma == 0 else (lambda s: None)
        vips = [
            VIPSLogisticRegression(
                sigma=sigma,
                delta=FIG6_DELTA,
                batch_size=batch,
                iterations=FIG6_ITERATIONS,
                tau0=1.0,
                kappa=0.7,
                random_state=seed_of(s),
            )
            for s in range(seeds)
        ]
        setting = f"S = {batch}, T = {FIG6_ITERATIONS}, sigma = {sigma:g}"
        rows.append(estimator_row("fig6", "VIPS-BLR", f"{setting}, rho = (1 + t)^-0.7", train, test, vips))
        for rate in (0.05, 0.5):
            dpvi = [
                DPVILogisticRegression(
                    sigma=sigma,
                    delta=FIG6_DELTA,
                    batch_size=batch,
                    iterations=FIG6_ITERATIONS,
                    learning_rate=rate,
                    clip=1.0,
                    random_state=seed_of(s),
                )
                for s in range(seeds)
            ]
            rows.append(estimator_row("fig6", "DPVI", f"{setting}, AdaGrad {rate:g}", train, test, dpvi))
        for row in rows[-3:]:
            row.delta = None if sigma == 0 else FIG6_DELTA
            log(
                f"[fig6] {row.method} | {row.setting}: eps {row.epsilon:.3g}, "
                f"AUC {row.mean:.4f} +- {row.std:.4f}"
            )
    return rows


@dataclass
class RegressionRow:
    method: str
    setting: str
    epsilon: float
    rmse: list[float] = field(default_factory=list)


def regression_section(split: RegressionSplit, seeds: int, epsilons: Sequence[float]) -> list[RegressionRow]:
    train, test = split.train, split.test
    scale = split.target_scale  # RMSE in the target's original units

    def rmse(predictions: np.ndarray) -> float:
        return float(np.sqrt(np.mean((predictions - test.targets) ** 2)) * scale)

    ridge = Ridge(alpha=1.0, fit_intercept=False).fit(train.features, train.targets)
    rows = [
        RegressionRow(
            "ridge regression (non-private)", "alpha = 1", math.inf, [rmse(ridge.predict(test.features))]
        ),
        RegressionRow(
            "training mean (non-private)",
            "-",
            math.inf,
            [rmse(np.full(test.targets.shape, train.targets.mean()))],
        ),
    ]
    makers: dict[str, tuple[str, Callable[[float], VipsEstimator]]] = {
        "VIPS linear regression": (
            "batch, T = 5",
            lambda eps: VIPSLinearRegression(epsilon=eps, delta=DELTA, iterations=5),
        ),
        "DP-SEP linear regression": (
            "batch, T = 5, noise-aware (the rule's clip)",
            lambda eps: DPSEPLinearRegression(epsilon=eps, delta=DELTA, iterations=5),
        ),
        "DP-SEP linear regression, the paper's model": (
            "batch, T = 5, noise variance 0.1",
            lambda eps: DPSEPLinearRegression(
                epsilon=eps, delta=DELTA, iterations=5, noise_variance=0.1, noise_aware=False
            ),
        ),
    }
    for epsilon in epsilons:
        for method, (setting, make) in makers.items():
            row = RegressionRow(method, setting, epsilon)
            for _ in range(seeds):
                model = make(epsilon)
                model.fit(train.features, train.targets)  # type: ignore[attr-defined]
                row.rmse.append(rmse(model.predict(test.features)))  # type: ignore[attr-defined]
            rows.append(row)
            log(
                f"[regression] {method} eps {epsilon:g}: "
                f"RMSE {np.mean(row.rmse):.2f} +- {np.std(row.rmse):.2f}"
            )
    return rows


def regression_markdown(rows: Sequence[RegressionRow], split: RegressionSplit) -> str:
    lines = [
        f"Diabetes ({split.source}): {split.train.features.shape[0]} train / "
        f"{split.test.features.shape[0]} test "
        "rows; test RMSE in the target's units (mean +- std over runs).",
        "",
        "| method | setting | epsilon | test RMSE | runs |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        eps = "inf" if math.isinf(row.epsilon) else f"{row.epsilon:g}"
        lines.append(
            f"| {row.method} | {row.setting} | {eps} | {np.mean(row.rmse):.2f} +- {np.std(row.rmse):.2f} "
            f"| {len(row.rmse)} |"
        )
    return "\n".join(lines) + "\n"


def plot(adult: Sequence[Row], fig6: Sequence[Row], regression: Sequence[RegressionRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(16.0, 4.5))
    for method in ("VIPS-BLR (auto)", "DPVI (auto)", "DPVI", "DP-SEP", "diffprivlib LogisticRegression"):
        series = [r for r in adult if r.section == "adult" and r.method == method and r.aucs]
        if series:
            left.errorbar(
                [r.target if not math.isnan(r.target) else r.epsilon for r in series],
                [r.mean for r in series],
                yerr=[r.std for r in series],
                fmt="o-",
                capsize=3,
                label=method,
            )
    for row in adult:
        if row.section == "non-private" and row.method == "scikit-learn LogisticRegression":
            left.axhline(row.mean, color="k", linestyle=":", label="scikit-learn (non-private)")
    left.set_xscale("log")
    left.set_xlabel("epsilon (delta = 1e-5; diffprivlib: pure)")
    left.set_ylabel("test AUC (Adult)")
    left.set_title("Adult: AUC against epsilon")
    left.legend(fontsize=7)
    labels = sorted({(r.method, r.setting.rsplit(", ", 1)[-1]) for r in fig6})
    for offset, (method, variant) in enumerate(labels):
        series = [r for r in fig6 if r.method == method and r.setting.endswith(variant)]
        xs = [
            FIG6_SIGMAS.index(float(r.setting.split("sigma = ")[1].split(",")[0])) + 0.2 * (offset - 1)
            for r in series
        ]
        middle.errorbar(
            xs,
            [r.mean for r in series],
            yerr=[r.std for r in series],
            fmt="o",
            capsize=3,
            label=f"{method}, {variant}",
        )
    middle.set_xticks(range(len(FIG6_SIGMAS)), [f"sigma {s:g}" for s in FIG6_SIGMAS])
    middle.set_ylabel("test AUC (Adult)")
    middle.set_title("VIPS paper Fig. 6 setting (q = 0.004, T = 100)")
    middle.legend(fontsize=7)
    for method in ("VIPS linear regression", "DP-SEP linear regression"):
        series = [r for r in regression if r.method == method]
        right.errorbar(
            [r.epsilon for r in series],
            [np.mean(r.rmse) for r in series],
            yerr=[np.std(r.rmse) for r in series],
            fmt="o-",
            capsize=3,
            label=method,
        )
    for row, style in zip([r for r in regression if math.isinf(r.epsilon)], (":", "--"), strict=False):
        right.axhline(float(np.mean(row.rmse)), color="k", linestyle=style, label=row.method)
    right.set_xscale("log")
    right.set_xlabel("epsilon (delta = 1e-5)")
    right.set_ylabel("test RMSE (diabetes)")
    right.set_title("Linear regression: RMSE against epsilon")
    right.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="3 repeats and two epsilons (a smoke run)")
    parser.add_argument(
        "--seeds", type=int, default=None, help="repeats per private setting (10; 3 with --quick)"
    )
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {', '.join(SECTIONS)}"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (3 if args.quick else 10)
    epsilons = (0.3, 2.0) if args.quick else EPSILONS
    sections = set(args.sections.split(","))
    if unknown := sections - set(SECTIONS):
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}; expected {', '.join(SECTIONS)}")
    start = time.perf_counter()
    train, test = load_adult("train"), load_adult("test")
    adult = adult_section(train, test, seeds, epsilons) if "adult" in sections else []
    telco = (
        adult_section(
            load_telco("train"), load_telco("test"), seeds, epsilons, section="telco", methods=TELCO_METHODS
        )
        if "telco" in sections
        else []
    )
    synthetic = (
        adult_section(*synthetic_split(), seeds, epsilons, section="synthetic", methods=TELCO_METHODS)
        if "synthetic" in sections
        else []
    )
    churn = (
        adult_section(
            load_mlc_churn("train"),
            load_mlc_churn("test"),
            seeds,
            epsilons,
            section="mlc_churn",
            methods=TELCO_METHODS,
        )
        if "mlc_churn" in sections
        else []
    )
    fig6 = fig6_section(train, test, seeds) if "fig6" in sections else []
    split = load_regression("auto")
    regression = regression_section(split, seeds, epsilons) if "regression" in sections else []
    elapsed = time.perf_counter() - start
    flags = (" --quick" if args.quick else "") + (
        f" --sections {args.sections}" if sections != set(SECTIONS) else ""
    )
    parts = [markdown(rows) for rows in (adult, telco, synthetic, churn, fig6) if rows]
    if regression:
        parts.append(regression_markdown(regression, split))
    text = f"Produced by `python -m bench.compare_algorithms{flags}` in {elapsed:.0f} s.\n\n"
    text += "\n".join(parts)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "compare_algorithms" + ("_quick" if args.quick else "")
    if sections != set(SECTIONS):
        stem += "_" + "_".join(name for name in SECTIONS if name in sections)
    (args.out / f"{stem}.md").write_text(text, encoding="utf-8")
    if adult and fig6 and regression:
        plot(adult, fig6, regression, args.out / f"{stem}.png")
    log(f"wrote {args.out / stem}.md" + (" and the .png beside it" if adult and fig6 and regression else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
