"""Input columns matched by name (issue 24 item 4): `vips evaluate` / `vips predict` and the estimators."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.test_cli import run_error, run_ok
from vips.cli import main
from vips.columns import ColumnMismatch, by_name, column_order, input_columns
from vips.estimators import VipsEstimator
from vips.models.registry import public_schema_extra

WEIGHTS = np.array([5.0, -4.0, 3.0, 0.5])
NAMES = ["age", "income", "hours", "tenure"]


def _rows(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, WEIGHTS.size)) * 0.5
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)
    y = (rng.random(n) < 1 / (1 + np.exp(-x @ WEIGHTS))).astype(np.float64)
    return x, y


def _write(path: Path, names: list[str], columns: dict[str, np.ndarray], *, header: bool = True) -> Path:
    table = np.column_stack([columns[name] for name in names])
    np.savetxt(path, table, delimiter=",", header=",".join(names) if header else "", comments="", fmt="%.17g")
    if not header:
        path.write_text(path.read_text().lstrip("\n"))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("columns")
    x, y = _rows(1, 400)
    x_test, y_test = _rows(2, 400)
    train = {**dict(zip(NAMES, x.T, strict=True)), "label": y}
    test = {**dict(zip(NAMES, x_test.T, strict=True)), "label": y_test}
    _write(root / "train.csv", [*NAMES, "label"], train)
    posterior = root / "posterior.json"
    argv = ["fit", "--local", "--kind", "tabular", "--input", str(root / "train.csv"), "--model", "blr"]
    assert main([*argv, "--sigma", "0", "--iterations", "3", "-o", str(posterior)]) == 0
    old = json.loads(posterior.read_text())
    del old["columns"], old["label"]
    (root / "old.json").write_text(json.dumps(old))
    return {"root": root, "test": test, "posterior": posterior, "old": root / "old.json"}


def _evaluate(capsys: pytest.CaptureFixture[str], posterior: Path, path: Path, *extra: str) -> dict[str, Any]:
    capsys.readouterr()
    return run_ok(capsys, ["evaluate", "--posterior", str(posterior), "--input", str(path), *extra])


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same metrics up to rounding in the last bits (the matmul sums the columns in another order)."""
    flat = {key: value for key, value in a.items() if key != "baseline"}
    return a["baseline"] == b["baseline"] and flat == pytest.approx({key: b[key] for key in flat}, rel=1e-12)


def test_a_local_posterior_names_its_columns_and_label(files: dict[str, Any]) -> None:
    document = json.loads(Path(files["posterior"]).read_text())
    assert document["columns"] == NAMES and document["label"] == "label"


def test_swapped_columns_give_the_same_auc(capsys: pytest.CaptureFixture[str], files: dict[str, Any]) -> None:
    root, test = files["root"], files["test"]
    original = _write(root / "test.csv", [*NAMES, "label"], test)
    swapped = _write(root / "swapped.csv", ["label", "income", "age", "tenure", "hours"], test)
    expected = _evaluate(capsys, files["posterior"], original)
    result = _evaluate(capsys, files["posterior"], swapped)
    assert result["auc"] == expected["auc"] > 0.8
    assert _same(result, expected)

    # predict gives the same probabilities too, and drops the posterior's label column by itself
    out = [root / "p1.csv", root / "p2.csv"]
    for path, target in zip((original, swapped), out, strict=True):
        assert (
            main(["predict", "--posterior", str(files["posterior"]), "--input", str(path), "-o", str(target)])
            == 0
        )
    p1, p2 = (np.loadtxt(path, skiprows=1) for path in out)
    np.testing.assert_allclose(p1, p2, rtol=1e-12)

    # a posterior written before names were kept: positional as before, and a note says so
    capsys.readouterr()
    assert main(["evaluate", "--posterior", str(files["old"]), "--input", str(swapped)]) == 0
    captured = capsys.readouterr()
    assert "by position" in captured.err
    assert json.loads(captured.out)["auc"] != expected["auc"]


def test_missing_and_unexpected_columns_are_named(
    capsys: pytest.CaptureFixture[str], files: dict[str, Any]
) -> None:
    root, test = files["root"], files["test"]
    missing = _write(root / "missing.csv", ["age", "income", "tenure", "label"], test)
    err = run_error(capsys, ["evaluate", "--posterior", str(files["posterior"]), "--input", str(missing)])
    assert "missing 'hours'" in err and "unexpected" not in err
    extra = {**test, "zip": test["age"], "id": test["age"]}
    unexpected = _write(root / "unexpected.csv", [*NAMES, "zip", "id", "label"], extra)
    err = run_error(capsys, ["evaluate", "--posterior", str(files["posterior"]), "--input", str(unexpected)])
    assert "unexpected 'zip', 'id'" in err and "missing" not in err
    # the values of the file never appear in the errors
    assert f"{test['age'][0]:.6f}"[:6] not in err


