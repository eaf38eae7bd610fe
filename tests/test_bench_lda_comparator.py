"""bench.lda_sweeps' private-unigram comparator (--sweep-unigram): the cheap private model at the same
epsilon."""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from bench.lda_sweeps import SweepRow, private_unigram, sweep_summary
from privacy_wall.data.store import InMemoryBowStore
from vips.datasets.synthetic_lda import generate_corpus, planted_topics


def test_private_unigram_is_the_clipped_word_frequencies_at_the_ledgers_epsilon() -> None:
    """Through the gate at the target epsilon, its one topic is the documents' clipped word counts,
    normalised: each document's counts scaled to L2 norm <= clip, summed. At epsilon 1,000 the noise is
    small against every word's summed count and the total variation from the clipped frequencies is ~0.001
    (0.0009 on this corpus); the unclipped frequencies are ~0.009 away, so 0.004 tells the two apart and
    leaves room for the empirical-Bayes estimate's pull on the rarest words and the M-step's prior eta."""
    corpus = sp.csr_array(
        generate_corpus(400, planted_topics(4, 60, seed=1), mean_length=40.0, seed=2).counts
    )
    clip = 3.0
    topic, epsilon = private_unigram(
        corpus, epsilon=1000.0, clip=clip, store=InMemoryBowStore("c", corpus, public=False)
    )
    assert topic.shape == (60,)
    assert math.isclose(epsilon, 1000.0, rel_tol=2e-3)
    dense = corpus.toarray().astype(np.float64)
    norms = np.linalg.norm(dense, axis=1, keepdims=True)
    clipped = (dense * np.minimum(1.0, clip / np.maximum(norms, 1e-12))).sum(axis=0)
    assert 0.5 * np.abs(topic - clipped / clipped.sum()).sum() < 0.004
    # ...and at epsilon 1 the same release is far noisier (the comparator is private, not the truth).
    noisy, noisy_epsilon = private_unigram(
        corpus, epsilon=1.0, clip=clip, store=InMemoryBowStore("c", corpus, public=False)
    )
    assert math.isclose(noisy_epsilon, 1.0, rel_tol=2e-3)
    assert np.abs(noisy - clipped / clipped.sum()).sum() > np.abs(topic - clipped / clipped.sum()).sum()


def _row(epsilon: float, completion: float, private_unigram: float, target: float = math.nan) -> SweepRow:
    return SweepRow("c", 100, 100, 5, epsilon, 1.0, completion, 100.0, 90.0, private_unigram, target)


def test_summary_averages_fits_per_corpus_and_epsilon() -> None:
    rows = [
        _row(1.0, 110.0, 104.0),
        _row(0.9994, 120.0, 106.0, target=1.0),  # grouped by its target, not the ledger's 0.999
        _row(9.99, 98.0, 99.0),
        _row(math.inf, 80.0, math.nan),
    ]
    table = sweep_summary(rows)
    assert "| eps 1 | eps 9.99 | eps inf |" in table
    # Mean of 110 and 120 against the training unigram 100; the private unigram's mean 105 in brackets.
    assert "| c (100, 5) | +15.0% (+5.0%) | -2.0% (-1.0%) | -20.0% |" in table
