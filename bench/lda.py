"""VIPS for LDA (paper Sec. 4): speed and held-out perplexity against scikit-learn and gensim, and privacy.

Sections:

- wikipedia (non-private): VIPS-LDA at sigma = 0 vs scikit-learn's LatentDirichletAllocation
  (learning_method="online") and gensim's LdaModel on the bundled Wikipedia paragraphs
  (worker.datasets.wikipedia; training documents shuffled once, seed 0), with the same K, minibatch size S,
  passes P (VIPS: T = P D / S iterations, in shuffled passes like the libraries, and with the uniform
  minibatches private fits use), alpha = eta = 1/K and step sizes
  rho_t = (tau0 + t)^-kappa (gensim: its own formula with offset = tau0, decay = kappa). Documents per
  second of fitting (one thread each: BLAS limited to 1 thread) and held-out perplexity, all computed by
  the same code (worker.models.lda) from each library's lambda: document completion and the paper's bound.
- private (synthetic): a corpus with planted topics (worker.datasets.synthetic_lda, D >= 100,000) at the
  paper's sampling rate S / D = 0.05, T = 20 iterations (one epoch), N_w = 500, epsilon ~2.4 at
  delta = 1e-4: sigma from the moments accountant (privacy_wall.accounting.calibration.calibrate_sigma) vs
  strong composition (calibrate_sigma_strong), clipping a = 0.1 vs none (a = 1: the bound N_w), and the
  unigram
  baseline; held-out perplexity per iteration (the paper's Fig. 3).
- --sweep: how much data and epsilon private LDA needs before its topics beat the unigram baseline on
  held-out completion perplexity: epsilon 1, 2.4, 10, 100 (delta 1e-4, sigma by the `pld` accountant) and
  sigma = 0, on the README's job (the bundled corpus, K = 50, S = 2,000, T = 20, N_w = 500, a = 0.1) and on
  planted-topic corpora shaped like it (V = 5,000, ~50 tokens, K = 20) of growing D at S / D = 0.05, T = 20.
- --sweep-unigram: the unigram fallback (issue 36) on the LDA schedule rule's rows
(service.planning.schedules: T and
  unigram_share by epsilon x D, S = D) at epsilon 0.5-10 and sigma 0, on the bundled corpus, planted-topic
  corpora and a stand-in from a third generator (`dirichlet_corpus`), against the training unigram.
  With --text-csv, a public CSV text corpus (bench.text_corpus) instead of the bundled one, at K 50 and 10.
- --full: the paper's scale (D = 400,000, V = 5,000, K = 50, S = 20,000, N_w = 500, T = 20, sigma = 1.24)
  on a synthetic corpus: seconds per iteration and peak RSS, beside scikit-learn's online LDA updates on
  minibatches of the same size from the same corpus (the ratio of seconds per iteration).

    python -m bench.lda [--quick] [--seeds N] [--out DIR]
    python -m bench.lda --full [--sklearn-batches N] [--out DIR]
    python -m bench.lda --whole-process [--repeats R]   # `vips fit --local` as a process vs scikit-learn
    python -m bench.lda --sweep [--sweep-sizes 2786,10000]  # private LDA vs the unigram baseline
    python -m bench.lda --sweep-unigram 2 [--unigram-sizes 3000,30000]  # the unigram fallback, LDA rule
    python -m bench.lda --sweep-unigram 2 --unigram-sizes "" --text-csv NewsArticles.csv  # held-out text

Fits run through the real pieces: an in-memory store, privacy_wall.gate.Gate, an InMemoryLedger and
worker.runner.run_vips. Private fits cannot be seeded (OS CSPRNG): their repeats are independent runs.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from bench.strong_composition import calibrate_sigma_strong, strong_composition_epsilon
from bench.text_corpus import TextCorpus, text_corpus
from privacy_wall.accounting.calibration import calibrate_sigma, epsilon
from privacy_wall.data.store import InMemoryBowStore
from privacy_wall.gate import Gate
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.queries.lda import (
    LdaQuery,
    fit_chunks,
    resample_documents,
    sanitize_counts,
    shifted_topic_word,
)
from service.planning.schedules import job_scale, rule_for, rule_iterations, rule_options
from worker.datasets.synthetic_lda import generate_corpus, planted_topics
from worker.datasets.wikipedia import load_wikipedia
from worker.models.lda import (
    LatentDirichletAllocation,
    LdaState,
    completion_perplexity,
    default_smoothing,
    expected_log_beta,
    perplexity_bound,
    split_documents,
    unigram_perplexity,
)
from worker.runner import LoopSettings, run_vips

Counts = sp.csr_array

# Wikipedia comparison.
WIKI_TOPICS = 20
WIKI_BATCH = 256
WIKI_PASSES = 5
TAU0 = 10.0
KAPPA = 0.7
INNER_ITERATIONS = 30

# Private comparison (paper Sec. 4.3 at a tenth of its corpus, same sampling rate and schedule).
PRIVATE_EPSILON = 2.4
PRIVATE_DELTA = 1e-4
PRIVATE_RATE = 0.05
PRIVATE_ITERATIONS = 20
DOC_LENGTH = 500
CLIP = 0.1
PRIVATE_TAU0 = 1.0
PRIVATE_KAPPA = 0.7


@dataclass(frozen=True)
class SyntheticSetting:
    documents: int
    vocabulary: int
    topics: int
    mean_length: float
    alpha: float = 0.1
    test_documents: int = 2000


PRIVATE_SETTING = SyntheticSetting(documents=100_000, vocabulary=8_000, topics=50, mean_length=300.0)
QUICK_PRIVATE_SETTING = SyntheticSetting(documents=100_000, vocabulary=2_000, topics=20, mean_length=100.0)
FULL_SETTING = SyntheticSetting(documents=400_000, vocabulary=5_000, topics=50, mean_length=300.0)
#: --full generates its corpus in pieces (seeds 1, 2, ...) and joins their arrays one at a time, so that
#: generation peaks near 1.5 times the corpus (one call to generate_corpus holds it about three times).
FULL_PIECES = 8
FULL_BATCH = 20_000
FULL_SIGMA = 1.24


@dataclass
class Row:
    """One line of a results table: repeated fits of one method at one setting."""

    section: str
    method: str
    setting: str
    epsilon: float = math.inf
    sigma: float = 0.0
    completion: list[float] = field(default_factory=list)
    bound: list[float] = field(default_factory=list)
    docs_per_second: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    curve: list[float] = field(default_factory=list)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def mean_std(values: Sequence[float], digits: int = 1) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} +- {np.std(values):.{digits}f}"


@dataclass(frozen=True)
class Evaluation:
    """A held-out set: whole documents (for the bound) and their observed / held-out halves."""

    counts: Counts
    observed: Counts
    held_out: Counts
    alpha: float

    @classmethod
    def of(cls, counts: Counts, alpha: float) -> Evaluation:
        observed, held_out = split_documents(counts, seed=0)
        return cls(counts, observed, held_out, alpha)

    def completion(self, lam: np.ndarray) -> float:
        return completion_perplexity(lam, self.observed, self.held_out, self.alpha)

    def bound(self, lam: np.ndarray) -> float:
        return perplexity_bound(lam, self.counts, self.alpha)


@dataclass
class VipsFit:
    state: LdaState
    epsilon: float
    seconds: float


def vips_fit(
    counts: Counts,
    *,
    topics: int,
    sigma: float,
    batch_size: int,
    iterations: int,
    doc_length: int,
    clip: float,
    tau0: float,
    kappa: float,
    delta: float,
    seed: int,
    on_iteration: Callable[[int, LdaState], None] | None = None,
    store: InMemoryBowStore | None = None,
    passes: bool = False,
    unigram_share: float = 0.0,
    unigram_clip: float = 1.0,
    word_prior: tuple[float, ...] | None = None,
) -> VipsFit:
    """VIPS-LDA through the gate (public and seeded at sigma = 0; `passes`: shuffled passes instead of
    uniform minibatches, sigma = 0 only); seconds exclude on_iteration's time."""
    public = sigma == 0
    store = store or InMemoryBowStore("bench", counts, public=public)
    ledger = InMemoryLedger(delta=delta)
    longest = int(np.asarray(counts.sum(axis=1)).max()) if doc_length == 0 else None
    query = LdaQuery(
        topics,
        doc_length=doc_length,
        clip=clip,
        inner_iterations=INNER_ITERATIONS,
        max_document_length=longest,
        unigram_share=unigram_share,
        unigram_clip=unigram_clip,
    )
    excluded = 0.0

    def callback(t: int, _release: object, state: LdaState) -> None:
        nonlocal excluded
        if on_iteration is not None:
            start = time.perf_counter()
            on_iteration(t, state)
            excluded += time.perf_counter() - start

    start = time.perf_counter()
    result = run_vips(
        Gate(store, ledger, seed=seed if public else None, passes=passes, padded=False),
        query,
        LatentDirichletAllocation(
            topics, seed=seed, word_prior=word_prior, smoothing=default_smoothing(doc_length)
        ),
        LoopSettings(iterations, batch_size, sigma, tau0, kappa),
        job_id="bench",
        dimension=counts.shape[1],
        population=counts.shape[0],
        on_iteration=callback,
    )
    seconds = time.perf_counter() - start - excluded
    return VipsFit(result.state, ledger.epsilon_spent() if sigma > 0 else math.inf, seconds)


