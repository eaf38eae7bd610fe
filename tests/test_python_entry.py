"""`from vips import ...` (issue 24.9) and a light `vips fit --local` (24.1): the package loads its
estimators on first use, and the CLI's local fit never imports scikit-learn. Checked on the modules a
fresh interpreter has loaded (timings belong in bench/lda_process.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import vips
from tests.test_cli_startup import loaded_after
from worker.datasets.wikipedia import write_bag_of_words
from worker.estimator import ESTIMATORS


def test_import_vips_loads_nothing_heavy() -> None:
    loaded = loaded_after("import vips")
    assert not loaded & {"sklearn", "numpy", "scipy", "worker", "privacy_wall"}, sorted(loaded)


def test_the_public_names_load_on_first_use() -> None:
    loaded = loaded_after("from vips import PrivacyBudget\nPrivacyBudget(1.0)")
    assert "sklearn" not in loaded  # the budget alone needs no estimator
    assert "sklearn" in loaded_after("from vips import VIPSLogisticRegression")
    for name in vips.__all__:
        assert name in dir(vips)
        assert getattr(vips, name).__name__ == name
    assert {cls.__name__ for cls in ESTIMATORS.values()} <= set(vips.__all__)
    assert {"PrivacyBudget", "PublicBoundsScaler"} <= set(vips.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        vips.Nope  # noqa: B018


def _fit_local(argv: list[str]) -> set[str]:
    return loaded_after(f"from vips.cli import main\nassert main({argv!r}) == 0")


def test_fit_local_imports_no_scikit_learn(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    counts = sp.csr_array(rng.poisson(1.0, size=(40, 12)))
    docword, vocab = tmp_path / "docword.txt", tmp_path / "vocab.txt"
    write_bag_of_words(counts, [f"w{j}" for j in range(12)], docword, vocab)
    lda = [
        "fit",
        "--local",
        "--kind",
        "bow",
        "--input",
        str(docword),
        "--vocab",
        str(vocab),
        "--model",
        "lda",
    ]
    loaded = _fit_local([*lda, "--sigma", "0", "--iterations", "2", "--option", "topics=3"])
    assert "sklearn" not in loaded and "dp_accounting" not in loaded and "autodp" not in loaded

    x = rng.normal(size=(50, 3))
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)  # rows of norm <= 1
    table = tmp_path / "train.csv"
    lines = ["a,b,c,label", *(f"{r[0]},{r[1]},{r[2]},{int(r[0] > 0)}" for r in x)]
    table.write_text("\n".join(lines) + "\n", encoding="utf-8")
    blr = ["fit", "--local", "--kind", "tabular", "--input", str(table), "--label", "label", "--model", "blr"]
    loaded = _fit_local([*blr, "--epsilon", "1", "--iterations", "2"])
    assert "sklearn" not in loaded and "autodp" not in loaded  # a private fit prices with dp_accounting
