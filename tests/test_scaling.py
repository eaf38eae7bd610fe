"""Scaling from public bounds (vips.preprocessing, `vips scale`): rows land in the unit ball the wall
requires, the map is the documented affine one, and the output is accepted by ingestion's bound checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.pipeline import make_pipeline

from privacy_wall.data.formats import read_tabular_csv
from privacy_wall.data.store import check_regression_bounds, check_tabular_bounds
from vips.cli import main
from vips.estimators import VIPSLogisticRegression
from vips.preprocessing import PublicBoundsScaler, from_unit_interval, to_unit_interval

LOWER, UPPER = [0.0, 18.0, -5.0], [10.0, 90.0, 5.0]


def raw_rows(n: int = 400, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # the third column reaches past its public bounds: those values are clipped
    return np.column_stack([rng.uniform(0, 10, n), rng.uniform(18, 90, n), rng.normal(0, 4, n)])


def test_every_row_has_norm_at_most_one_and_the_map_is_affine() -> None:
    x = raw_rows()
    scaled = PublicBoundsScaler(LOWER, UPPER).fit_transform(x)
    assert scaled.shape == (400, 4)
    assert np.max(np.linalg.norm(scaled, axis=1)) <= 1.0
    # the corners of the box reach the bound: no needless shrinking
    corner = PublicBoundsScaler(LOWER, UPPER).fit_transform(np.array([UPPER]))
    assert np.linalg.norm(corner) == pytest.approx(1.0, abs=1e-9)
    inside = np.abs(x[:, 2]) <= 5
    expected = (2 * (x[inside, 2] + 5) / 10 - 1) / 2.0  # sqrt(3 columns + intercept) = 2
    assert np.allclose(scaled[inside, 3], expected, atol=1e-9)
    assert np.allclose(scaled[:, 0], 0.5, atol=1e-9)  # the intercept column, scaled like the rest


def test_fit_reads_no_data_but_the_width() -> None:
    a = PublicBoundsScaler(LOWER, UPPER).fit(raw_rows(seed=1))
    b = PublicBoundsScaler(LOWER, UPPER).fit(raw_rows(seed=2) * 100)
    probe = raw_rows(seed=3)
    assert np.array_equal(a.transform(probe), b.transform(probe))
    with pytest.raises(ValueError, match="3 bounds for 2 columns"):
        PublicBoundsScaler(LOWER, UPPER).fit(probe[:, :2])
    with pytest.raises(ValueError, match="exceed its lower bound"):
        PublicBoundsScaler([0, 1], [1, 1]).fit(probe[:, :2])


def test_target_scaling_round_trips() -> None:
    y = np.array([25.0, 100.0, 346.0])
    unit = to_unit_interval(y, 25.0, 346.0)
    assert np.allclose(unit, [-1.0, 2 * 75 / 321 - 1, 1.0])
    assert np.allclose(from_unit_interval(unit, 25.0, 346.0), y)


def test_in_a_pipeline_before_a_private_estimator() -> None:
    x = raw_rows(n=2000)
    y = (x[:, 0] - 5 + 0.1 * x[:, 2] > 0).astype(int)
    pipeline = make_pipeline(
        PublicBoundsScaler(LOWER, UPPER), VIPSLogisticRegression(sigma=0, random_state=0, iterations=5)
    )
    assert pipeline.fit(x, y).score(x, y) > 0.9


def test_vips_scale_writes_rows_the_wall_accepts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    x = raw_rows()
    y = np.linspace(25, 346, len(x))
    raw = tmp_path / "raw.csv"
    raw.write_text(
        "a,age,z,label\n" + "".join(f"{r[0]},{r[1]},{r[2]},{t}\n" for r, t in zip(x, y, strict=True))
    )
    bounds = tmp_path / "bounds.csv"
    bounds.write_text("column,lower,upper\na,0,10\nage,18,90\nz,-5,5\nlabel,25,346\n")
    out = tmp_path / "scaled.csv"
    assert main(["scale", "--input", str(raw), "--bounds", str(bounds), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    clipped = int(np.sum(np.abs(x[:, 2]) > 5))
    assert f"wrote 400 rows of norm <= 1 (4 columns) to {out}; clipped to their bounds: z {clipped}" in err
    table = read_tabular_csv(out, "label", binary_label=False)
    assert table.feature_names == ("intercept", "a", "age", "z")
    assert table.labels is not None
    check_regression_bounds(table.features, table.labels)
    assert table.labels[0] == pytest.approx(-1.0) and table.labels[-1] == pytest.approx(1.0)
    assert np.allclose(table.features, PublicBoundsScaler(LOWER, UPPER).fit_transform(x))


def test_vips_scale_passes_a_binary_label_through(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    raw = tmp_path / "raw.csv"
    raw.write_text("a,label\n3,1\n12,0\n")
    bounds = tmp_path / "bounds.csv"
    bounds.write_text("column,lower,upper\na,0,10\n")
    out = tmp_path / "scaled.csv"
    argv = ["scale", "--input", str(raw), "--bounds", str(bounds), "--no-intercept", "-o", str(out)]
    assert main(argv) == 0
    table = read_tabular_csv(out, "label")
    assert table.feature_names == ("a",) and table.labels is not None
    check_tabular_bounds(table.features, table.labels)
    assert np.allclose(table.features[:, 0], [-0.4, 1.0]) and table.labels.tolist() == [1.0, 0.0]
    assert "a 1" in capsys.readouterr().err  # 12 is above a's bound: clipped (counted, never shown)


@pytest.mark.parametrize(
    ("bounds", "words"),
    [
        ("column,lower,upper\n", "no bounds for column(s) a"),
        ("col,lo,hi\na,0,1\n", "the header must be column,lower,upper"),
        ("column,lower,upper\na,1,1\n", "line 2: need finite bounds with lower < upper"),
        ("column,lower,upper\na,x,1\n", "line 2: lower and upper must be numbers"),
    ],
)
def test_bad_bounds_are_one_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bounds: str, words: str
) -> None:
    raw = tmp_path / "raw.csv"
    raw.write_text("a,label\n3,1\n")
    (tmp_path / "b.csv").write_text(bounds)
    out = tmp_path / "scaled.csv"
    assert main(["scale", "--input", str(raw), "--bounds", str(tmp_path / "b.csv"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vips: error: ") and words in err, err
    assert not out.exists()