# --------------------------------------------------------------------------------------------------------
# (a) Wikipedia, non-private.


def sklearn_fit(counts: Counts, topics: int, seed: int) -> tuple[np.ndarray, float]:
    from sklearn.decomposition import LatentDirichletAllocation as SkLda

    model = SkLda(
        n_components=topics,
        learning_method="online",
        batch_size=WIKI_BATCH,
        max_iter=WIKI_PASSES,
        learning_offset=TAU0,
        learning_decay=KAPPA,
        total_samples=counts.shape[0],
        doc_topic_prior=1.0 / topics,
        topic_word_prior=1.0 / topics,
        random_state=seed,
    )
    matrix = sp.csr_matrix(counts)
    start = time.perf_counter()
    model.fit(matrix)
    return np.asarray(model.components_, dtype=np.float64), time.perf_counter() - start


def gensim_fit(counts: Counts, topics: int, seed: int) -> tuple[np.ndarray, float]:
    import logging

    from gensim.matutils import Sparse2Corpus
    from gensim.models import LdaModel

    logging.getLogger("gensim").setLevel(logging.ERROR)
    corpus = Sparse2Corpus(sp.csc_matrix(sp.csr_matrix(counts).T))
    id2word = {i: str(i) for i in range(counts.shape[1])}
    start = time.perf_counter()
    model = LdaModel(
        corpus=corpus,
        id2word=id2word,
        num_topics=topics,
        chunksize=WIKI_BATCH,
        passes=WIKI_PASSES,
        update_every=1,
        alpha=np.full(topics, 1.0 / topics),
        eta=1.0 / topics,
        decay=KAPPA,
        offset=TAU0,
        iterations=50,
        gamma_threshold=0.001,
        random_state=seed,
        eval_every=None,
    )
    seconds = time.perf_counter() - start
    return np.asarray(model.state.get_lambda(), dtype=np.float64), seconds


def wikipedia_section(seeds: int, article_order: bool) -> list[Row]:
    corpus = load_wikipedia()
    permutation = np.random.default_rng(0).permutation(corpus.train.shape[0])
    shuffled = sp.csr_array(corpus.train[permutation])
    documents = shuffled.shape[0]
    topics = WIKI_TOPICS
    evaluation = Evaluation.of(corpus.test, 1.0 / topics)
    iterations = round(WIKI_PASSES * documents / WIKI_BATCH)
    processed = WIKI_PASSES * documents
    setting = f"K = {topics}, S = {WIKI_BATCH}, {WIKI_PASSES} passes, tau0 = {TAU0:g}, kappa = {KAPPA:g}"
    rows = {
        "vips": Row(
            "wikipedia",
            "VIPS-LDA (sigma = 0, shuffled passes)",
            f"{setting}, T = {iterations}, {INNER_ITERATIONS} inner",
        ),
        "vips-uniform": Row(
            "wikipedia",
            "VIPS-LDA (sigma = 0, uniform minibatches as private fits draw them)",
            f"{setting}, T = {iterations}, {INNER_ITERATIONS} inner",
        ),
        "sklearn": Row("wikipedia", "scikit-learn online LDA", f"{setting}, max_doc_update_iter = 100"),
        "gensim": Row("wikipedia", "gensim LdaModel", f"{setting}, iterations = 50"),
    }
    if article_order:
        rows["sklearn-ordered"] = Row("wikipedia", "scikit-learn online LDA", f"{setting}, article order")
        rows["gensim-ordered"] = Row("wikipedia", "gensim LdaModel", f"{setting}, article order")
    log(f"wikipedia: {documents} train / {corpus.test.shape[0]} test documents, V = {len(corpus.vocabulary)}")
    store = InMemoryBowStore("wikipedia", shuffled, public=True)

    def record(key: str, lam: np.ndarray, seconds: float) -> None:
        row = rows[key]
        row.seconds.append(seconds)
        row.docs_per_second.append(processed / seconds)
        row.completion.append(evaluation.completion(lam))
        row.bound.append(evaluation.bound(lam))
        log(
            f"  {row.method} ({key}): {processed / seconds:.0f} docs/s, completion perplexity "
            f"{row.completion[-1]:.1f}, bound {row.bound[-1]:.1f}"
        )

    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Methods alternate within each seed, so background load affects them alike.
        for seed in range(seeds):
            for key, passes in (("vips", True), ("vips-uniform", False)):
                fit = vips_fit(
                    shuffled,
                    topics=topics,
                    sigma=0.0,
                    batch_size=WIKI_BATCH,
                    iterations=iterations,
                    doc_length=0,
                    clip=1.0,
                    tau0=TAU0,
                    kappa=KAPPA,
                    delta=1e-5,
                    seed=seed,
                    store=store,
                    passes=passes,
                )
                record(key, fit.state.lam, fit.seconds)
            record("sklearn", *sklearn_fit(shuffled, topics, seed))
            record("gensim", *gensim_fit(shuffled, topics, seed))
            if article_order:
                record("sklearn-ordered", *sklearn_fit(corpus.train, topics, seed))
                record("gensim-ordered", *gensim_fit(corpus.train, topics, seed))
    return list(rows.values())


# --------------------------------------------------------------------------------------------------------
# (b) Private, synthetic.


@dataclass(frozen=True)
class SyntheticData:
    train: Counts
    evaluation: Evaluation
    truth: np.ndarray
    setting: SyntheticSetting


def synthetic_data(setting: SyntheticSetting) -> SyntheticData:
    truth = planted_topics(setting.topics, setting.vocabulary, seed=0)
    train = generate_corpus(
        setting.documents, truth, mean_length=setting.mean_length, alpha=setting.alpha, seed=1
    )
    test = generate_corpus(
        setting.test_documents, truth, mean_length=setting.mean_length, alpha=setting.alpha, seed=2
    )
    return SyntheticData(train.counts, Evaluation.of(test.counts, 1.0 / setting.topics), truth, setting)


