"""bench.lda's --sweep (how much data and epsilon private LDA needs to beat the unigram baseline) and
--sweep-unigram (the unigram fallback on the LDA rule's rows): bench/lda.py says what each measures."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from bench.lda_common import (
    CLIP,
    DOC_LENGTH,
    PRIVATE_ITERATIONS,
    PRIVATE_RATE,
    Counts,
    Evaluation,
    SyntheticSetting,
    VipsFit,
    eps_text,
    log,
    synthetic_data,
    vips_fit,
)
from bench.text_corpus import TextCorpus
from control.planning.schedules import job_scale, rule_for, rule_iterations, rule_options
from privacy_wall.accounting.calibration import calibrate_sigma
from privacy_wall.data.store import InMemoryBowStore
from vips.datasets.synthetic_lda import generate_corpus
from vips.datasets.wikipedia import load_wikipedia
from vips.models.lda.model import (
    LatentDirichletAllocation,
    unigram_perplexity,
)

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
            f"  {corpus} D = {documents}: eps {eps_text(row.epsilon)} (sigma {sigma:.3g}): completion "
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


#: --sweep-unigram (issue 36): the rows reported for control/planning/schedules.py's ("lda", "vips") rule, by
#: privacy scale epsilon x D: (largest scale of the row, iterations T, unigram_share w); S = D,
#: unigram_clip 3 and doc_length 500 (N_w) in every row. Read off grids on the bundled corpus and on
#: planted-topic corpora (D 3,000 and 30,000; docs/schedules.md, "LDA"); a job that gives sigma
#: keeps T 10 and the model's defaults (w 0).
UNIGRAM_EPSILONS = (0.5, 1.0, 2.0, 5.0, 10.0)
#: --text-csv: the topics fitted on a text corpus (the issue's news measurements used K 50 and K 10).
TEXT_TOPICS = (50, 10)


def unigram_rule(scale: float) -> tuple[int, float, float]:
    """(T, unigram_share, unigram_clip) the service's LDA rule chooses at `scale` (epsilon x D x 100,000 /
    (K V): control.planning.schedules); sigma 0 (an infinite scale) takes the largest finite scale's."""
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
    """The stand-in, a generator unlike vips.datasets.synthetic_lda's (a check on the LDA rule, not what
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
    size D a planted-topic corpus (vips.datasets.synthetic_lda; V 5,000, ~50 tokens, K 20) and the
    stand-in (`dirichlet_corpus`, K 20). `word_prior` (as a job's default option): the M-step shrinks the
    unigram towards the public English word frequencies of the corpus's vocabulary
    (vips.models.lda.word_prior; the synthetic corpora have no words, so they get no prior). `texts`
    (bench.text_corpus, --text-csv):
    each such corpus instead of the bundled one, at each of `text_topics`."""
    from vips.models.lda.word_prior import english_prior

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
                    f"  {name} D {documents}: eps {eps_text(row.epsilon)} (T {iterations}, w {share}): "
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
            f"| {row.corpus} | {row.documents:,} | {row.batch_size:,} | {row.topics} | "
            f"{eps_text(row.epsilon)} | {row.sigma:.3g} | {row.completion:.1f} | {row.unigram:.1f} | "
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
            eps_text(row.summary_epsilon), []
        ).append(row)
    epsilons = sorted({eps_text(row.summary_epsilon) for row in rows}, key=float)
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
