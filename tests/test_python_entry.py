"""`from vips import ...` (issue 24.9) and a light `vips fit --local` (24.1): the package loads its
estimators on first use, and the CLI's local fit never imports scikit-learn. Checked on the modules a
fresh interpreter has loaded (timings belong in bench/lda_process.py)."""

from __future__ import annotations

import gc
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import vips
from tests.test_cli_startup import loaded_after
from vips import cli
from vips.datasets.wikipedia import write_bag_of_words
from vips.estimators import ESTIMATORS
from vips.progress import fit_progress


def test_import_vips_loads_nothing_heavy() -> None:
    loaded = loaded_after("import vips")
    assert not loaded & {"sklearn", "numpy", "scipy", "worker", "privacy_wall"}, sorted(loaded)


@pytest.mark.slow
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


def _modules_after_fit_local(argv: list[str]) -> set[str]:
    """Every module (dotted names) a fresh interpreter has loaded after `vips fit --local ...`."""
    script = (
        f"from vips.cli import main\nassert main({argv!r}) == 0\n"
        "import json, sys\nprint(json.dumps(sorted(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return set(json.loads(result.stdout.splitlines()[-1]))


#: What a sigma = 0 LDA fit on a file does not need (issue 24.1): the estimators' and the service's
#: libraries (web, settings, database, queue, dashboard), the other models, the pricing machinery's FFT,
#: scipy.optimize and scipy.stats, the terminal library, the shared budget and the distribution metadata
#: behind --version.
NOT_FOR_A_PUBLIC_LDA_FIT = {
    "sklearn",
    "autodp",
    "dp_accounting",
    "pydantic",
    "pydantic_settings",
    "sqlalchemy",
    "alembic",
    "celery",
    "kombu",
    "redis",
    "httpx",
    "fastapi",
    "starlette",
    "uvicorn",
    "jinja2",
    "matplotlib",
    "rich",
    "scipy.fft",
    "scipy.optimize",
    "scipy.stats",
    "control.settings",
    "privacy_wall.data.db_store",
    "privacy_wall.sqlengine",
    "vips.budget",
    "vips.estimators",
    "vips.models.sbn.model",
    "vips.models.blr.dpvi",
    "vips.models.blr.dpsep",
    "vips.models.blr.model",
    "vips.models.blr.setup",
    "vips.models.linreg.dpsep",
    "vips.models.linreg.model",
    "vips.models.sbn.setup",
}


def test_a_public_lda_fit_loads_only_what_it_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    docword, vocab = tmp_path / "docword.txt", tmp_path / "vocab.txt"
    write_bag_of_words(
        sp.csr_array(rng.poisson(1.0, size=(30, 10))), [f"w{j}" for j in range(10)], docword, vocab
    )
    argv = [
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
    argv += ["--sigma", "0", "--iterations", "2", "--option", "topics=3", "-o", str(tmp_path / "lda.json")]
    loaded = _modules_after_fit_local(argv)
    assert "vips.models.lda.model" in loaded and "privacy_wall.gate" in loaded  # the fit did run here
    assert not loaded & NOT_FOR_A_PUBLIC_LDA_FIT, sorted(loaded & NOT_FOR_A_PUBLIC_LDA_FIT)


@pytest.mark.slow
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


class _Stream(io.StringIO):
    def __init__(self, encoding: str, tty: bool) -> None:
        super().__init__()
        self._encoding, self._tty = encoding, tty

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    def isatty(self) -> bool:
        return self._tty


@pytest.mark.parametrize("tty", [False, True])
def test_the_progress_bar_is_one_final_line_off_a_terminal_and_riches_live_bar_on_one(
    monkeypatch: pytest.MonkeyPatch, tty: bool
) -> None:
    """Off a terminal (a file, a pipe): the final state, once, and rich is not imported; on a terminal,
    rich's live bar ends in the same state."""
    stream = _Stream("utf-8", tty)
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.delitem(sys.modules, "rich.progress", raising=False)
    with fit_progress("lda vips", 4) as update:
        for done in range(1, 5):
            update(done, 0.5 * done, "running" if done < 4 else "done")
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())  # rich's cursor movements
    final = [line for line in re.split(r"[\r\n]", plain) if line.strip()][-1]
    assert "lda vips done" in final and "4/4" in final and "eps 2" in final
    assert ("rich.progress" in sys.modules) == tty
    if not tty:
        assert stream.getvalue() == final + "\n"  # one line, nothing drawn before it


def test_only_a_client_verbs_own_process_skips_the_final_collection(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """main() from the command line (argv None) freezes the collector once the verb's module is imported
    (what the import made lives until exit: no collection during it) and before the process exits; a
    caller that passes argv (tests, scripts) keeps it, and so do server verbs."""
    frozen: list[bool] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    quote = ["privacy", "epsilon", "--sigma", "2", "--batch-size", "10", "--population", "100"]
    quote += ["--iterations", "3", "--delta", "1e-5"]
    assert cli.main(quote) == 0 and not frozen
    monkeypatch.setattr(sys, "argv", ["vips", *quote])
    assert cli.main() == 0 and frozen == [True, True] and gc.isenabled()
    monkeypatch.setattr(sys, "argv", ["vips", "admin", "list-keys", "--bogus"])
    assert cli.main() == 2 and frozen == [True, True]  # a usage error before any verb ran: nothing parsed
    capsys.readouterr()
