"""The grids the automatic schedules (service.schedules) are read off, and their check on held-out data.

- blr: VIPS-BLR on Adult (train -> official test AUC, delta 1e-5) at epsilon in {0.1, 0.3, 1, 3}, over
  iterations T in {1, 2, 3, 5, 10, 20} and batch S in {N, N/5}; the best (T, S) per epsilon, and the
  privacy scale epsilon x N at which each T wins (the rule's rows).
- heldout: on Telco churn (never used to tune), VIPS-BLR with only epsilon (the rule), DPVI with only
  epsilon (its rule) and DPVI's usual schedule (T 1000, S N/50) at epsilon in {0.1, 0.3, 1}.

    python -m bench.schedules [--section blr|heldout|all] [--seeds N] [--out DIR]

Private fits cannot be seeded: "seeds" are independent repeats; cells are mean ± standard deviation.
Writes schedules.md to --out (bench/out by default).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.adult_blr import log, test_auc
from service.schedules import choose_schedule
from worker.datasets.adult import TabularData, load_adult
from worker.datasets.telco import load_telco
from worker.estimator import DPVILogisticRegression, VipsEstimator, VIPSLogisticRegression

DELTA = 1e-5
EPSILONS: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0)
HELDOUT_EPSILONS: tuple[float, ...] = (0.1, 0.3, 1.0)
ITERATIONS: tuple[int, ...] = (1, 2, 3, 5, 10, 20)
BATCH_FRACTIONS: tuple[float, ...] = (1.0, 0.2)


def aucs(
    estimator: type[VipsEstimator],
    settings: dict[str, Any],
    train: TabularData,
    test: TabularData,
    seeds: int,
) -> list[float]:
    """Test AUCs of `seeds` independent fits of estimator(**settings) at delta 1e-5."""
    found = []
    for _ in range(seeds):
        model = estimator(delta=DELTA, **settings)
        model.fit(train.features, train.labels)  # type: ignore[attr-defined]
        found.append(test_auc(model.predict_proba, test))  # type: ignore[attr-defined]
    return found


def cell(values: Sequence[float]) -> str:
    return f"{np.mean(values):.4f} ± {np.std(values):.4f}"


def blr_grid(seeds: int) -> str:
    """The VIPS-BLR grid on Adult as markdown, with the best schedule per epsilon."""
    train, test = load_adult("train"), load_adult("test")
    n = len(train.labels)
    header = "| epsilon (epsilon x N) | " + " | ".join(f"T {t}" for t in ITERATIONS) + " | best |"
    lines = [header, "|---" * (len(ITERATIONS) + 2) + "|"]
    for epsilon in EPSILONS:
        for fraction in BATCH_FRACTIONS:
            batch = round(fraction * n)
            means, cells = {}, []
            for iterations in ITERATIONS:
                start = time.perf_counter()
                settings = {"epsilon": epsilon, "iterations": iterations, "batch_size": batch}
                found = aucs(VIPSLogisticRegression, settings, train, test, seeds)
                means[iterations] = float(np.mean(found))
                cells.append(cell(found))
                seconds = time.perf_counter() - start
                log(f"blr eps {epsilon} S {batch} T {iterations}: {cell(found)} ({seconds:.1f} s)")
            best = max(means, key=lambda t: means[t])
            label = f"{epsilon:g} ({epsilon * n:,.0f}), S = {fraction:g} N"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | T {best} |")
    return "\n".join(lines)


def heldout(seeds: int) -> str:
    """VIPS (rule) against DPVI (rule and usual schedule) on Telco, which no rule was tuned on."""
    train, test = load_telco("train"), load_telco("test")
    n = len(train.labels)
    lines = [
        "| epsilon | VIPS-BLR (auto) | DPVI (auto) | DPVI (T 1000, S N/50) | VIPS schedule |",
        "|---|---|---|---|---|",
    ]
    for epsilon in HELDOUT_EPSILONS:
        vips = aucs(VIPSLogisticRegression, {"epsilon": epsilon}, train, test, seeds)
        dpvi = aucs(DPVILogisticRegression, {"epsilon": epsilon}, train, test, seeds)
        usual_settings = {"epsilon": epsilon, "iterations": 1000, "batch_size": n // 50}
        usual = aucs(DPVILogisticRegression, usual_settings, train, test, seeds)
        chosen = choose_schedule("blr", "vips", n, epsilon)
        lines.append(
            f"| {epsilon:g} | {cell(vips)} | {cell(dpvi)} | {cell(usual)} | "
            f"T {chosen.iterations}, S {chosen.batch_size} |"
        )
        log(lines[-1])
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--section", choices=("blr", "heldout", "all"), default="all")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args(argv)
    parts = []
    if args.section in ("blr", "all"):
        parts.append("## VIPS-BLR on Adult: test AUC by T and S\n\n" + blr_grid(args.seeds))
    if args.section in ("heldout", "all"):
        parts.append("## Held out: Telco churn, test AUC\n\n" + heldout(args.seeds))
    args.out.mkdir(parents=True, exist_ok=True)
    text = f"# Schedules ({args.seeds} repeats per cell)\n\n" + "\n\n".join(parts) + "\n"
    (args.out / "schedules.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
