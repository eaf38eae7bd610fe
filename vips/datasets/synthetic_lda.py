"""Synthetic LDA corpora with planted topics and a Zipf-like vocabulary (for tests and benchmarks).

Planted topics: the vocabulary's V words are dealt round-robin into K disjoint groups (so every group
has frequent and rare words); topic k puts mass `specificity` on its own group, Zipf-distributed
(p proportional to 1 / rank^zipf_exponent in the group), and the rest on a background Zipf law over the
whole vocabulary shared by all topics (the corpus's "stop words"). Documents follow LDA's generative
process: theta_d ~ Dirichlet(alpha), length N_d ~ 1 + Poisson(mean_length - 1), z_dn ~ theta_d,
w_dn ~ beta_{z_dn}; generated in chunks of documents, with no dense D x V matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

Array = NDArray[np.float64]

GENERATION_CHUNK = 4096


@dataclass(frozen=True, eq=False)
class SyntheticCorpus:
    """counts: D x V word counts (CSR, int32); topics: the true K x V beta; proportions: D x K theta."""

    counts: sp.csr_array
    topics: Array
    proportions: Array


def zipf(size: int, exponent: float) -> Array:
    """p_r proportional to 1 / r^exponent for ranks r = 1..size."""
    weights = 1.0 / np.arange(1, size + 1, dtype=np.float64) ** exponent
    out: Array = weights / weights.sum()
    return out


def planted_topics(
    topics: int,
    vocabulary: int,
    *,
    specificity: float = 0.9,
    zipf_exponent: float = 1.0,
    seed: int = 0,
) -> Array:
    """K x V topic-word distributions (rows sum to 1) with disjoint, Zipf-shaped word groups.

    The vocabulary is shuffled (seeded) before being dealt, so word ids carry no group structure.
    """
    if vocabulary < topics:
        raise ValueError("need at least one word per topic")
    rng = np.random.default_rng(seed)
    words = rng.permutation(vocabulary)
    background = np.zeros(vocabulary)
    background[words] = zipf(vocabulary, zipf_exponent)
    beta = np.tile((1.0 - specificity) * background, (topics, 1))
    for k in range(topics):
        group = words[k::topics]
        beta[k, group] += specificity * zipf(group.size, zipf_exponent)
    out: Array = beta / beta.sum(axis=1, keepdims=True)
    return out


def _draw(cumulative: Array, rows: NDArray[np.int64], uniforms: Array) -> NDArray[np.int64]:
    """Inverse-CDF draws: for each i, the first column j with cumulative[rows[i], j] > uniforms[i]."""
    width = cumulative.shape[1]
    flat = (cumulative + np.arange(cumulative.shape[0])[:, None]).ravel()
    found = np.searchsorted(flat, rows + uniforms, side="right") - rows * width
    out: NDArray[np.int64] = np.clip(found, 0, width - 1).astype(np.int64)
    return out


def generate_corpus(
    documents: int,
    topics: Array,
    *,
    mean_length: float = 100.0,
    alpha: float = 0.1,
    seed: int = 0,
) -> SyntheticCorpus:
    """Documents drawn from LDA with the given true topics (K x V, rows summing to 1)."""
    rng = np.random.default_rng(seed)
    k_topics, vocabulary = topics.shape
    proportions = rng.dirichlet(np.full(k_topics, alpha), size=documents)
    lengths = 1 + rng.poisson(max(mean_length - 1.0, 0.0), size=documents)
    topic_cdf = np.cumsum(topics, axis=1)
    topic_cdf[:, -1] = 1.0
    pieces: list[sp.csr_array] = []
    for start in range(0, documents, GENERATION_CHUNK):
        stop = min(documents, start + GENERATION_CHUNK)
        chunk_lengths = lengths[start:stop]
        theta_cdf = np.cumsum(proportions[start:stop], axis=1)
        theta_cdf[:, -1] = 1.0
        doc = np.repeat(np.arange(stop - start, dtype=np.int64), chunk_lengths)
        z = _draw(theta_cdf, doc, rng.random(doc.size))
        w = _draw(topic_cdf, z, rng.random(doc.size))
        piece = sp.csr_array((np.ones(doc.size, dtype=np.int32), (doc, w)), shape=(stop - start, vocabulary))
        piece.sum_duplicates()
        pieces.append(piece)
    counts = sp.csr_array(sp.vstack(pieces, format="csr"))
    return SyntheticCorpus(counts, topics, proportions)