def private_section(quick: bool, repeats: int) -> tuple[list[Row], dict[str, float]]:
    setting = QUICK_PRIVATE_SETTING if quick else PRIVATE_SETTING
    start = time.perf_counter()
    data = synthetic_data(setting)
    log(f"private: generated D = {setting.documents} in {time.perf_counter() - start:.1f} s")
    documents, topics = setting.documents, setting.topics
    batch = round(PRIVATE_RATE * documents)
    doc_length = 100 if quick else DOC_LENGTH
    sigma_ma = calibrate_sigma(PRIVATE_EPSILON, batch, documents, PRIVATE_ITERATIONS, PRIVATE_DELTA)
    sigma_strong = calibrate_sigma_strong(
        PRIVATE_EPSILON, batch, documents, PRIVATE_ITERATIONS, PRIVATE_DELTA
    )
    info: dict[str, float] = {
        "clipped_fraction": math.nan,
        "sigma_ma": sigma_ma,
        "sigma_strong": sigma_strong,
        "epsilon_ma": epsilon(sigma_ma, batch, documents, PRIVATE_ITERATIONS, PRIVATE_DELTA),
        "strong_epsilon_of_strong_sigma": strong_composition_epsilon(
            sigma_strong, batch, documents, PRIVATE_ITERATIONS, PRIVATE_DELTA
        ),
        "ma_epsilon_of_strong_sigma": epsilon(
            sigma_strong, batch, documents, PRIVATE_ITERATIONS, PRIVATE_DELTA
        ),
        "batch": batch,
        "doc_length": doc_length,
    }
    log(f"  sigma: moments accountant {sigma_ma:.3f}, strong composition {sigma_strong:.3f}")
    base = (
        f"D = {documents}, V = {setting.vocabulary}, K = {topics}, S = {batch}, T = {PRIVATE_ITERATIONS}, "
        f"N_w = {doc_length}"
    )
    configurations = [
        ("non-private (sigma = 0)", 0.0, CLIP, 1),
        ("moments accountant, clip a = 0.1", sigma_ma, CLIP, repeats),
        ("moments accountant, no clipping (a = 1)", sigma_ma, 1.0, repeats),
        ("strong composition, clip a = 0.1", sigma_strong, CLIP, repeats),
    ]
    rows: list[Row] = []
    store = InMemoryBowStore("synthetic", data.train, public=False)
    public_store = InMemoryBowStore("synthetic", data.train, public=True)
    with threadpool_limits(1):
        for method, sigma, clip, runs in configurations:
            setting = base + (
                f"; eps {PRIVATE_EPSILON} by strong composition, the table's epsilon is the ledger's (RDP)"
                if sigma == sigma_strong
                else ""
            )
            row = Row("private", f"VIPS-LDA, {method}", setting, sigma=sigma)
            for run in range(runs):
                curve: list[float] = []
                fit = vips_fit(
                    data.train,
                    topics=topics,
                    sigma=sigma,
                    batch_size=batch,
                    iterations=PRIVATE_ITERATIONS,
                    doc_length=doc_length,
                    clip=clip,
                    tau0=PRIVATE_TAU0,
                    kappa=PRIVATE_KAPPA,
                    delta=PRIVATE_DELTA,
                    seed=0,
                    on_iteration=(lambda _t, state, c=curve: c.append(data.evaluation.completion(state.lam)))
                    if run == 0
                    else None,
                    store=public_store if sigma == 0 else store,
                )
                row.epsilon = fit.epsilon
                row.seconds.append(fit.seconds)
                if sigma == sigma_ma and clip == CLIP:
                    info["clipped_fraction"] = clipped_fraction(data.train, fit.state.lam, doc_length, clip)
                row.completion.append(data.evaluation.completion(fit.state.lam))
                row.bound.append(data.evaluation.bound(fit.state.lam))
                if curve:
                    row.curve = curve
                log(
                    f"  {method}: sigma {sigma:.3f}, eps {fit.epsilon:.3f}, completion "
                    f"{row.completion[-1]:.1f}, bound {row.bound[-1]:.1f} ({fit.seconds:.0f} s)"
                )
            rows.append(row)
    unigram = Row("private", "unigram (non-private word frequencies)", base)
    unigram.completion.append(unigram_perplexity(data.train, data.evaluation.held_out))
    unigram.bound.append(unigram_perplexity(data.train, data.evaluation.counts))
    rows.append(unigram)
    truth = Row("private", "true topics (oracle)", base)
    truth.completion.append(data.evaluation.completion(data.truth * 1e7))
    truth.bound.append(data.evaluation.bound(data.truth * 1e7))
    rows.append(truth)
    return rows, info


def clipped_fraction(
    counts: Counts, lam: np.ndarray, doc_length: int, clip: float, sample: int = 2000
) -> float:
    """Fraction of (resampled) documents whose contribution the wall clips at these topics (public
    diagnostic on the synthetic corpus; the paper reports about 3/4 on Wikipedia at a = 0.1)."""
    rng = np.random.default_rng(0)
    rows = rng.choice(counts.shape[0], size=min(sample, counts.shape[0]), replace=False)
    resampled = resample_documents(sanitize_counts(sp.csr_array(counts[rows])), doc_length, rng)
    table, _ = shifted_topic_word(expected_log_beta(lam))
    clipped = 0
    for chunk in fit_chunks(resampled, table, 1.0 / lam.shape[0], INNER_ITERATIONS, None):
        contribution = chunk.topic_word * chunk.doc_topic[:, :, None] * chunk.ratio[:, None, :]
        norms = np.sqrt(np.einsum("dkm,dkm->d", contribution, contribution))
        clipped += int((norms > clip * doc_length).sum())
    return clipped / rows.shape[0]


# --------------------------------------------------------------------------------------------------------
# (d) How much data and epsilon private LDA needs to beat the unigram baseline (issue 24.10).

SWEEP_EPSILONS = (1.0, 2.4, 10.0, 100.0)
SWEEP_DELTA = 1e-4
#: The README's example job: K = 50, S = 2,000 of the bundled 2,786 documents, T = 20, N_w = 500, a = 0.1,
#: the service's step sizes (tau0 = 0, kappa = 1: rho_t = 1/t).
README_TOPICS = 50
README_BATCH = 2000
README_ITERATIONS = 20
#: Synthetic corpora shaped like the bundled one (V = 5,000, ~50 tokens a document), K = 20 planted topics,
#: at the paper's sampling rate S / D = 0.05 and T = 20 (one epoch).
SWEEP_SIZES = (2_786, 10_000, 30_000, 100_000)
SWEEP_VOCABULARY = 5_000
SWEEP_TOPICS = 20
SWEEP_MEAN_LENGTH = 50.0


@dataclass(frozen=True)
class SweepRow:
    corpus: str
    documents: int
    batch_size: int
    topics: int
    epsilon: float  # the ledger's, inf for sigma = 0
    sigma: float
    completion: float
    unigram: float
    test_unigram: float  # `vips evaluate`'s baseline: the test documents' observed halves' frequencies
    #: --sweep-unigram: the private unigram's completion perplexity at the same epsilon (`private_unigram`).
    private_unigram: float = math.nan
    #: --sweep-unigram: the epsilon the fit was calibrated to (the ledger's may differ in its last digits).
    target_epsilon: float = math.nan

    @property
    def summary_epsilon(self) -> float:
        """The epsilon the summary groups by: the target where known, else the ledger's."""
        return self.epsilon if math.isnan(self.target_epsilon) else self.target_epsilon

    @property
    def beats_unigram(self) -> bool:
        return self.completion < self.unigram


