"""Issue 12's acceptance check, run as a user would: VIPS-BLR with its defaults against DPVI, through the CLI.

For each dataset and epsilon, repeated fits of
    vips fit --local --kind tabular --model blr --iterations 10 --batch-size N --epsilon E
    vips fit --local --kind tabular --model blr --algorithm dpvi --iterations 1000 --batch-size N/50 \
        --epsilon E
each scored by `vips evaluate` (test AUC). Datasets, none of them used to choose VIPS's defaults:
- adult-alt: UCI Adult under a preprocessing other than vips/datasets/adult.py's: numeric columns
  min-max scaled over other fixed bounds without log scales, '?' as no category at all, an intercept, and
  each row clipped to norm 1 (x / max(1, ||x||)) instead of divided by the largest possible norm;
- telco: IBM Telco churn (vips/datasets/telco.py), the bench's second dataset.

    python -m bench.blr_acceptance [--repeats 5] [--epsilons 0.3,1] [--datasets adult-alt,telco]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vips.datasets.adult import CATEGORICAL, COLUMNS, TabularData, _read_split, write_tabular_csv
from vips.datasets.telco import load_telco

#: Other fixed bounds than vips.datasets.adult's (no log scales).
ALT_BOUNDS: dict[str, tuple[float, float]] = {
    "age": (0.0, 100.0),
    "fnlwgt": (0.0, 1_500_000.0),
    "education-num": (0.0, 20.0),
    "capital-gain": (0.0, 100_000.0),
    "capital-loss": (0.0, 5_000.0),
    "hours-per-week": (0.0, 100.0),
}


def adult_alt(split: str) -> TabularData:
    """Adult encoded differently from the bench's encoding (module docstring)."""
    rows = _read_split("train" if split == "train" else "test")  # type: ignore[arg-type]
    index = {column: i for i, column in enumerate(COLUMNS)}
    n = len(rows)
    blocks = [np.ones((n, 1))]
    names = ["intercept"]
    for column, (low, high) in ALT_BOUNDS.items():
        raw = np.array([float(row[index[column]]) for row in rows])
        blocks.append(np.clip((raw - low) / (high - low), 0.0, 1.0)[:, None])
        names.append(column)
    for column, categories in CATEGORICAL.items():
        lookup = {category: j for j, category in enumerate(categories)}
        onehot = np.zeros((n, len(categories)))
        for i, row in enumerate(rows):
            code = lookup.get(row[index[column]])
            if code is not None:
                onehot[i, code] = 1.0
        blocks.append(onehot)
        names.extend(f"{column}:{category}" for category in categories)
    features = np.hstack(blocks)
    features /= np.maximum(1.0, np.linalg.norm(features, axis=1))[:, None]
    labels = np.array([1.0 if row[-1].rstrip(".") == ">50K" else 0.0 for row in rows])
    return TabularData(features, labels, names)


DATASETS = {"adult-alt": adult_alt, "telco": load_telco}


def vips(*args: str) -> dict[str, object]:
    """Run the installed CLI and parse its last JSON line."""
    done = subprocess.run(
        [sys.executable, "-m", "vips.cli", *args], capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(datasets: Sequence[str], epsilons: Sequence[float], repeats: int) -> str:
    lines = [
        "| dataset | N | epsilon | VIPS-BLR (defaults) | DPVI (S = N/50, T = 1000) | VIPS - DPVI (+- s.e.) |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for name in datasets:
            train, test = DATASETS[name]("train"), DATASETS[name]("test")  # type: ignore[operator]
            write_tabular_csv(train, folder / f"{name}-train.csv")
            write_tabular_csv(test, folder / f"{name}-test.csv")
            n = train.features.shape[0]
            schedules = {
                "vips": ["--iterations", "10", "--batch-size", str(n)],
                "dpvi": ["--algorithm", "dpvi", "--iterations", "1000", "--batch-size", str(n // 50)],
            }
            for epsilon in epsilons:
                aucs: dict[str, list[float]] = {key: [] for key in schedules}
                for repeat in range(repeats):
                    for key, schedule in schedules.items():
                        posterior = folder / f"{name}-{key}-{repeat}.json"
                        vips(
                            "fit", "--local", "--kind", "tabular", "--model", "blr",
                            "--input", str(folder / f"{name}-train.csv"), "--epsilon", str(epsilon),
                            *schedule, "-o", str(posterior),
                        )  # fmt: skip
                        scores = vips(
                            "evaluate", "--posterior", str(posterior),
                            "--input", str(folder / f"{name}-test.csv"),
                        )  # fmt: skip
                        aucs[key].append(float(scores["auc"]))  # type: ignore[arg-type]
                    print(
                        f"[{name} eps {epsilon:g}] repeat {repeat + 1}: vips {aucs['vips'][-1]:.4f} "
                        f"dpvi {aucs['dpvi'][-1]:.4f}",
                        file=sys.stderr,
                        flush=True,
                    )
                v, p = np.array(aucs["vips"]), np.array(aucs["dpvi"])
                se = math.hypot(v.std(ddof=1), p.std(ddof=1)) / math.sqrt(repeats)
                lines.append(
                    f"| {name} | {n} | {epsilon:g} | {v.mean():.4f} +- {v.std(ddof=1):.4f} | "
                    f"{p.mean():.4f} +- {p.std(ddof=1):.4f} | {v.mean() - p.mean():+.4f} +- {se:.4f} |"
                )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epsilons", default="0.3,1")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    table = run(args.datasets.split(","), [float(e) for e in args.epsilons.split(",")], args.repeats)
    text = (
        f"Produced by `python -m bench.blr_acceptance --repeats {args.repeats}` in "
        f"{time.perf_counter() - start:.0f} s (mean test AUC +- std over repeats).\n\n{table}\n"
    )
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "blr_acceptance.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
