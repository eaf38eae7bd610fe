"""Regression from the command line: `vips fit --local --kind regression` with VIPS and DP-SEP, then
`vips predict` (predictive mean and variance) and `vips evaluate` (RMSE), on scikit-learn's diabetes data;
and DP-SEP / DPVI logistic regression fitted locally through the same verbs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.linear_model import Ridge

from tests.test_cli import run_error, run_ok
from vips.cli import main
from vips.datasets.regression import RegressionData, load_regression


def write_csv(path: Path, data: RegressionData) -> Path:
    header = ",".join([*data.feature_names, "y"])
    rows = [",".join(f"{v:.17g}" for v in [*x, y]) for x, y in zip(data.features, data.targets, strict=True)]
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.fixture(scope="module")
def diabetes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    """Train and test CSVs (rows of norm <= 1, targets in [-1, 1]) and the test RMSE of ridge regression
    with the same penalty as the default prior (lambda0 = 1)."""
    root = tmp_path_factory.mktemp("diabetes")
    split = load_regression("diabetes")
    ridge = Ridge(alpha=1.0, fit_intercept=False).fit(split.train.features, split.train.targets)
    residual = ridge.predict(split.test.features) - split.test.targets
    return (
        write_csv(root / "train.csv", split.train),
        write_csv(root / "test.csv", split.test),
        float(np.sqrt(np.mean(residual**2))),
    )


def fit_argv(train: Path, *extra: str) -> list[str]:
    local = ["fit", "--local", "--kind", "regression", "--input", str(train), "--label", "y"]
    return [*local, "--model", "linreg", *extra]


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [
        ("vips", []),
        ("dpsep", []),
        ("dpsep", ["--option", "noise_aware=0", "--option", "noise_variance=0.1"]),
    ],
)
def test_linear_regression_without_noise_matches_ridge(
    capsys: pytest.CaptureFixture[str],
    diabetes: tuple[Path, Path, float],
    tmp_path: Path,
    algorithm: str,
    extra: list[str],
) -> None:
    train, test, ridge_rmse = diabetes
    posterior = tmp_path / "linreg.json"
    run_ok(capsys, fit_argv(train, "--algorithm", algorithm, "--sigma", "0", "--iterations", "10", *extra,
                            "-o", str(posterior)))  # fmt: skip
    document = json.loads(posterior.read_text())
    assert (document["model"], document["algorithm"]) == ("linreg", algorithm)
    metrics = run_ok(
        capsys, ["evaluate", "--posterior", str(posterior), "--input", str(test), "--label", "y"]
    )
    assert metrics["n"] == 88
    # VIPS's batch posterior mean is ridge's estimate exactly (tests/vips/models/linreg/test_model.py), and so
    # is noise-aware DP-SEP's without noise (the same Normal-Gamma posterior); the paper's DP-SEP with a fixed
    # noise variance of 0.1 weighs the same prior differently: observed 0.997x ridge's RMSE.
    assert metrics["rmse"] == pytest.approx(ridge_rmse, rel=0.02)
    targets = np.loadtxt(test, delimiter=",", skiprows=1)[:, -1]
    assert metrics["baseline"]["rmse"] == pytest.approx(targets.std())
    assert metrics["rmse"] < metrics["baseline"]["rmse"]
    out = tmp_path / "predictions.csv"
    assert main(["predict", "--posterior", str(posterior), "--input", str(test), "--label", "y",
                 "-o", str(out)]) == 0  # fmt: skip
    header, *lines = out.read_text().splitlines()
    values = np.array([[float(v) for v in line.split(",")] for line in lines])
    assert header == "mean,variance" and values.shape == (88, 2) and np.all(values[:, 1] > 0)


def test_private_linear_regression_spends_at_most_epsilon(
    capsys: pytest.CaptureFixture[str], diabetes: tuple[Path, Path, float]
) -> None:
    train, _, _ = diabetes
    for algorithm in ("vips", "dpsep"):
        private = ["--epsilon", "1", "--iterations", "5", "--batch-size", "100"]
        summary = run_ok(capsys, fit_argv(train, "--algorithm", algorithm, *private))
        assert summary["algorithm"] == algorithm and 0 < summary["epsilon"] <= 1.0


def test_regression_input_errors(
    capsys: pytest.CaptureFixture[str], diabetes: tuple[Path, Path, float], tmp_path: Path
) -> None:
    train, _, _ = diabetes
    lines = train.read_text().splitlines()
    too_large = tmp_path / "large.csv"
    too_large.write_text("\n".join([lines[0], lines[1].rsplit(",", 1)[0] + ",1.5", *lines[2:]]) + "\n")
    error = run_error(capsys, fit_argv(too_large, "--sigma", "0"))
    assert "row 0" in error and "|y| > 1" in error and "1.5" not in error
    assert "fits model blr" in run_error(capsys, fit_argv(train, "--algorithm", "dpvi", "--sigma", "0"))
    assert "--kind regression" in run_error(
        capsys, ["fit", "--local", "--kind", "tabular", "--input", str(train), "--label", "y", "--model",
                 "linreg", "--sigma", "0"]
    )  # fmt: skip
