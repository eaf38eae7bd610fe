"""VIPS Bayesian logistic regression on UCI Adult: test AUC against privacy (VIPS paper Sec. 6).

Settings (train on adult.data, evaluate ROC AUC on the official adult.test):

- non-private: VIPS-BLR with sigma = 0 in batch mode vs scikit-learn's LogisticRegression (lbfgs, C = 1);
- the paper's minibatch setting: S = round(0.004 N), T = 100, delta = 1e-3, sigma in {0, 1, 6, 12},
  step sizes rho_t = (tau0 + t)^-kappa for a few (tau0, kappa);
- batch mode S = N at epsilon in {0.1, 0.3, 0.8, 1, 3}, delta = 1e-5, T in {3, 5, 10} with rho_t = 1/t
  (the running average of the noisy estimates), and rho_t = 1 at T = 5 for contrast;
- diffprivlib's LogisticRegression (objective perturbation, pure epsilon-DP) at the same epsilons.

    python -m bench.adult_blr [--quick] [--seeds N] [--out DIR]

Private fits cannot be seeded (their noise comes from the OS's CSPRNG): "seeds" are independent repeats.
The full run writes adult_blr.md and adult_blr.png to --out; --quick writes adult_blr_quick.*.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from vips.datasets.adult import TabularData, load_adult
from vips.estimators import VIPSLogisticRegression

EPSILONS: tuple[float, ...] = (0.1, 0.3, 0.8, 1.0, 3.0)
BATCH_DELTA = 1e-5
BATCH_ITERATIONS: tuple[int, ...] = (3, 5, 10)
HEADLINE_ITERATIONS = 10
MINIBATCH_RATE = 0.004
MINIBATCH_ITERATIONS = 100
MINIBATCH_DELTA = 1e-3
MINIBATCH_SIGMAS: tuple[float, ...] = (0.0, 1.0, 6.0, 12.0)
MINIBATCH_SCHEDULES: tuple[tuple[float, float], ...] = ((1.0, 0.7), (1.0, 1.0), (10.0, 0.7))

Array = NDArray[np.float64]


@dataclass
class Row:
    """One line of the results table: repeated fits of one method at one setting."""

    section: str
    method: str
    setting: str
    epsilon: float
    delta: float | None
    aucs: list[float] = field(default_factory=list)
    failures: int = 0
    target: float = math.nan

    @property
    def mean(self) -> float:
        return float(np.mean(self.aucs)) if self.aucs else math.nan

    @property
    def std(self) -> float:
        return float(np.std(self.aucs)) if self.aucs else math.nan


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def test_auc(predict: Callable[[Array], Array], test: TabularData) -> float:
    return float(roc_auc_score(test.labels, predict(test.features)[:, 1]))


def vips_row(
    section: str,
    setting: str,
    train: TabularData,
    test: TabularData,
    runs: int,
    make: Callable[[int], VIPSLogisticRegression],
    *,
    delta: float,
    target_epsilon: float = math.nan,
) -> Row:
    """Fit make(seed) for seed in range(runs); a fit whose Cholesky fails counts as diverged."""
    row = Row(section, "VIPS-BLR", setting, target_epsilon, delta, target=target_epsilon)
    for seed in range(runs):
        model = make(seed)
        try:
            model.fit(train.features, train.labels)
        except np.linalg.LinAlgError:
            row.failures += 1
            continue
        row.epsilon = float(model.epsilon_)
        if math.isinf(row.epsilon):
            row.delta = None
        row.aucs.append(test_auc(model.predict_proba, test))
    return row


def sklearn_row(train: TabularData, test: TabularData) -> Row:
    model = LogisticRegression(solver="lbfgs", C=1.0, max_iter=5000).fit(train.features, train.labels)
    return Row(
        "non-private",
        "scikit-learn LogisticRegression",
        "lbfgs, C = 1",
        math.inf,
        None,
        [test_auc(model.predict_proba, test)],
    )


def diffprivlib_row(train: TabularData, test: TabularData, epsilon: float, runs: int) -> Row:
    from diffprivlib.models import LogisticRegression as DPLogisticRegression

    row = Row("batch", "diffprivlib LogisticRegression", "pure eps-DP, data_norm = 1", epsilon, 0.0)
    for seed in range(runs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = DPLogisticRegression(epsilon=epsilon, data_norm=1.0, random_state=seed)
            model.fit(train.features, train.labels)
        row.aucs.append(test_auc(model.predict_proba, test))
    return row


def run(quick: bool, seeds: int) -> list[Row]:
    train, test = load_adult("train"), load_adult("test")
    n = train.features.shape[0]
    batch_size = round(MINIBATCH_RATE * n)
    rows: list[Row] = []

    def add(row: Row) -> None:
        rows.append(row)
        log(
            f"[{row.section}] {row.method} | {row.setting} | eps {_fmt_eps(row.epsilon)}: "
            f"AUC {row.mean:.4f} +- {row.std:.4f} ({len(row.aucs)} runs, {row.failures} diverged)"
        )

    add(sklearn_row(train, test))
    for iterations in (HEADLINE_ITERATIONS,) if quick else (5, HEADLINE_ITERATIONS):

        def nonprivate(seed: int, iterations: int = iterations) -> VIPSLogisticRegression:
            return VIPSLogisticRegression(sigma=0.0, iterations=iterations, random_state=seed)

        setting = f"batch S = N, sigma = 0, T = {iterations}, rho = 1/t"
        add(vips_row("non-private", setting, train, test, seeds, nonprivate, delta=BATCH_DELTA))

    for sigma in MINIBATCH_SIGMAS:
        for tau0, kappa in MINIBATCH_SCHEDULES[:1] if quick else MINIBATCH_SCHEDULES:

            def minibatch(
                seed: int, sigma: float = sigma, tau0: float = tau0, kappa: float = kappa
            ) -> VIPSLogisticRegression:
                return VIPSLogisticRegression(
                    sigma=sigma,
                    delta=MINIBATCH_DELTA,
                    batch_size=batch_size,
                    iterations=MINIBATCH_ITERATIONS,
                    tau0=tau0,
                    kappa=kappa,
                    random_state=seed if sigma == 0 else None,
                )

            setting = (
                f"S = {batch_size}, T = {MINIBATCH_ITERATIONS}, sigma = {sigma:g}, "
                f"tau0 = {tau0:g}, kappa = {kappa:g}"
            )
            add(vips_row("minibatch", setting, train, test, seeds, minibatch, delta=MINIBATCH_DELTA))

    batch_schedules = [(t, 1.0) for t in ((HEADLINE_ITERATIONS,) if quick else BATCH_ITERATIONS)]
    if not quick:
        batch_schedules.append((5, 0.0))
    for epsilon in (0.8, 1.0) if quick else EPSILONS:
        for iterations, kappa in batch_schedules:

            def batch(
                seed: int, epsilon: float = epsilon, iterations: int = iterations, kappa: float = kappa
            ) -> VIPSLogisticRegression:
                del seed  # private fits cannot be seeded
                return VIPSLogisticRegression(
                    epsilon=epsilon, delta=BATCH_DELTA, iterations=iterations, tau0=0.0, kappa=kappa
                )

            setting = f"S = N, T = {iterations}, rho = {'1/t' if kappa == 1 else '1'}"
            add(
                vips_row(
                    "batch", setting, train, test, seeds, batch, delta=BATCH_DELTA, target_epsilon=epsilon
                )
            )
        add(diffprivlib_row(train, test, epsilon, seeds))
    return rows


def _fmt_eps(value: float) -> str:
    if math.isinf(value):
        return "inf"
    return "-" if math.isnan(value) else f"{value:.3g}"


def markdown(rows: Sequence[Row]) -> str:
    lines = [
        "| section | method | setting | epsilon | delta | test AUC (mean +- std) | runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        delta = "-" if row.delta is None else ("0 (pure)" if row.delta == 0 else f"{row.delta:g}")
        auc = f"{row.mean:.4f} +- {row.std:.4f}" if row.aucs else "diverged"
        runs = f"{len(row.aucs)}" + (f" ({row.failures} diverged)" if row.failures else "")
        lines.append(
            f"| {row.section} | {row.method} | {row.setting} | {_fmt_eps(row.epsilon)} | {delta} | "
            f"{auc} | {runs} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.0, 4.5))
    batch = [r for r in rows if r.section == "batch"]
    for label in sorted({(r.method, r.setting) for r in batch}):
        series = [r for r in batch if (r.method, r.setting) == label and r.aucs]
        if not series:
            continue
        eps = [r.epsilon if r.method != "VIPS-BLR" else round(r.epsilon, 3) for r in series]
        marker = "s--" if label[0].startswith("diffprivlib") else "o-"
        axes.errorbar(
            eps,
            [r.mean for r in series],
            yerr=[r.std for r in series],
            fmt=marker,
            capsize=3,
            label=f"{label[0]} ({label[1]})",
        )
    nonprivate = [r for r in rows if r.section == "non-private"]
    lines = [r for r in nonprivate if r.method != "VIPS-BLR"] + [
        r for r in nonprivate if r.method == "VIPS-BLR"
    ][-1:]
    for row, color, style in zip(lines, ("k", "g"), (":", "-."), strict=False):
        axes.axhline(
            row.mean, color=color, linestyle=style, label=f"{row.method}, {row.setting} (non-private)"
        )
    axes.set_xscale("log")
    axes.set_xlabel("epsilon (VIPS: delta = 1e-5; diffprivlib: pure eps-DP)")
    axes.set_ylabel("test AUC (Adult)")
    axes.set_title("Adult: private logistic regression, batch mode")
    axes.legend(fontsize=7, loc="lower right")
    axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a < 1 minute subset (make run)")
    parser.add_argument("--seeds", type=int, default=None, help="repeats per setting (20; 5 with --quick)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (5 if args.quick else 20)
    if seeds < 1:
        parser.error("--seeds must be >= 1")
    start = time.perf_counter()
    rows = run(args.quick, seeds)
    elapsed = time.perf_counter() - start
    command = (
        "python -m bench.adult_blr"
        + (" --quick" if args.quick else "")
        + (f" --seeds {args.seeds}" if args.seeds is not None else "")
    )
    table = markdown(rows)
    print(table)
    headline = [
        r
        for r in rows
        if r.section == "batch"
        and r.method == "VIPS-BLR"
        and r.setting == f"S = N, T = {HEADLINE_ITERATIONS}, rho = 1/t"
        and r.aucs
        and r.target == 1.0
    ]
    for row in rows:
        if row.section == "non-private":
            print(f"{row.method} ({row.setting}): test AUC {row.mean:.4f}")
    for row in headline:
        print(
            f"VIPS-BLR batch, target eps = 1, delta = {BATCH_DELTA:g}, T = {HEADLINE_ITERATIONS}: "
            f"test AUC {row.mean:.4f} +- {row.std:.4f}, eps spent {row.epsilon:.4f}"
        )
    print(f"({elapsed:.1f} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "adult_blr_quick" if args.quick else "adult_blr"
    (args.out / f"{stem}.md").write_text(
        f"Produced by `{command}` in {elapsed:.0f} s.\n\n{table}", encoding="utf-8"
    )
    plot(rows, args.out / f"{stem}.png")
    log(f"wrote {args.out / (stem + '.md')} and {args.out / (stem + '.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
