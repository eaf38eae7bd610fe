"""The LDA fit as a user runs it: `vips fit --local` timed as a whole process (interpreter start, imports,
reading the docword file, the fit, writing the posterior) against scikit-learn's online LDA fit (the fit
alone, in this process) on the same corpus and schedule, alternated in one run; prints the ratio.

Corpus: the bundled Wikipedia training paragraphs (vips.datasets.wikipedia, D = 2,786, V = 5,000),
K = 20, S = round(D / 10), T = 50 iterations (5 passes), alpha = eta = 1/K, tau0 = 10, kappa = 0.7;
VIPS at sigma = 0 with documents kept whole (doc_length 0), scikit-learn with learning_method "online",
batch_size S, max_iter 5 and the same offset, decay and priors. BLAS limited to one thread on both sides.

The process runs twice per repeat: as Python runs by default (bytecode cached in __pycache__ after a
first, untimed run: here under PYTHONPYCACHEPREFIX in a temporary folder, so the bench writes nothing into
the checkout), and with PYTHONDONTWRITEBYTECODE=1 (how this project's development machines are set up:
the project's own modules, which have no cached bytecode there, are compiled at every start).

    python -m bench.lda --whole-process [--repeats R]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from vips.datasets.wikipedia import load_wikipedia, write_bag_of_words

TOPICS = 20
PASSES = 5
ITERATIONS = 50
TAU0 = 10.0
KAPPA = 0.7
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


@dataclass(frozen=True)
class Timing:
    """Medians over the repeats: the whole `vips fit --local` process and scikit-learn's fit."""

    documents: int
    batch_size: int
    vips_process: float
    vips_fit: float
    sklearn_fit: float
    repeats: int
    vips_process_uncached: float = float("nan")

    @property
    def ratio(self) -> float:
        """How many times faster the whole VIPS process is than scikit-learn's fit alone."""
        return self.sklearn_fit / self.vips_process


def vips_command(docword: Path, vocab: Path, batch_size: int, output: Path) -> list[str]:
    """`vips fit --local` as the README runs it (the installed console script when there is one)."""
    script = Path(sys.executable).parent / "vips"
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "vips.cli"]
    options = [f"{name}={value:g}" for name, value in vips_options().items()]
    options += [f"tau0={TAU0:g}", f"kappa={KAPPA:g}"]
    return [
        *launcher,
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
        "--sigma",
        "0",
        "--batch-size",
        str(batch_size),
        "--iterations",
        str(ITERATIONS),
        *(part for option in options for part in ("--option", option)),
        "-o",
        str(output),
    ]


def process_env(bytecode_cache: Path | None) -> dict[str, str]:
    """The VIPS process's environment: one BLAS thread; bytecode cached under `bytecode_cache` (Python's
    default behaviour, kept out of the checkout) or, when None, never written (PYTHONDONTWRITEBYTECODE)."""
    env = {**os.environ, **ONE_THREAD}
    if bytecode_cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(bytecode_cache)
    return env


def time_vips_process(command: list[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of one `vips fit --local` process, start to exit."""
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env or process_env(None))
    return time.perf_counter() - start


def vips_options() -> dict[str, float]:
    """The --option values of vips_command, as fit_store takes them."""
    return {"topics": TOPICS, "doc_length": 0, "alpha": 1 / TOPICS, "eta": 1 / TOPICS}


def time_vips_fit(counts: sp.csr_array, batch_size: int) -> float:
    """Seconds of the same fit in this process (vips.fit_loop, what the CLI runs; one BLAS thread)."""
    from privacy_wall.data.store import InMemoryBowStore
    from vips.fit_loop import Schedule, fit_store

    schedule = Schedule(
        epsilon=None,
        delta=1e-5,
        sigma=0.0,
        batch_size=batch_size,
        iterations=ITERATIONS,
        tau0=TAU0,
        kappa=KAPPA,
    )
    with threadpool_limits(1):
        start = time.perf_counter()
        fit_store(
            "lda",
            "vips",
            vips_options(),
            schedule,
            lambda public: InMemoryBowStore("bench", counts, public=public),
            int(counts.shape[0]),
            "bench",
        )
        return time.perf_counter() - start


def time_sklearn_fit(counts: sp.csr_array, batch_size: int) -> float:
    """Seconds of scikit-learn's online LDA fit on the same schedule (one BLAS thread)."""
    from sklearn.decomposition import LatentDirichletAllocation

    model = LatentDirichletAllocation(
        n_components=TOPICS,
        learning_method="online",
        batch_size=batch_size,
        max_iter=PASSES,
        learning_offset=TAU0,
        learning_decay=KAPPA,
        total_samples=counts.shape[0],
        doc_topic_prior=1.0 / TOPICS,
        topic_word_prior=1.0 / TOPICS,
        random_state=0,
    )
    matrix = sp.csr_matrix(counts)
    with threadpool_limits(1):
        start = time.perf_counter()
        model.fit(matrix)
        return time.perf_counter() - start


def measure(repeats: int = 3) -> Timing:
    """Alternate the two `repeats` times on the same corpus files; medians."""
    corpus = load_wikipedia()
    counts = corpus.train
    documents = int(counts.shape[0])
    batch_size = round(documents / 10)
    vips_seconds: list[float] = []
    uncached_seconds: list[float] = []
    fit_seconds: list[float] = []
    sklearn_seconds: list[float] = []
    with tempfile.TemporaryDirectory() as work:
        docword, vocab = Path(work) / "docword.txt", Path(work) / "vocab.txt"
        write_bag_of_words(counts, corpus.vocabulary, docword, vocab)
        command = vips_command(docword, vocab, batch_size, Path(work) / "posterior.json")
        cached = process_env(Path(work) / "pycache")
        time_vips_process(command, cached)  # untimed: writes the bytecode cache, as a user's first run does
        for _ in range(repeats):
            vips_seconds.append(time_vips_process(command, cached))
            fit_seconds.append(time_vips_fit(counts, batch_size))
            sklearn_seconds.append(time_sklearn_fit(counts, batch_size))
            uncached_seconds.append(time_vips_process(command, process_env(None)))
    return Timing(
        documents,
        batch_size,
        statistics.median(vips_seconds),
        statistics.median(fit_seconds),
        statistics.median(sklearn_seconds),
        repeats,
        statistics.median(uncached_seconds),
    )


def report(timing: Timing) -> str:
    """The markdown table bench/README.md records."""
    return "\n".join(
        [
            f"| measure (D = {timing.documents}, K = {TOPICS}, S = {timing.batch_size}, T = {ITERATIONS}) "
            f"| median of {timing.repeats} |",
            "|---|---|",
            "| `vips fit --local` whole process (bytecode cached, Python's default) "
            f"| {timing.vips_process:.2f} s |",
            "| `vips fit --local` whole process, PYTHONDONTWRITEBYTECODE=1 "
            f"| {timing.vips_process_uncached:.2f} s |",
            f"| the same VIPS fit alone, in process | {timing.vips_fit:.2f} s |",
            f"| scikit-learn online LDA fit | {timing.sklearn_fit:.2f} s |",
            f"| ratio (scikit-learn fit / whole VIPS process) | {timing.ratio:.2f}x |",
            "| ratio (scikit-learn fit / whole VIPS process, PYTHONDONTWRITEBYTECODE=1) "
            f"| {timing.sklearn_fit / timing.vips_process_uncached:.2f}x |",
            f"| ratio (scikit-learn fit / VIPS fit alone) | {timing.sklearn_fit / timing.vips_fit:.2f}x |",
        ]
    )