def sweep_fit(
    train: Counts,
    *,
    topics: int,
    sigma: float,
    batch_size: int,
    iterations: int,
    store: InMemoryBowStore,
    unigram_share: float = 0.0,
    unigram_clip: float = 1.0,
    word_prior: tuple[float, ...] | None = None,
) -> VipsFit:
    """One fit of the sweeps (--sweep, --sweep-unigram): N_w DOC_LENGTH, a CLIP, the service's step sizes
    (tau0 0, kappa 1), delta SWEEP_DELTA, model seed 0."""
    return vips_fit(
        train,
        topics=topics,
        sigma=sigma,
        batch_size=batch_size,
        iterations=iterations,
        doc_length=DOC_LENGTH,
        clip=CLIP,
        tau0=0.0,
        kappa=1.0,
        delta=SWEEP_DELTA,
        seed=0,
        store=store,
        unigram_share=unigram_share,
        unigram_clip=unigram_clip,
        word_prior=word_prior,
    )


def _sweep_fits(
    corpus: str, train: Counts, evaluation: Evaluation, *, topics: int, batch_size: int, iterations: int
) -> list[SweepRow]:
    """One private fit per epsilon of SWEEP_EPSILONS (sigma calibrated by the `pld` accountant) and one at
    sigma = 0, all on the same schedule; each scored against the unigram baseline on the same held-out
    halves."""
    documents = int(train.shape[0])
    unigram = unigram_perplexity(train, evaluation.held_out)
    test_unigram = unigram_perplexity(evaluation.observed, evaluation.held_out)
    rows = []
    private_store = InMemoryBowStore(corpus, train, public=False)
    public_store = InMemoryBowStore(corpus, train, public=True)
    for target in (*SWEEP_EPSILONS, math.inf):
        sigma = (
            0.0
            if math.isinf(target)
            else calibrate_sigma(target, batch_size, documents, iterations, SWEEP_DELTA)
        )
        fit = sweep_fit(
            train,
            topics=topics,
            sigma=sigma,
            batch_size=batch_size,
            iterations=iterations,
            store=public_store if sigma == 0 else private_store,
        )
        row = SweepRow(
            corpus,
            documents,
            batch_size,
            topics,
            fit.epsilon,
            sigma,
            evaluation.completion(fit.state.lam),
            unigram,
            test_unigram,
        )
        log(
            f"  {corpus} D = {documents}: eps {_eps(row.epsilon)} (sigma {sigma:.3g}): completion "
            f"{row.completion:.1f}, unigram {unigram:.1f} ({fit.seconds:.0f} s)"
        )
        rows.append(row)
    return rows


def sweep_section(sizes: Sequence[int]) -> list[SweepRow]:
    """The README's job on the bundled Wikipedia corpus, then planted-topic corpora of growing size."""
    corpus = load_wikipedia()
    rows = _sweep_fits(
        "bundled Wikipedia (README job)",
        corpus.train,
        Evaluation.of(corpus.test, 1.0 / README_TOPICS),
        topics=README_TOPICS,
        batch_size=min(README_BATCH, corpus.train.shape[0]),
        iterations=README_ITERATIONS,
    )
    for documents in sizes:
        setting = SyntheticSetting(
            documents=documents,
            vocabulary=SWEEP_VOCABULARY,
            topics=SWEEP_TOPICS,
            mean_length=SWEEP_MEAN_LENGTH,
            test_documents=1000,
        )
        data = synthetic_data(setting)
        rows += _sweep_fits(
            "synthetic, planted topics",
            data.train,
            data.evaluation,
            topics=SWEEP_TOPICS,
            batch_size=max(1, round(PRIVATE_RATE * documents)),
            iterations=PRIVATE_ITERATIONS,
        )
    return rows


#: --sweep-unigram (issue 36): the rows reported for service/planning/schedules.py's ("lda", "vips") rule, by
#: privacy scale epsilon x D: (largest scale of the row, iterations T, unigram_share w); S = D,
#: unigram_clip 3 and doc_length 500 (N_w) in every row. Read off grids on the bundled corpus and on
#: planted-topic corpora (D 3,000 and 30,000; docs/schedules.md, "LDA"); a job that gives sigma
#: keeps T 10 and the model's defaults (w 0).
UNIGRAM_EPSILONS = (0.5, 1.0, 2.0, 5.0, 10.0)
#: --text-csv: the topics fitted on a text corpus (the issue's news measurements used K 50 and K 10).
TEXT_TOPICS = (50, 10)


def unigram_rule(scale: float) -> tuple[int, float, float]:
    """(T, unigram_share, unigram_clip) the service's LDA rule chooses at `scale` (epsilon x D x 100,000 /
    (K V): service.planning.schedules); sigma 0 (an infinite scale) takes the largest finite scale's."""
    rule = rule_for("lda", "vips")
    scale = min(scale, sys.float_info.max)
    options = rule_options(rule, scale, {})
    return rule_iterations(rule, scale), options["unigram_share"], options.get("unigram_clip", 1.0)


#: The private unigram comparator's share of the budget on the unigram block (the query needs w < 1).
UNIGRAM_ONLY_SHARE = 0.999


def private_unigram(
    train: Counts,
    *,
    epsilon: float,
    clip: float,
    store: InMemoryBowStore,
    word_prior: tuple[float, ...] | None = None,
) -> tuple[np.ndarray, float]:
    """The cheap private model the LDA fits should never fall behind (issue 36), and the ledger's epsilon:
    at the same epsilon and delta, one release through the gate of each document's clipped word counts
    with (almost) the whole budget (K 1, T 1, S = D, unigram_share UNIGRAM_ONLY_SHARE), estimated as the
    LDA M-step estimates its unigram (empirical Bayes, with `word_prior` if given;
    LatentDirichletAllocation.private_unigram). With S = D one release at the whole budget is the best any
    number of such releases can do (Gaussian releases of the same sum compose to one at the same noise)."""
    documents = int(train.shape[0])
    fit = sweep_fit(
        train,
        topics=1,
        sigma=calibrate_sigma(epsilon, documents, documents, 1, SWEEP_DELTA),
        batch_size=documents,
        iterations=1,
        store=store,
        unigram_share=UNIGRAM_ONLY_SHARE,
        unigram_clip=clip,
        word_prior=word_prior,
    )
    unigram = LatentDirichletAllocation(1, word_prior=word_prior).private_unigram(fit.state)
    assert unigram is not None  # the fit had the unigram block
    return unigram, fit.epsilon


def dirichlet_corpus(documents: int, seed: int) -> tuple[Counts, Counts]:
    """The stand-in, a generator unlike worker.datasets.synthetic_lda's (a check on the LDA rule, not what
    it was read off). 30 topics drawn from Dirichlet(0.02) over V = 5,000 words, each mixed half and half
    with a Zipf(1.1) background over a shuffled vocabulary; theta ~ Dirichlet(0.3); lengths
    1 + Poisson(59). Returns (train, test) with 1,000 test documents."""
    rng = np.random.default_rng(1000 + seed)
    vocabulary, topics = SWEEP_VOCABULARY, 30
    background = np.zeros(vocabulary)
    background[rng.permutation(vocabulary)] = 1.0 / np.arange(1, vocabulary + 1) ** 1.1
    background /= background.sum()
    beta = 0.5 * rng.dirichlet(np.full(vocabulary, 0.02), size=topics) + 0.5 * background
    corpus = generate_corpus(documents + 1000, beta / beta.sum(axis=1, keepdims=True), mean_length=60.0,
                             alpha=0.3, seed=seed)  # fmt: skip
    counts = sp.csr_array(corpus.counts)
    return sp.csr_array(counts[:documents]), sp.csr_array(counts[documents:])


