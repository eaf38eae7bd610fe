"""Does a refactor change behaviour? Seeded public fits of every model and algorithm, and the OpenAPI
document, written to a file that a run on another commit is compared with (issue 53: "no behaviour change:
seeded public fits give byte-identical posteriors before and after").

Each fit is sigma = 0 with random_state 0 (the only fits that can be seeded) on small synthetic data drawn
from a fixed generator: logistic and linear regression (400 rows, d 5, rows of norm < 1), LDA (200
documents over 40 words, 3 topics) and the SBN (200 images of 16 pixels, 4 hidden units), each through
`from vips import`, the public path every commit has. The posterior documents are kept whole but for
their job ids.

    python -m bench.identical_fits OUT.json                 # on each commit (e.g. a git worktree)
    python -m bench.identical_fits --compare BEFORE.json AFTER.json

--compare prints, per fit and for the OpenAPI document, "identical" or each differing path with both values.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp


def fits() -> dict[str, dict[str, Any]]:
    """Each (model, algorithm)'s posterior document from its seeded sigma-0 fit, without its job id."""
    from vips import (
        DPSEPLinearRegression,
        DPSEPLogisticRegression,
        DPVILogisticRegression,
        VIPSLatentDirichletAllocation,
        VIPSLinearRegression,
        VIPSLogisticRegression,
        VIPSSigmoidBeliefNetwork,
    )

    rng = np.random.default_rng(7)
    x = rng.normal(size=(400, 5))
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True)) * 1.01
    w = rng.normal(size=5)
    labels = (rng.uniform(size=400) < 1.0 / (1.0 + np.exp(-3.0 * x @ w))).astype(float)
    targets = np.clip(0.3 * x @ w + rng.normal(0.0, 0.1, 400), -1.0, 1.0)
    counts = sp.csr_array(rng.poisson(0.3, size=(200, 40)).astype(float))
    images = (rng.uniform(size=(200, 16)) < 0.4).astype(float)
    seeded: dict[str, Any] = {"sigma": 0.0, "random_state": 0}
    runs: dict[str, tuple[Any, Any, Any]] = {
        "blr vips": (VIPSLogisticRegression(**seeded, iterations=4), x, labels),
        "blr dpvi": (DPVILogisticRegression(**seeded, iterations=30), x, labels),
        "blr dpsep": (DPSEPLogisticRegression(**seeded, iterations=4), x, labels),
        "linreg vips": (VIPSLinearRegression(**seeded, iterations=3), x, targets),
        "linreg dpsep": (DPSEPLinearRegression(**seeded, iterations=3), x, targets),
        "lda vips": (VIPSLatentDirichletAllocation(**seeded, iterations=3, topics=3), counts, None),
        "sbn vips": (VIPSSigmoidBeliefNetwork(**seeded, iterations=3, hidden=4), images, None),
    }
    documents = {}
    for name, (estimator, data, target) in runs.items():
        estimator.fit(data) if target is None else estimator.fit(data, target)
        documents[name] = {key: value for key, value in estimator.posterior_.items() if key != "job_id"}
    return documents


def differences(before: Any, after: Any, path: str = "") -> list[str]:
    """Each path at which two JSON values differ, with both values (shortened)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [
            line
            for key in sorted(set(before) | set(after), key=str)
            for line in differences(before.get(key), after.get(key), f"{path}/{key}")
        ]
    if before == after:
        return []
    return [f"  {path or '/'}: {str(before)[:120]!r} -> {str(after)[:120]!r}"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("out", nargs="?", type=Path, help="where to write this commit's fits")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(path.read_text()) for path in args.compare)
        changed = 0
        for name in sorted(set(before) | set(after)):
            lines = differences(before.get(name), after.get(name))
            print(f"{name}: {'identical' if not lines else 'differs'}", *lines, sep="\n")
            changed += bool(lines)
        return 1 if changed else 0
    if args.out is None:
        parser.error("give OUT, or --compare BEFORE AFTER")
    from service.app import create_app

    found: dict[str, Any] = {**fits(), "openapi": create_app().openapi()}
    args.out.write_text(json.dumps(found, sort_keys=True, default=str))
    print(f"{len(found)} documents written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
