"""DPVI-BLR schedules under the budget's filter: full batch against DPVI's usual minibatches (issue 50).

The filter prices a release on the whole dataset exactly (Gaussian DP: T releases at sigma cost
mu^2 = T / sigma^2) but a subsampled one only by its Renyi curve, so it may change which schedule of
DPVI's noisy clipped gradients learns most at a given epsilon. For each epsilon, each (T, S) below is fitted
with only that schedule given (sigma calibrated by the filter, delta 1e-5, the model's default options)
through the estimator, `--seeds` times (private noise: repeats, not seeds), and scored on held-out rows:
AUC and log loss (a proper score), mean +- standard error. Tuning data: Adult and Telco (public).

    python -m bench.dpvi_schedules [--data adult,telco] [--epsilons 0.3,1,3] [--seeds 3] [--out DIR]

Writes dpvi_schedules.md to --out (bench/out by default).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sklearn.metrics import log_loss, roc_auc_score

from bench.adult_blr import log
from vips.datasets.adult import TabularData, load_adult
from vips.datasets.telco import load_telco
from vips.estimators import DPVILogisticRegression

DELTA = 1e-5
#: (label, T, S as a fraction of N): DPVI's usual schedule first, then full batches and a middle ground.
SCHEDULES: tuple[tuple[str, int, float], ...] = (
    ("usual: T 1000, S N/50", 1000, 1 / 50),
    ("T 300, S N/10", 300, 1 / 10),
    ("full batch, T 30", 30, 1.0),
    ("full batch, T 100", 100, 1.0),
    ("full batch, T 300", 300, 1.0),
    ("full batch, T 1000", 1000, 1.0),
)


def splits(name: str) -> tuple[TabularData, TabularData]:
    if name == "adult":
        return load_adult("train"), load_adult("test")
    if name == "telco":
        return load_telco("train"), load_telco("test")
    raise ValueError(f"unknown data {name!r}")


def scores(
    epsilon: float, iterations: int, fraction: float, train: TabularData, test: TabularData
) -> tuple[float, float]:
    """(AUC, log loss) on `test` of one private fit with this schedule at epsilon."""
    population = train.features.shape[0]
    model = DPVILogisticRegression(
        epsilon=epsilon, delta=DELTA, iterations=iterations, batch_size=max(1, round(fraction * population))
    )
    model.fit(train.features, train.labels)
    p = model.predict_proba(test.features)[:, 1]
    return float(roc_auc_score(test.labels, p)), float(log_loss(test.labels, np.clip(p, 1e-12, 1 - 1e-12)))


def mean_se(values: Sequence[float]) -> str:
    a = np.asarray(values)
    se = a.std(ddof=1) / math.sqrt(len(a)) if len(a) > 1 else 0.0
    return f"{a.mean():.4f} +- {se:.4f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--data", default="adult,telco")
    parser.add_argument("--epsilons", default="0.3,1,3")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--schedules", default="", help="labels to run, separated by ; (default all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args(argv)
    lines = [
        "| data | epsilon | schedule | AUC | log loss | seconds per fit |",
        "|---|---|---|---|---|---|",
    ]
    for name in args.data.split(","):
        train, test = splits(name)
        for epsilon in (float(e) for e in args.epsilons.split(",")):
            for label, iterations, fraction in SCHEDULES:
                if args.schedules and label not in args.schedules.split(";"):
                    continue
                started = time.perf_counter()
                runs = [scores(epsilon, iterations, fraction, train, test) for _ in range(args.seeds)]
                seconds = (time.perf_counter() - started) / args.seeds
                line = (
                    f"| {name} | {epsilon:g} | {label} | {mean_se([r[0] for r in runs])} | "
                    f"{mean_se([r[1] for r in runs])} | {seconds:.1f} |"
                )
                log(line)
                lines.append(line)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dpvi_schedules.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