def unigram_sweep_section(
    seeds: int,
    sizes: Sequence[int] = (3000,),
    *,
    word_prior: bool = True,
    epsilons: Sequence[float] = UNIGRAM_EPSILONS,
    noiseless: bool = True,
    texts: Sequence[TextCorpus] = (),
    text_topics: Sequence[int] = TEXT_TOPICS,
) -> list[SweepRow]:
    """Private LDA with the unigram block on the LDA rule's schedule at UNIGRAM_EPSILONS (and sigma 0 on
    its last row), `seeds` fits each, against the training unigram: on the bundled corpus (K 50), then per
    size D a planted-topic corpus (worker.datasets.synthetic_lda; V 5,000, ~50 tokens, K 20) and the
    stand-in (`dirichlet_corpus`, K 20). `word_prior` (as a job's default option): the M-step shrinks the
    unigram towards the public English word frequencies of the corpus's vocabulary (worker.models.word_prior;
    the synthetic corpora have no words, so they get no prior). `texts` (bench.text_corpus, --text-csv):
    each such corpus instead of the bundled one, at each of `text_topics`."""
    from worker.models.word_prior import english_prior

    priors: dict[str, tuple[float, ...] | None] = {}
    corpora: list[tuple[str, Counts, Counts, int]] = []
    named = [(text.name, text.train, text.test, text.vocabulary) for text in texts]
    if not texts:
        wiki = load_wikipedia()
        named = [("bundled Wikipedia", wiki.train, wiki.test, wiki.vocabulary)]
    for name, train, test, vocabulary in named:
        prior = english_prior(vocabulary) if word_prior else None
        priors[name] = None if prior is None else prior[0]
        for topics in text_topics if texts else (README_TOPICS,):
            corpora.append((name, train, test, topics))
    for documents in sizes:
        setting = SyntheticSetting(
            documents, SWEEP_VOCABULARY, SWEEP_TOPICS, SWEEP_MEAN_LENGTH, test_documents=1000
        )
        planted = synthetic_data(setting)
        corpora.append(("planted topics", planted.train, planted.evaluation.counts, SWEEP_TOPICS))
        train, test = dirichlet_corpus(documents, 0)
        corpora.append(("stand-in (Dirichlet topics)", train, test, SWEEP_TOPICS))
    rows = []
    for name, train, test, topics in corpora:
        evaluation = Evaluation.of(test, 1.0 / topics)
        documents = int(train.shape[0])
        unigram = unigram_perplexity(train, evaluation.held_out)
        test_unigram = unigram_perplexity(evaluation.observed, evaluation.held_out)
        private_store = InMemoryBowStore(name, train, public=False)
        public_store = InMemoryBowStore(name, train, public=True)
        for target in (*epsilons, *((math.inf,) if noiseless else ())):
            scale = job_scale("lda", "vips", documents, target, {"topics": topics}, int(train.shape[1]))
            iterations, share, clip = unigram_rule(scale)
            sigma = (
                0.0
                if math.isinf(target)
                else calibrate_sigma(target, documents, documents, iterations, SWEEP_DELTA)
            )
            for _ in range(seeds if sigma > 0 else 1):
                fit = sweep_fit(
                    train,
                    topics=topics,
                    sigma=sigma,
                    batch_size=documents,
                    iterations=iterations,
                    store=public_store if sigma == 0 else private_store,
                    unigram_share=share,
                    unigram_clip=clip,
                    word_prior=priors.get(name),
                )
                private_perplexity = math.nan
                if sigma > 0:
                    cheap, _ = private_unigram(
                        train, epsilon=target, clip=clip, store=private_store, word_prior=priors.get(name)
                    )
                    private_perplexity = evaluation.completion(cheap[None, :])
                row = SweepRow(
                    name, documents, documents, topics, fit.epsilon, sigma,
                    evaluation.completion(fit.state.lam), unigram, test_unigram, private_perplexity, target,
                )  # fmt: skip
                log(
                    f"  {name} D {documents}: eps {_eps(row.epsilon)} (T {iterations}, w {share}): "
                    f"{row.completion:.1f}, unigram {unigram:.1f}, private unigram {private_perplexity:.1f} "
                    f"({fit.seconds:.0f} s)"
                )
                rows.append(row)
    return rows


def _gap(value: float, baseline: float) -> str:
    return "-" if math.isnan(value) or math.isnan(baseline) else f"{100 * (value / baseline - 1):+.1f}%"


def sweep_markdown(rows: Sequence[SweepRow]) -> str:
    """One line per fit; with --sweep-unigram's comparator, also the gap to the private unigram."""
    cheap = any(not math.isnan(row.private_unigram) for row in rows)
    lines = [
        "| corpus | D | S | K | epsilon (delta 1e-4) | sigma | completion perplexity | unigram (training "
        "frequencies) | vs unigram |"
        + (" private unigram, same epsilon | vs private unigram |" if cheap else "")
        + " test documents' own frequencies (`vips evaluate`'s baseline) |",
        "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if cheap else "") + "---|",
    ]
    for row in rows:
        comparator = (
            f" {row.private_unigram:.1f} | {_gap(row.completion, row.private_unigram)} |" if cheap else ""
        )
        lines.append(
            f"| {row.corpus} | {row.documents:,} | {row.batch_size:,} | {row.topics} | {_eps(row.epsilon)} "
            f"| {row.sigma:.3g} | {row.completion:.1f} | {row.unigram:.1f} | "
            f"{_gap(row.completion, row.unigram)} |{comparator} {row.test_unigram:.1f} |"
        )
    return "\n".join(lines) + "\n"