def test_a_file_without_header_needs_no_header(
    capsys: pytest.CaptureFixture[str], files: dict[str, Any]
) -> None:
    root, test = files["root"], files["test"]
    bare = _write(root / "bare.csv", [*NAMES, "label"], test, header=False)
    assert bare.read_text().splitlines()[0][0] != "\n"
    err = run_error(capsys, ["evaluate", "--posterior", str(files["posterior"]), "--input", str(bare)])
    assert "--no-header" in err
    expected = _evaluate(capsys, files["posterior"], _write(root / "t.csv", [*NAMES, "label"], test))
    assert _same(_evaluate(capsys, files["posterior"], bare, "--no-header"), expected)
    features = _write(root / "bare_features.csv", NAMES, test, header=False)
    capsys.readouterr()
    argv = ["predict", "--posterior", str(files["posterior"]), "--input", str(features), "--no-header"]
    assert main(argv) == 0
    assert len(capsys.readouterr().out.splitlines()) == 401
    wrong = _write(root / "bare_short.csv", NAMES[:3], test, header=False)
    err = run_error(capsys, [*argv[:4], str(wrong), "--no-header"])
    assert "line 1: 3 cells, but 4 are expected" in err
    err = run_error(capsys, [*argv, "--label", "label"])
    assert "--no-header" in err


# --- the pieces: vips.columns, the posterior's schema, the estimators --------------------------------


class Frame:
    """A DataFrame-like object: named columns and __array__, nothing else (pandas is not installed)."""

    def __init__(self, columns: list[Any], values: np.ndarray) -> None:
        self.columns = columns
        self._values = values

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._values if dtype is None else self._values.astype(dtype)


def test_column_order_and_its_errors() -> None:
    assert column_order(["b", "a", "c"], ["a", "b", "c"]).tolist() == [1, 0, 2]
    with pytest.raises(ColumnMismatch, match=r"missing 'c'; unexpected 'd'; repeated 'a'"):
        column_order(["a", "b", "a", "d"], ["a", "b", "c"])
    # another dataset's file (issue 55: Adult's posterior on a German-credit file printed ~7,000 characters
    # of columns with misleading did-you-mean hints): the first five of each list, how many more, no hints
    adult = [f"education_{k}" for k in range(40)]
    german = [f"education_level_{k}" for k in range(30)]
    with pytest.raises(ColumnMismatch) as caught:
        column_order(german, adult)
    message = str(caught.value)
    assert "none of them is one of the posterior's: a file for another dataset?" in message
    assert (
        "missing 'education_0', 'education_1', 'education_2', 'education_3', 'education_4' and 35 more"
        in message
    )
    assert "and 25 more" in message and "did you mean" not in message and len(message) < 500
    assert caught.value.missing == tuple(adult)  # every name is still kept for a program
    assert input_columns(np.zeros((2, 2))) is None and input_columns([[1, 2]]) is None
    assert input_columns(Frame(["a", "b"], np.zeros((1, 2)))) == ("a", "b")
    assert input_columns(Frame([0, 1], np.zeros((1, 2)))) is None  # non-string names: positional
    record = np.array([(1.0, 2.0)], dtype=[("b", "f8"), ("a", "f8")])
    assert by_name(record, ["a", "b"]).tolist() == [[2.0, 1.0]]
    assert by_name(record, None).tolist() == [[1.0, 2.0]]


def test_public_schema_extra_names_tabular_columns() -> None:
    schema = {"features": ["x", "y"], "label": "churn"}
    assert public_schema_extra("blr", schema) == {"columns": ["x", "y"], "label": "churn"}
    assert public_schema_extra("linreg", schema) == {"columns": ["x", "y"], "label": "churn"}


def test_estimator_predicts_a_named_frame_by_name(files: dict[str, Any]) -> None:
    document = json.loads(Path(files["posterior"]).read_text())
    model = VipsEstimator.from_posterior(document)
    test = files["test"]
    x = np.column_stack([test[name] for name in NAMES])
    expected = model.predict_proba(x)
    order = ["hours", "age", "tenure", "income"]
    swapped = Frame(order, np.column_stack([test[name] for name in order]))
    np.testing.assert_allclose(model.predict_proba(swapped), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="missing 'hours'"):
        model.predict_proba(Frame([*NAMES[:2], "tenure"], x[:, [0, 1, 3]]))
    old = VipsEstimator.from_posterior(json.loads(Path(files["old"]).read_text()))
    np.testing.assert_array_equal(old.predict_proba(x), expected)  # arrays: positional, as before
    # names scikit-learn kept from a DataFrame at fit (feature_names_in_) serve when the posterior has none
    old.feature_names_in_ = np.asarray(NAMES, dtype=object)
    np.testing.assert_allclose(old.predict_proba(swapped), expected, rtol=1e-12)


def test_linreg_predictions_match_columns_by_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    x, _ = _rows(3, 200)
    columns = {**dict(zip(NAMES, x.T, strict=True)), "y": np.clip(x @ WEIGHTS / 8, -1, 1)}
    train = _write(tmp_path / "train.csv", [*NAMES, "y"], columns)
    posterior = tmp_path / "linreg.json"
    fit = [
        "fit",
        "--local",
        "--kind",
        "regression",
        "--input",
        str(train),
        "--label",
        "y",
        "--model",
        "linreg",
    ]
    assert main([*fit, "--sigma", "0", "--iterations", "3", "-o", str(posterior)]) == 0
    assert json.loads(posterior.read_text())["label"] == "y"
    swapped = _write(tmp_path / "swapped.csv", ["tenure", "y", "hours", "income", "age"], columns)
    expected = _evaluate(capsys, posterior, train)
    assert _same({**_evaluate(capsys, posterior, swapped), "baseline": expected["baseline"]}, expected)
    err = run_error(
        capsys, ["predict", "--posterior", str(posterior), "--input", str(train), "--label", "age"]
    )
    assert "missing 'age'" in err and "unexpected 'y'" in err
