"""What bench.lda's sections share: the corpora's settings, the evaluation, and one fit by VIPS,
scikit-learn and gensim (bench/lda.py says what each section measures)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from privacy_wall.data.store import InMemoryBowStore
from privacy_wall.gate import Gate
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.queries.lda import (
    LdaQuery,
)
from vips.datasets.synthetic_lda import generate_corpus, planted_topics
from vips.models.lda.model import (
    LatentDirichletAllocation,
    LdaState,
    completion_perplexity,
    default_smoothing,
    perplexity_bound,
    split_documents,
)
from vips.runner import LoopSettings, run_vips

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


def eps_text(value: float) -> str:
    """An epsilon for a table: "inf" for sigma 0, else 3 significant digits."""
    return "inf" if math.isinf(value) else f"{value:.3g}"