def sweep_summary(rows: Sequence[SweepRow]) -> str:
    """Per corpus and epsilon, the mean completion perplexity's gap to the training unigram and, in
    brackets, the private unigram's own gap to it (the mean of its fits): what the topics bought over the
    cheap private model, and what the private unigram costs against the training one."""
    groups: dict[tuple[str, int, int], dict[str, list[SweepRow]]] = {}
    for row in rows:
        groups.setdefault((row.corpus, row.documents, row.topics), {}).setdefault(
            _eps(row.summary_epsilon), []
        ).append(row)
    epsilons = sorted({_eps(row.summary_epsilon) for row in rows}, key=float)
    lines = [
        "| corpus (D, K) | " + " | ".join(f"eps {e}" for e in epsilons) + " |",
        "|---|" + "---|" * len(epsilons),
    ]
    for (corpus, documents, topics), by_epsilon in groups.items():
        cells = []
        for key in epsilons:
            fits = by_epsilon.get(key, [])
            if not fits:
                cells.append("")
                continue
            unigram = fits[0].unigram
            own = _gap(float(np.mean([row.completion for row in fits])), unigram)
            cheap = [row.private_unigram for row in fits if not math.isnan(row.private_unigram)]
            cells.append(own + (f" ({_gap(float(np.mean(cheap)), unigram)})" if cheap else ""))
        lines.append(f"| {corpus} ({documents:,}, {topics}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------
# (c) The paper's scale.


def peak_rss_gb() -> float:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def full_corpus(setting: SyntheticSetting) -> tuple[Counts, Evaluation]:
    """The --full training corpus (FULL_PIECES pieces of planted-topic documents, seeds 1, 2, ...; int32
    CSR, built array by array) and its held-out evaluation set (seed 0 of the test generator's stream)."""
    truth = planted_topics(setting.topics, setting.vocabulary, seed=0)
    sizes = [len(part) for part in np.array_split(np.arange(setting.documents), FULL_PIECES)]
    pieces = [
        sp.csr_array(
            generate_corpus(
                size, truth, mean_length=setting.mean_length, alpha=setting.alpha, seed=1 + piece
            ).counts
        )
        for piece, size in enumerate(sizes)
    ]
    offsets = np.cumsum([0] + [int(piece.nnz) for piece in pieces])
    indptr = np.concatenate(
        [[0]] + [np.asarray(piece.indptr[1:], dtype=np.int64) + offsets[i] for i, piece in enumerate(pieces)]
    )
    data = np.empty(int(offsets[-1]), dtype=np.int32)
    indices = np.empty(int(offsets[-1]), dtype=np.int32)
    for i in range(len(pieces)):
        piece, pieces[i] = pieces[i], sp.csr_array((1, 1))  # released as soon as it is copied
        data[offsets[i] : offsets[i + 1]] = piece.data
        indices[offsets[i] : offsets[i + 1]] = piece.indices
        del piece
    counts = sp.csr_array((data, indices, indptr), shape=(setting.documents, setting.vocabulary))
    test = generate_corpus(
        setting.test_documents, truth, mean_length=setting.mean_length, alpha=setting.alpha, seed=2
    )
    return counts, Evaluation.of(test.counts, 1.0 / setting.topics)


def sklearn_minibatch_seconds(
    counts: Counts, topics: int, batches: int, seed: int = 0
) -> tuple[list[float], list[float]]:
    """Seconds of each of scikit-learn's online LDA updates (`partial_fit`, learning_method "online") on
    `batches` minibatches of FULL_BATCH documents drawn as VIPS draws them (uniformly, without replacement,
    independently per iteration), with VIPS's step sizes (learning_offset tau0, learning_decay kappa),
    total_samples D and alpha = eta = 1/K; one BLAS thread. Each update includes the row selection.
    Returns wall and CPU seconds per update."""
    from sklearn.decomposition import LatentDirichletAllocation as SkLda

    model = SkLda(
        n_components=topics,
        learning_method="online",
        batch_size=FULL_BATCH,
        learning_offset=PRIVATE_TAU0,
        learning_decay=PRIVATE_KAPPA,
        total_samples=counts.shape[0],
        doc_topic_prior=1.0 / topics,
        topic_word_prior=1.0 / topics,
        random_state=seed,
    )
    matrix = sp.csr_matrix(counts)
    rng = np.random.default_rng(seed)
    seconds: list[float] = []
    cpu: list[float] = []
    with threadpool_limits(1):
        for t in range(batches):
            start, start_cpu = time.perf_counter(), time.process_time()
            rows = np.sort(rng.choice(counts.shape[0], size=FULL_BATCH, replace=False))
            model.partial_fit(matrix[rows])
            seconds.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            log(f"  scikit-learn minibatch {t + 1}: {seconds[-1]:.1f} s ({cpu[-1]:.1f} s CPU)")
    return seconds, cpu


def full_mode(sigma: float = FULL_SIGMA, sklearn_batches: int = PRIVATE_ITERATIONS) -> str:
    """The paper's scale in process: corpus, store, 20 private releases through the gate with their M-steps
    (one BLAS thread), then scikit-learn's online LDA on `sklearn_batches` minibatches of the same size
    from the same corpus (0: skipped). Peak RSS is the whole process's (corpus generation included) when
    the fit ends, before scikit-learn runs."""
    setting = FULL_SETTING
    start = time.perf_counter()
    train, evaluation = full_corpus(setting)
    generated = time.perf_counter() - start
    generation_rss = peak_rss_gb()
    log(f"full: generated D = {setting.documents} (nnz {train.nnz}) in {generated:.0f} s")
    start = time.perf_counter()
    store = InMemoryBowStore("full", train, public=False)
    stored = time.perf_counter() - start
    times: list[float] = []
    cpu: list[float] = []
    last, last_cpu = time.perf_counter(), time.process_time()

    def tick(t: int, _state: LdaState) -> None:
        nonlocal last, last_cpu
        now, now_cpu = time.perf_counter(), time.process_time()
        times.append(now - last)
        cpu.append(now_cpu - last_cpu)
        log(
            f"  iteration {t}: {now - last:.2f} s ({now_cpu - last_cpu:.2f} s CPU), "
            f"peak RSS {peak_rss_gb():.2f} GB"
        )
        last, last_cpu = now, now_cpu

    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    with threadpool_limits(1):
        fit = vips_fit(
            train,
            topics=setting.topics,
            sigma=sigma,
            batch_size=FULL_BATCH,
            iterations=PRIVATE_ITERATIONS,
            doc_length=DOC_LENGTH,
            clip=CLIP,
            tau0=PRIVATE_TAU0,
            kappa=PRIVATE_KAPPA,
            delta=PRIVATE_DELTA,
            seed=0,
            on_iteration=tick,
            store=store,
        )
    fit_rss = peak_rss_gb()
    vips_iteration = float(np.median(times))
    sklearn_seconds, sklearn_cpu = sklearn_minibatch_seconds(train, setting.topics, sklearn_batches)
    completion = evaluation.completion(fit.state.lam)
    unigram = unigram_perplexity(train, evaluation.held_out)
    lines = [
        "| quantity | value |",
        "|---|---|",
        f"| corpus | D = {setting.documents:,}, V = {setting.vocabulary:,}, K = {setting.topics}, "
        f"{train.nnz:,} non-zeros, mean length {setting.mean_length:g} |",
        f"| schedule | S = {FULL_BATCH:,}, T = {PRIVATE_ITERATIONS}, N_w = {DOC_LENGTH}, a = {CLIP}, "
        f"sigma = {sigma:.4g}, {INNER_ITERATIONS} inner iterations, one thread |",
        f"| epsilon (delta = {PRIVATE_DELTA:g}) | {fit.epsilon:.3f} |",
        f"| corpus generation | {generated:.0f} s (peak RSS {generation_rss:.2f} GB) |",
        f"| store construction (bound checks) | {stored:.1f} s |",
        f"| fit wall time ({PRIVATE_ITERATIONS} releases + M-steps) | {fit.seconds:.1f} s |",
        f"| VIPS per iteration (median; load average at start {load}) | {vips_iteration:.2f} s "
        f"({np.median(cpu):.2f} s of CPU, both threads) |",
        f"| peak RSS (whole process, at the fit's end) | {fit_rss:.2f} GB |",
    ]
    if sklearn_seconds:
        median, median_cpu = float(np.median(sklearn_seconds)), float(np.median(sklearn_cpu))
        lines += [
            f"| scikit-learn online LDA per minibatch of {FULL_BATCH:,} (median of {len(sklearn_seconds)}) "
            f"| {median:.2f} s ({median_cpu:.2f} s of CPU) |",
            f"| ratio (scikit-learn / VIPS, seconds per iteration) | {median / vips_iteration:.2f}x "
            f"(CPU: {median_cpu / float(np.median(cpu)):.2f}x) |",
        ]
    lines.append(f"| held-out completion perplexity | {completion:.1f} (unigram {unigram:.1f}) |")
    return "\n".join(lines) + "\n"


def worker_peak_rss_gb(pid: int) -> float:
    """Peak resident set size (VmHWM) of another process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("no VmHWM in /proc: peak RSS needs Linux")


def full_worker_mode(work: Path) -> str:
    """The full configuration as a service job: the corpus ingested into PostgreSQL (the sensitive
    database), the job submitted over HTTP and run by a real `vips worker` (Celery, Redis, the gate over
    the database store, the ledger), as tests/e2e.py starts them. Wall time from the job's own timestamps;
    peak RSS of the worker process."""
    from datetime import datetime

    from privacy_wall.data.docword import BagOfWords
    from privacy_wall.data.ingest import ingest_bag_of_words
    from privacy_wall.sqlengine import create_db_engine
    from service.http.client import VipsClient
    from tests.e2e import production_service

    setting = FULL_SETTING
    start = time.perf_counter()
    data = synthetic_data(setting)
    log(f"full (worker): generated D = {setting.documents} (nnz {data.train.nnz}) in "
        f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    train = data.train
    corpus = BagOfWords(
        np.asarray(train.indptr, dtype=np.int64),
        np.asarray(train.indices, dtype=np.int32),
        np.asarray(train.data, dtype=np.int32),
        tuple(f"w{v}" for v in range(setting.vocabulary)),
    )
    with production_service(work) as service:
        control = create_db_engine(service.env["VIPS_CONTROL_DATABASE_URL"])
        sensitive = create_db_engine(service.env["VIPS_SENSITIVE_DATABASE_URL"])
        start = time.perf_counter()
        # Synthetic, so marked public: the paper's delta 1e-4 is not below 1/D, which a private dataset's
        # budget refuses (docs/design.md, section 3, delta policy); at sigma > 0 the job runs as on
        # private data.
        ingest_bag_of_words(control=control, sensitive=sensitive, name="full", corpus=corpus, public=True)
        ingested = time.perf_counter() - start
        log(f"  ingested into PostgreSQL in {ingested:.0f} s")
        custodian, analyst = service.key("custodian", "full"), service.key("analyst")
        service.vips(
            "budget", "set", "full", "--epsilon", "3", "--delta", f"{PRIVATE_DELTA:g}", key=custodian
        )
        worker_pid = service.processes["worker"].pid
        rss_before = worker_peak_rss_gb(worker_pid)
        options = {"topics": float(setting.topics), "doc_length": float(DOC_LENGTH), "clip": CLIP,
                   "tau0": PRIVATE_TAU0, "kappa": PRIVATE_KAPPA}  # fmt: skip
        with VipsClient(service.url, analyst) as api:
            job = api.submit_job(dataset="full", model="lda", iterations=PRIVATE_ITERATIONS,
                                 batch_size=FULL_BATCH, sigma=FULL_SIGMA, options=options)  # fmt: skip
            done = api.wait(job["id"], interval=2.0, timeout=3600)
            if done["status"] != "succeeded":
                raise RuntimeError(f"the job ended {done['status']}: {done.get('error')}")
            posterior = api.posterior(job["id"])
        peak = worker_peak_rss_gb(worker_pid)
        control.dispose()
        sensitive.dispose()
    seconds = (
        datetime.fromisoformat(done["finished_at"]) - datetime.fromisoformat(done["created_at"])
    ).total_seconds()
    lam = np.asarray(posterior["lambda"], dtype=np.float64)
    completion = data.evaluation.completion(lam)
    unigram = unigram_perplexity(data.train, data.evaluation.held_out)
    lines = [
        "| quantity | value |",
        "|---|---|",
        f"| corpus | D = {setting.documents:,}, V = {setting.vocabulary:,}, K = {setting.topics}, "
        f"{data.train.nnz:,} non-zeros, in PostgreSQL (ingested in {ingested:.0f} s) |",
        f"| schedule | S = {FULL_BATCH:,}, T = {PRIVATE_ITERATIONS}, N_w = {DOC_LENGTH}, a = {CLIP}, "
        f"sigma = {FULL_SIGMA} |",
        f"| epsilon spent (delta = {PRIVATE_DELTA:g}) | {done['epsilon_spent']:.3f} |",
        f"| job wall time (submit to finished, in the worker) | {seconds:.0f} s ({seconds / 60:.1f} min) |",
        f"| worker peak RSS | {peak:.2f} GB (idle worker before the job: {rss_before:.2f} GB) |",
        f"| held-out completion perplexity | {completion:.1f} (unigram {unigram:.1f}) |",
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------
# Output.


def _eps(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}"


def markdown(rows: Sequence[Row]) -> str:
    lines = [
        "| section | method | setting | sigma | epsilon | docs/s | completion perplexity | perplexity bound "
        "| runs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        speed = f"{np.median(row.docs_per_second):.0f}" if row.docs_per_second else "-"
        lines.append(
            f"| {row.section} | {row.method} | {row.setting} | {row.sigma:.3g} | {_eps(row.epsilon)} "
            f"| {speed} | {mean_std(row.completion)} | {mean_std(row.bound)} | {len(row.completion)} |"
        )
    return "\n".join(lines) + "\n"


def summary(rows: Sequence[Row]) -> str:
    by_method = {
        row.method: row for row in rows if row.section == "wikipedia" and "article" not in row.setting
    }
    vips = by_method.get("VIPS-LDA (sigma = 0, shuffled passes)")
    sk = by_method.get("scikit-learn online LDA")
    gs = by_method.get("gensim LdaModel")
    if vips is None or sk is None or gs is None:
        return ""
    speed = np.median(vips.docs_per_second) / np.median(sk.docs_per_second)
    gspeed = np.median(vips.docs_per_second) / np.median(gs.docs_per_second)
    gap = np.mean(vips.completion) / np.mean(sk.completion) - 1
    return (
        f"VIPS / scikit-learn: {speed:.2f}x documents per second, completion perplexity {100 * gap:+.1f}%; "
        f"VIPS / gensim: {gspeed:.2f}x documents per second\n"
    )


def plot(rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12.0, 4.5))
    wiki = [r for r in rows if r.section == "wikipedia"]
    for row in wiki:
        label = row.method + (" (article order)" if "article order" in row.setting else "")
        left.scatter(row.docs_per_second, row.completion, label=label)
    left.set_xscale("log")
    left.set_xlabel("documents per second (1 thread)")
    left.set_ylabel("held-out completion perplexity")
    left.set_title(f"Wikipedia paragraphs, K = {WIKI_TOPICS}, non-private")
    left.legend(fontsize=7)
    left.grid(True, alpha=0.3)
    private = [r for r in rows if r.section == "private"]
    for row in private:
        if row.curve:
            right.plot(range(1, len(row.curve) + 1), row.curve, marker="o", ms=3, label=row.method)
        elif row.completion:
            right.axhline(
                row.completion[0],
                linestyle=":",
                color="k" if "unigram" in row.method else "g",
                label=row.method,
            )
    right.set_xlabel("iteration")
    right.set_ylabel("held-out completion perplexity")
    right.set_title(f"Synthetic, eps = {PRIVATE_EPSILON} (delta = {PRIVATE_DELTA:g}), S/D = {PRIVATE_RATE}")
    right.set_yscale("log")
    right.legend(fontsize=7)
    right.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one seed, a smaller private corpus")
    parser.add_argument("--full", action="store_true", help="only the paper-scale timing run")
    parser.add_argument(
        "--full-worker", action="store_true", help="the paper-scale run as a service job (PostgreSQL, Redis)"
    )
    parser.add_argument(
        "--full-epsilon",
        type=float,
        default=None,
        help="--full: calibrate sigma to this epsilon (default: the paper's sigma 1.24)",
    )
    parser.add_argument(
        "--sklearn-batches",
        type=int,
        default=PRIVATE_ITERATIONS,
        help="--full: scikit-learn online LDA updates timed on minibatches of the same size (0: none)",
    )
    parser.add_argument("--seeds", type=int, default=None, help="wikipedia repeats (5; 1 with --quick)")
    parser.add_argument("--wikipedia-only", action="store_true", help="skip the private section")
    parser.add_argument(
        "--whole-process",
        action="store_true",
        help="only `vips fit --local` as a whole process against scikit-learn's fit (bench.lda_process)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="--whole-process: alternated repeats")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="only the private sweep: epsilon 1, 2.4, 10, 100 and sigma 0 against the unigram baseline, on "
        "the README's job and on planted-topic corpora of growing size",
    )
    parser.add_argument(
        "--sweep-sizes",
        default=",".join(str(size) for size in SWEEP_SIZES),
        help="--sweep: the synthetic corpora's sizes, comma-separated (default %(default)s; empty: none)",
    )
    parser.add_argument(
        "--sweep-unigram",
        type=int,
        default=0,
        metavar="SEEDS",
        help="only the unigram-block sweep (issue 36): epsilon 0.5-10 and sigma 0 on the LDA rule's "
        "schedule, SEEDS fits each, on the bundled corpus and on planted-topic and stand-in corpora of "
        "--unigram-sizes",
    )
    parser.add_argument(
        "--unigram-sizes",
        default="3000",
        help="--sweep-unigram: the synthetic corpora's sizes, comma-separated (default %(default)s)",
    )
    parser.add_argument(
        "--no-unigram-prior",
        action="store_true",
        help="--sweep-unigram: no public English word-frequency prior (a job's option word_prior=0)",
    )
    parser.add_argument(
        "--unigram-epsilons",
        default=",".join(str(e) for e in UNIGRAM_EPSILONS),
        help="--sweep-unigram: the epsilons, comma-separated (default %(default)s)",
    )
    parser.add_argument("--no-noiseless", action="store_true", help="--sweep-unigram: skip the sigma 0 rows")
    parser.add_argument(
        "--text-csv",
        type=Path,
        action="append",
        default=[],
        help="--sweep-unigram: a public CSV text corpus instead of the bundled one (bench/text_corpus.py: "
        "80/20 split, the 5,000 most frequent training words); repeatable",
    )
    parser.add_argument("--text-column", default="text", help="--text-csv: the column of texts (%(default)s)")
    parser.add_argument(
        "--text-topics",
        default=",".join(str(k) for k in TEXT_TOPICS),
        help="--text-csv: the topics K, comma-separated (default %(default)s)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if args.whole_process:
        from bench.lda_process import measure, report

        table = report(measure(args.repeats))
        print(table)
        (args.out / "lda_process.md").write_text(
            f"Produced by `python -m bench.lda --whole-process --repeats {args.repeats}`.\n\n{table}\n",
            encoding="utf-8",
        )
        return 0
    if args.sweep_unigram:
        unigram_sizes = [int(size) for size in args.unigram_sizes.split(",") if size.strip()]
        epsilons = [float(e) for e in args.unigram_epsilons.split(",") if e.strip()]
        texts = [text_corpus(path, args.text_column) for path in args.text_csv]
        unigram_rows = unigram_sweep_section(
            args.sweep_unigram,
            unigram_sizes,
            word_prior=not args.no_unigram_prior,
            epsilons=epsilons,
            noiseless=not args.no_noiseless,
            texts=texts,
            text_topics=[int(k) for k in args.text_topics.split(",") if k.strip()],
        )
        table = (
            "Mean gap to the training unigram (in brackets: the private unigram's, at the same epsilon)\n\n"
            f"{sweep_summary(unigram_rows)}\n{sweep_markdown(unigram_rows)}"
        )
        print(table)
        stem = "lda_sweep_text" if texts else "lda_sweep_unigram"
        name = f"{stem}_no_prior.md" if args.no_unigram_prior else f"{stem}.md"
        text_flags = "".join(f" --text-csv {path.name}" for path in args.text_csv)
        if texts:
            text_flags += f" --text-column {args.text_column} --text-topics {args.text_topics}"
        (args.out / name).write_text(
            f"Produced by `python -m bench.lda --sweep-unigram {args.sweep_unigram} --unigram-sizes "
            f"{args.unigram_sizes} --unigram-epsilons {args.unigram_epsilons}{text_flags}"
            f"{' --no-unigram-prior' if args.no_unigram_prior else ''}"
            f"{' --no-noiseless' if args.no_noiseless else ''}`.\n\n{table}",
            encoding="utf-8",
        )
        return 0
    if args.sweep:
        sizes = [int(size) for size in args.sweep_sizes.split(",") if size.strip()]
        table = sweep_markdown(sweep_section(sizes))
        elapsed = time.perf_counter() - start
        print(table)
        print(f"({elapsed:.0f} s)")
        (args.out / "lda_sweep.md").write_text(
            f"Produced by `python -m bench.lda --sweep --sweep-sizes {','.join(map(str, sizes))}` in "
            f"{elapsed:.0f} s.\n\n{table}",
            encoding="utf-8",
        )
        return 0
    if args.full_worker:
        import tempfile

        with tempfile.TemporaryDirectory() as work:
            table = full_worker_mode(Path(work))
        print(table)
        (args.out / "lda_full_worker.md").write_text(
            f"Produced by `python -m bench.lda --full-worker`.\n\n{table}", encoding="utf-8"
        )
        return 0
    if args.full:
        sigma = FULL_SIGMA
        if args.full_epsilon is not None:
            sigma = calibrate_sigma(
                args.full_epsilon, FULL_BATCH, FULL_SETTING.documents, PRIVATE_ITERATIONS, PRIVATE_DELTA
            )
        table = full_mode(sigma, args.sklearn_batches)
        print(table)
        (args.out / "lda_full.md").write_text(
            f"Produced by `python -m bench.lda --full`.\n\n{table}", encoding="utf-8"
        )
        return 0
    seeds = args.seeds if args.seeds is not None else (1 if args.quick else 5)
    rows = wikipedia_section(seeds, article_order=not args.quick)
    if args.wikipedia_only:
        table = markdown(rows)
        print(table)
        print(summary(rows))
        (args.out / "lda_wikipedia.md").write_text(
            f"Produced by `python -m bench.lda --wikipedia-only`.\n\n{table}\n{summary(rows)}",
            encoding="utf-8",
        )
        return 0
    private_rows, info = private_section(args.quick, repeats=1 if args.quick else 2)
    rows += private_rows
    elapsed = time.perf_counter() - start
    table = markdown(rows)
    notes = (
        f"Private section: sigma {info['sigma_ma']:.3f} (moments accountant, eps "
        f"{info['epsilon_ma']:.3f}) and {info['sigma_strong']:.3f} (strong composition at eps "
        f"{info['strong_epsilon_of_strong_sigma']:.3f}; the moments accountant charges it "
        f"{info['ma_epsilon_of_strong_sigma']:.3f}); documents clipped at a = {CLIP}: "
        f"{100 * info['clipped_fraction']:.0f}% (final topics, 2,000 training documents).\n"
    )
    print(table)
    print(summary(rows) + notes)
    print(f"({elapsed:.0f} s)")
    command = (
        "python -m bench.lda"
        + (" --quick" if args.quick else "")
        + (f" --seeds {args.seeds}" if args.seeds is not None else "")
    )
    stem = "lda_quick" if args.quick else "lda"
    (args.out / f"{stem}.md").write_text(
        f"Produced by `{command}` in {elapsed:.0f} s.\n\n{table}\n{summary(rows)}{notes}", encoding="utf-8"
    )
    plot(rows, args.out / f"{stem}.png")
    log(f"wrote {args.out / (stem + '.md')} and {args.out / (stem + '.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
