"""Latent Dirichlet allocation's E-step behind the wall (VIPS paper Sec. 4, Alg. 3).

Public parameters: E[log beta] (K x V, `expected_log_beta`), from the released posterior q(beta | lambda).
For each document d of the minibatch (paper notation; code names in brackets):

1. Resampling (Sec. 4.2): the document becomes exactly N_w tokens [doc_length] drawn with replacement from
   its own words, so every document has the same length and the per-document bound below holds. The
   draws use the release's generator in a data-independent way: one uniform matrix U of shape S x N_w is
   drawn up front and token n of the document in row d is the word where U[d, n] falls in the document's
   cumulative counts. The number of draws never depends on the data, and replacing one document leaves
   every other document's tokens unchanged.
2. A fixed number [inner_iterations] of coordinate-ascent steps, never a convergence test:
       phi_{dvk} proportional to exp(E[log theta_dk] + E[log beta_kv])      (phi, per distinct word v)
       gamma_dk = alpha + sum_v n_dv phi_{dvk}                                (gamma)
   with E[log theta_dk] = digamma(gamma_dk) - digamma(sum_k gamma_dk), starting from uniform theta.
3. The contribution s^d_{kv} = sum_n phi_{dnk} w_{dnv} = n_dv phi_{dvk}: entrywise non-negative with
   L1 norm N_w, hence L2 norm <= N_w; clipped to L2 norm a N_w [clip] (Eq. 29).

One block "s" (K x V, flattened row-major): per-record bound C = a N_w, non-negative, so under
replace-one Delta = sqrt(2) a N_w / S (docs/design.md section 2; the paper's N / S is the add/remove bound).
Post-processing sets negative entries of the noised mean to zero.

Optional unigram block "u" (unigram_share w in (0, 1); 0, the default, releases s alone as above). Each
document also contributes its own word counts n_d (V-vector, the sanitized counts before resampling),
clipped to L2 norm C_u [unigram_clip]: non-negative, so replace-one moves the batch mean by at most
sqrt(2) C_u / S. The two blocks are declared with inflated bounds C_s / sqrt(1 - w) and C_u / sqrt(w),
so each normalised block (block b divided by its declared Delta_b) moves by at most sqrt(1 - w) resp.
sqrt(w) under any replacement, and the concatenation by at most sqrt((1 - w) + w) = 1 whatever the
replacement: the query declares joint sensitivity J = 1 (<= sqrt(2)). The noise stds are then
sigma sqrt(2) C_s / (S sqrt(1 - w)) on s and sigma sqrt(2) C_u / (S sqrt(w)) on u: the share w splits one
Gaussian mechanism's budget between them, and the release stays one event at multiplier sigma. The bound
is reached by replacing a document that reaches both clips with one on disjoint words that does too
(tests/privacy_wall/queries/test_lda.py). With the unigram block, post-processing keeps s's negative
entries (the M-step averages raw releases; setting them to 0 would bias the average upwards).

Keeping documents as they are (doc_length = 0) makes the per-document bound the document's length,
which nothing bounds on private data. Such a query must be built with `max_document_length` L, declares
C = a L and clips every contribution to it, so a release stays differentially private at the declared
Delta whatever the documents are; but documents longer than L are then biased towards zero. The option
is meant for public data at sigma = 0 (docs/design.md section 6), where L is the corpus's longest document and
a = 1, so nothing is clipped: callers that accept a job specification refuse doc_length = 0 with
sigma > 0 (see control.planning.options.schedule_problem). The wall itself never needs that rule to stay
private.

Speed: the whole minibatch is processed at once, in chunks of documents sorted by their number of
distinct words (so little padding is needed): a fixed number per chunk for resampled documents (whose
width N_w is public), as many as fit a memory budget otherwise. A chunk's exp(E[log beta]) columns are
gathered once into a padded (documents x K x words) array that stays in cache for all inner iterations,
so each iteration is two batched matrix-vector products, a digamma and an exp; there is no dense S x V
matrix and no Python loop per document. The wall's query runs those products in float32 (`fit_chunks`,
single; LdaQuery's float32_iterations) and everything after the last iteration (normaliser, contribution,
norm, clipping, the sum) in float64; evaluation outside the wall (`fit_documents`) stays float64. The
resampling searches each document's uniforms in sorted order (the same tokens; sorted keys make numpy's
search cache-friendly). As for any sparse E-step, the running time grows with the number of distinct
words in the batch; the released values do not depend on the chunking (with float32 iterations, up to
float32 rounding: a document's products then depend on its chunk's padded width at ~1e-7 relative).

Numerics: phi is invariant to rescaling exp(E[log beta_kv]) per word v and exp(E[log theta_dk]) per
document d, so both are shifted to a maximum of 1 before exponentiating; a word whose normaliser still
underflows below PHI_NORM_FLOOR is dropped from its document (its phi is 0), which only lowers the
contribution's norm. Counts of a batch that breaks the ingestion bounds are read as
min(floor(count), 2^31 - 1) when finite and positive, 0 otherwise; every intermediate then stays finite.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.special import digamma

from privacy_wall.data.store import MAX_COUNT, Batch
from privacy_wall.noise.mechanisms import clip_factors
from privacy_wall.queries.base import Array, Block

Counts = sp.csr_array
IntArray = NDArray[np.int64]

PARAM = "expected_log_beta"
BLOCK = "s"
UNIGRAM_BLOCK = "u"

#: Normalisers sum_k E_dk B_kv below this are treated as 0 (the word is dropped from the document). With
#: counts <= 2^31 the ratios n / normaliser stay below ~1e260, far from overflow.
PHI_NORM_FLOOR = 1e-250
#: The same floor for the float32 inner iterations of `fit_chunks(..., single=True)`: n / floor <= 2.1e28,
#: so sums of ratios over any document stay finite in float32.
SINGLE_NORM_FLOOR = 1e-19

#: Budget of float64 elements for a chunk's padded (documents x K x words) array: 2^19 (4 MB) keeps it in
#: the L2/L3 cache across the inner iterations.
CHUNK_ELEMENTS = 2**19
MAX_CHUNK_DOCUMENTS = 4096
MIN_ADAPTIVE_CHUNK = 32
WIDTH_RATIO = 1.5

#: (document, word) entries (padded) gathered before the query scatters them into its K x V total.
SCATTER_ENTRIES = 2**18

#: Documents per chunk of the resampling's sorted search (bounds its temporary arrays; any fixed value).
RESAMPLE_CHUNK = 1024


# --------------------------------------------------------------------------------------------------------
# Counts and resampling.


def sanitize_counts(counts: Counts) -> Counts:
    """Canonical CSR int64 counts: duplicates summed, each count min(floor(c), MAX_COUNT) when finite and
    positive, else dropped. The identity on what ingestion stores (whole numbers in [1, MAX_COUNT])."""
    matrix = sp.csr_array(counts)
    if not matrix.has_canonical_format:
        matrix = matrix.copy()
        matrix.sum_duplicates()
    data = np.asarray(matrix.data)
    if np.issubdtype(data.dtype, np.integer):
        clean = np.minimum(data, MAX_COUNT).astype(np.int64)
    else:
        finite = np.where(np.isfinite(data), data, 0.0)
        clean = np.floor(np.clip(finite, 0.0, MAX_COUNT)).astype(np.int64)
    np.maximum(clean, 0, out=clean)
    if clean.all():  # what the stores hold: share the (read-only here) index arrays
        return sp.csr_array((clean, matrix.indices, matrix.indptr), shape=matrix.shape)
    # eliminate_zeros works in place: never on index arrays shared with the caller's batch.
    out = sp.csr_array((clean, matrix.indices.copy(), matrix.indptr.copy()), shape=matrix.shape)
    out.eliminate_zeros()
    return out


def resample_documents(counts: Counts, length: int, rng: np.random.Generator) -> Counts:
    """Each non-empty document (row) becomes `length` tokens drawn with replacement from its words, with
    probabilities proportional to its counts; empty documents stay empty.

    Draws exactly counts.shape[0] x length uniforms from `rng` whatever the data; row d's tokens depend
    only on row d of `counts` and row d of the uniforms (inverse-CDF through the row's own cumulative
    counts, computed exactly in int64). `counts` must be canonical with positive integer data
    (`sanitize_counts`). The result keeps the input's sparsity structure, with zero entries removed.
    """
    rows = counts.shape[0]
    uniforms = rng.random((rows, length))
    indptr = np.asarray(counts.indptr, dtype=np.int64)
    data = np.asarray(counts.data, dtype=np.int64)
    cumulative = np.cumsum(data)
    drawn = np.zeros(data.shape[0], dtype=np.int64)
    for start in range(0, rows, RESAMPLE_CHUNK):
        stop = min(rows, start + RESAMPLE_CHUNK)
        lo, hi = int(indptr[start]), int(indptr[stop])
        if lo == hi:
            continue
        entries = np.diff(indptr[start : stop + 1])
        nonempty = entries > 0
        local = np.repeat(np.arange(stop - start, dtype=np.int64), entries)
        # Each row's running totals, exact in int64 and so a function of the row's own counts only.
        row_start = indptr[start:stop]
        before = np.where(row_start > 0, cumulative[np.maximum(row_start - 1, 0)], 0)
        within = cumulative[lo:hi] - np.repeat(before, entries)
        totals = np.zeros(stop - start, dtype=np.int64)
        totals[nonempty] = within[indptr[start + 1 : stop + 1][nonempty] - 1 - lo]
        # Row r's cumulative distribution, shifted by its chunk position r: non-decreasing overall.
        grid = local + within / totals[local]
        targets = np.flatnonzero(nonempty)
        # Token n of row r is entry found_n = #{grid <= q_n} (then kept inside row r). Only the counts are
        # kept, so each row's uniforms are sorted: the queries of the chunk's rows, one block of `length`
        # after another, are then non-decreasing overall (row r's lie in [r, r + 1]), and
        # below_j = #{queries < grid_j} = #{n : found_n <= j} comes from one search of the grid in them.
        # Within row r (block from b_r), #{n of r : found_n <= j} = clip(below_j - b_r, 0, length), forced
        # to `length` at the row's last entry (tokens past it stay in the row) and 0 before its first
        # entry: the differences are exactly the counts the token-by-token search gives.
        queries = (targets[:, None] + np.sort(uniforms[start + targets], axis=1)).ravel()
        below = np.searchsorted(queries, grid, side="left")
        block = np.zeros(stop - start, dtype=np.int64)
        block[targets] = np.arange(targets.shape[0], dtype=np.int64) * length
        upto = np.clip(below - block[local], 0, length)
        first = indptr[start + targets] - lo
        upto[indptr[start + targets + 1] - 1 - lo] = length
        previous = np.empty_like(upto)
        previous[1:] = upto[:-1]
        previous[first] = 0
        drawn[lo:hi] += upto - previous
    out = sp.csr_array((drawn, counts.indices.copy(), indptr.copy()), shape=counts.shape)
    out.eliminate_zeros()
    return out


# --------------------------------------------------------------------------------------------------------
# The vectorised E-step.


def shifted_topic_word(expected_log_beta: Array) -> tuple[Array, Array]:
    """(B, shift): B is (V + 1) x K with B[v, k] = exp(E[log beta_kv] - shift_v), shift_v = max_k
    E[log beta_kv], and a last row of zeros (the padding word)."""
    shift = expected_log_beta.max(axis=0)
    topics, words = expected_log_beta.shape
    table = np.zeros((words + 1, topics))
    np.subtract(expected_log_beta, shift, out=table[:words].T)
    np.exp(table[:words], out=table[:words])
    return table, shift


def chunk_size(topics: int, width: int) -> int:
    """Documents per chunk so that a padded (documents x topics x width) array fits CHUNK_ELEMENTS."""
    return max(1, min(MAX_CHUNK_DOCUMENTS, CHUNK_ELEMENTS // max(1, width * topics)))


def plan_chunks(sorted_lengths: IntArray, topics: int, documents_per_chunk: int | None) -> list[int]:
    """Chunk boundaries (positions in the length-sorted order, from 0 to the end) for the E-step.

    Fixed-size chunks when documents_per_chunk is given (the wall's resampled documents: the public width
    bound N_w makes a fixed size fit the budget). Otherwise (public documents, or documents kept as they
    are) a chunk doubles while it fits CHUNK_ELEMENTS at the width of its longest document and, once it
    has MIN_ADAPTIVE_CHUNK documents, while that width stays within WIDTH_RATIO of its shortest one's
    (so that padding stays small).
    """
    total = int(sorted_lengths.shape[0])
    if documents_per_chunk is not None:
        return [*range(0, total, documents_per_chunk), total]
    bounds = [0]
    while bounds[-1] < total:
        start = bounds[-1]
        first = max(1, int(sorted_lengths[start]))
        size = 1
        while size < MAX_CHUNK_DOCUMENTS and start + size < total:
            grown = min(2 * size, total - start)
            width = int(sorted_lengths[start + grown - 1])
            if grown * width * topics > CHUNK_ELEMENTS:
                break
            if size >= MIN_ADAPTIVE_CHUNK and width > WIDTH_RATIO * first:
                break
            size = grown
        bounds.append(start + size)
    return bounds


@dataclass
class ChunkFit:
    """The E-step of one chunk of documents (rows `documents` of the batch), at its final iterate.

    words (c x m): padded word ids (V for padding); counts (c x m): n_dv (0 for padding);
    topic_word (c x K x m): B gathered at the words; doc_topic (c x K): E_dk = exp(digamma(gamma_dk) -
    max_k digamma(gamma_dk)); gamma (c x K); ratio (c x m): n_dv / sum_k E_dk B_vk, the final phi being
    phi_{dvk} = E_dk B_vk ratio_dv / n_dv. The consumer owns the arrays (LdaQuery scales topic_word in place).
    """

    documents: IntArray
    words: IntArray
    counts: Array
    topic_word: Array
    doc_topic: Array
    gamma: Array
    ratio: Array
    normaliser: Array


def _dirichlet_exp(gamma: Array, out: Array, row_max: Array) -> None:
    """exp(digamma(gamma) - max_k digamma(gamma)) per row into `out`: exp(E[log theta]) up to a per-row
    factor (`row_max`: a rows x 1 buffer)."""
    digamma(gamma, out=out)
    np.maximum.reduce(out, axis=-1, keepdims=True, out=row_max)
    out -= row_max
    np.exp(out, out=out)


def fit_chunks(
    counts: Counts,
    table: Array,
    alpha: float,
    iterations: int,
    documents_per_chunk: int | None,
    *,
    single: bool = False,
) -> Iterator[ChunkFit]:
    """The E-step over all non-empty documents of `counts` (canonical, non-negative), chunk by chunk.

    `table` is `shifted_topic_word(...)[0]`. Documents are visited in order of their number of distinct
    words (stable), so chunks need little padding; each document's result depends only on its own row.

    `single`: the inner iterations' two matrix-vector products (and the ratios n / normaliser between them)
    run in float32, on a float32 copy of the chunk's gathered table, about twice as fast; gamma, the
    digamma and the exp stay in float64 (with the exact alpha), and the final normaliser, ratio and every
    field of the ChunkFit are computed in float64 from the float64 table, as without `single`. A float32
    normaliser is floored at SINGLE_NORM_FLOOR, so every float32 value stays finite (ratios <= 2^31 / 1e-19
    ~ 2.1e28, their sum over at most 2^31 words <= 4.6e37 < 3.4e38). The iterates then differ from the
    float64 ones by float32 rounding (about 1e-6 relative on gamma), and so does the contribution.
    """
    topics = table.shape[1]
    padding_word = table.shape[0] - 1
    work = np.float32 if single else np.float64
    floor = SINGLE_NORM_FLOOR if single else PHI_NORM_FLOOR
    indptr = np.asarray(counts.indptr, dtype=np.int64)
    indices = np.asarray(counts.indices, dtype=np.int64)
    data = np.asarray(counts.data, dtype=np.float64)
    entries = np.diff(indptr)
    order = np.argsort(entries, kind="stable")
    order = order[entries[order] > 0]
    bounds = plan_chunks(entries[order], topics, documents_per_chunk)
    for start, stop in itertools.pairwise(bounds):
        documents = order[start:stop]
        c = documents.shape[0]
        lengths = entries[documents]
        width = int(lengths.max())
        # Flat positions of every (document, word) entry in the padded c x width layout.
        offsets = np.repeat(np.arange(c, dtype=np.int64) * width, lengths)
        within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(lengths) - lengths, lengths
        )
        gather = np.repeat(indptr[documents], lengths) + within
        words = np.full(c * width, padding_word, dtype=np.int64)
        words[offsets + within] = indices[gather]
        n = np.zeros(c * width)
        n[offsets + within] = data[gather]
        words = words.reshape(c, width)
        n = n.reshape(c, width)
        # The SDDMM-style gather, once per chunk: c x K x width (words last: the faster gemv layout).
        topic_word = np.ascontiguousarray(table[words].transpose(0, 2, 1))
        work_topic_word = topic_word.astype(np.float32) if single else topic_word
        work_n = n.astype(work) if single else n

        # The iterations reuse these buffers (in place: the same operations, no allocation per step);
        # each 3-d one has a 2-d view of its own for the elementwise steps.
        doc_topic = np.ones((c, 1, topics))
        theta = doc_topic[:, 0, :]
        work_doc_topic = np.ones((c, 1, topics), dtype=work) if single else doc_topic
        work_theta = work_doc_topic[:, 0, :]
        normaliser = np.empty((c, 1, width), dtype=work)
        norm = normaliser[:, 0, :]
        ratio = np.empty((c, width, 1), dtype=work)
        weight = ratio[:, :, 0]
        sums = np.empty((c, topics, 1), dtype=work)
        gamma = np.full((c, topics), alpha)
        row_max = np.empty((c, 1))
        for _ in range(iterations):
            np.matmul(work_doc_topic, work_topic_word, out=normaliser)
            np.maximum(norm, floor, out=norm)
            np.divide(work_n, norm, out=weight)
            np.matmul(work_topic_word, ratio, out=sums)
            np.multiply(sums[:, :, 0], theta, out=gamma)
            gamma += alpha
            _dirichlet_exp(gamma, theta, row_max)
            if single:
                np.copyto(work_theta, theta, casting="same_kind")
        if single:
            del work_topic_word, work_n, work_doc_topic, normaliser, ratio, sums
            normaliser = np.empty((c, 1, width))
            norm = normaliser[:, 0, :]
            weight = np.empty((c, width))
        np.matmul(doc_topic, topic_word, out=normaliser)
        np.divide(n, np.maximum(norm, PHI_NORM_FLOOR), out=weight)
        yield ChunkFit(documents, words, n, topic_word, theta, gamma, weight, norm)


@dataclass(frozen=True)
class DocumentFit:
    """Per-document results of the E-step on public documents.

    gamma (S x K): q(theta_d) = Dirichlet(gamma_d) (alpha for empty documents);
    log_normaliser (S,): sum_v n_dv log sum_k exp(E[log theta_dk] + E[log beta_kv]), the words' term of
    the per-document ELBO at the optimal phi (Hoffman, Blei, Bach 2010, Eq. 3).
    """

    gamma: Array
    log_normaliser: Array


def fit_documents(
    counts: Counts,
    expected_log_beta: Array,
    alpha: float,
    iterations: int,
    documents_per_chunk: int | None = None,
) -> DocumentFit:
    """The E-step (fixed iterations) on public documents, as documents' q(theta) and likelihood terms.

    For evaluation and prediction outside the wall; the wall's query runs the same code.
    """
    clean = sanitize_counts(counts)
    table, shift = shifted_topic_word(np.asarray(expected_log_beta, dtype=np.float64))
    topics = table.shape[1]
    rows = clean.shape[0]
    gamma = np.full((rows, topics), float(alpha))
    log_normaliser = np.zeros(rows)
    extended_shift = np.concatenate([shift, [0.0]])
    for chunk in fit_chunks(clean, table, alpha, iterations, documents_per_chunk):
        gamma[chunk.documents] = chunk.gamma
        psi = digamma(chunk.gamma)
        theta_shift = psi.max(axis=1) - digamma(chunk.gamma.sum(axis=1))
        safe = np.maximum(chunk.normaliser, PHI_NORM_FLOOR)
        word_terms = chunk.counts * (np.log(safe) + extended_shift[chunk.words])
        log_normaliser[chunk.documents] = word_terms.sum(axis=1) + chunk.counts.sum(axis=1) * theta_shift
    return DocumentFit(gamma, log_normaliser)


# --------------------------------------------------------------------------------------------------------
# The query.


def _whole(value: object) -> bool:
    """A whole number (Python or numpy integer), not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


class LdaQuery:
    """The wall's half of VIPS-LDA (Alg. 3) for K topics.

    Parameters (all public): topics K; alpha, the Dirichlet prior on theta (default 1/K); doc_length N_w
    (default 500; 0 keeps documents as they are and then needs max_document_length, see the module
    docstring); inner_iterations, the fixed number of E-step iterations per document (default 30: on
    Wikipedia paragraphs and on synthetic 500-token documents, theta is then within a mean L1 distance of
    0.003 of its fixed point); clip a in (0, 1] (default 0.1, the paper's; 1 is the theory bound N_w).
    documents_per_chunk overrides the E-step's chunking (results do not depend on it). float32_iterations
    (default True) runs the inner iterations' matrix-vector products in float32 (`fit_chunks`, single):
    the contribution, its clipping and the released sum are still computed in float64 from the final
    gamma, so the bound and the sensitivity are those of any E-step; False gives the float64 iterates.
    """

    name = "lda"

    def __init__(
        self,
        topics: int,
        *,
        alpha: float | None = None,
        doc_length: int = 500,
        inner_iterations: int = 30,
        clip: float = 0.1,
        max_document_length: int | None = None,
        documents_per_chunk: int | None = None,
        float32_iterations: bool = True,
        unigram_share: float = 0.0,
        unigram_clip: float = 1.0,
    ) -> None:
        if not _whole(topics) or topics < 1:
            raise ValueError("topics must be a whole number >= 1")
        topics = int(topics)
        alpha = 1.0 / topics if alpha is None else float(alpha)
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ValueError("alpha must be a finite number > 0")
        if not _whole(doc_length) or doc_length < 0:
            raise ValueError("doc_length must be a whole number >= 0 (0 keeps documents as they are)")
        if not _whole(inner_iterations) or inner_iterations < 1:
            raise ValueError("inner_iterations must be a whole number >= 1")
        if documents_per_chunk is not None and (not _whole(documents_per_chunk) or documents_per_chunk < 1):
            raise ValueError("documents_per_chunk must be a whole number >= 1")
        doc_length, inner_iterations = int(doc_length), int(inner_iterations)
        if not (0 < clip <= 1):
            raise ValueError("clip must be in (0, 1]")
        if not (0 <= unigram_share < 1):
            raise ValueError("unigram_share must be in [0, 1)")
        if not (unigram_clip > 0 and math.isfinite(unigram_clip)):
            raise ValueError("unigram_clip must be a finite number > 0")
        if doc_length == 0:
            if max_document_length is None or not _whole(max_document_length) or max_document_length < 1:
                raise ValueError(
                    "doc_length = 0 keeps documents as they are: give max_document_length, the public "
                    "bound every contribution is clipped to"
                )
            length = int(max_document_length)
        else:
            length = doc_length
        self.topics = topics
        self.alpha = alpha
        self.doc_length = doc_length
        self.inner_iterations = inner_iterations
        self.clip = float(clip)
        self.max_document_length = length
        self.bound = self.clip * length
        self._documents_per_chunk = documents_per_chunk
        self.single = bool(float32_iterations)
        self.unigram_share = float(unigram_share)
        self.unigram_clip = float(unigram_clip)

    def blocks(self, dimension: int) -> tuple[Block, ...]:
        if self.unigram_share == 0:
            return (Block(BLOCK, self.bound, nonnegative_or_psd=True),)
        # Declared bounds inflated by 1 / sqrt(share): see the module docstring (J = 1).
        return (
            Block(BLOCK, self.bound / math.sqrt(1.0 - self.unigram_share), nonnegative_or_psd=True),
            Block(UNIGRAM_BLOCK, self.unigram_clip / math.sqrt(self.unigram_share), nonnegative_or_psd=True),
        )

    def joint_sensitivity(self, dimension: int) -> float:
        """1: one block (s alone), or the unigram split of the module docstring."""
        return 1.0

    def validate_params(self, params: dict[str, Array], dimension: int) -> None:
        if set(params) != {PARAM}:
            raise ValueError(f"lda takes exactly one public parameter: {PARAM}")
        value = params[PARAM]
        if value.shape != (self.topics, dimension) or not np.isfinite(value).all():
            raise ValueError(f"{PARAM} must be a finite {self.topics}x{dimension} matrix (topics x words)")

    def documents_per_chunk(self, dimension: int) -> int | None:
        """Fixed chunks of resampled documents (width <= N_w); budgeted chunks when they are kept as is."""
        if self._documents_per_chunk is not None:
            return self._documents_per_chunk
        if self.doc_length > 0:
            return chunk_size(self.topics, min(dimension, self.doc_length))
        return None

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        if batch.counts is None:
            raise ValueError("lda needs bag-of-words documents")
        counts = sanitize_counts(batch.counts)
        unigram: Array | None = None
        if self.unigram_share > 0:
            data = np.asarray(counts.data, dtype=np.float64)
            rows = np.repeat(np.arange(counts.shape[0]), np.diff(counts.indptr))
            norms = np.sqrt(np.bincount(rows, weights=data * data, minlength=counts.shape[0]))
            factors = clip_factors(norms, self.unigram_clip)
            unigram = np.bincount(
                counts.indices,
                weights=data * np.repeat(factors, np.diff(counts.indptr)),
                minlength=counts.shape[1],
            ).astype(np.float64)
        if self.doc_length > 0:
            counts = resample_documents(counts, self.doc_length, rng)
        words = counts.shape[1]
        table, _ = shifted_topic_word(np.asarray(params[PARAM], dtype=np.float64))
        # total[v, k] = sum_d c_d sum over d's entries of word v of ratio * E_dk; s = B * total (then K x V).
        # The chunks' (weights, words, E) are gathered and scattered into total SCATTER_ENTRIES at a time
        # (one sparse product for many chunks: scipy's per-call cost is then paid a few times per batch).
        total = np.zeros((words + 1, self.topics))
        pending: list[tuple[Array, IntArray, Array]] = []
        held = 0

        def scatter() -> None:
            nonlocal held
            weights = np.concatenate([w.ravel() for w, _, _ in pending])
            ids = np.concatenate([v.ravel() for _, v, _ in pending])
            widths = np.concatenate([np.full(w.shape[0], w.shape[1], dtype=np.int64) for w, _, _ in pending])
            indptr = np.concatenate([[0], np.cumsum(widths)])
            doc_topic = np.concatenate([e for _, _, e in pending])
            matrix = sp.csr_array((weights, ids, indptr), shape=(doc_topic.shape[0], words + 1))
            total[...] += matrix.T @ doc_topic
            pending.clear()
            held = 0

        per_chunk = self.documents_per_chunk(words)
        for chunk in fit_chunks(
            counts, table, self.alpha, self.inner_iterations, per_chunk, single=self.single
        ):
            # s^d entries: ratio_dv E_dk B_vk = n_dv phi_dvk, each <= n_dv, so their squares stay finite.
            # In place: the chunk's topic_word is not used again (no c x K x m allocation per chunk).
            contribution = chunk.topic_word
            contribution *= chunk.doc_topic[:, :, None]
            contribution *= chunk.ratio[:, None, :]
            norms = np.sqrt(np.einsum("dkm,dkm->d", contribution, contribution))
            weights = chunk.ratio * clip_factors(norms, self.bound)[:, None]
            pending.append((weights, chunk.words, chunk.doc_topic))
            held += weights.size
            if held >= SCATTER_ENTRIES:
                scatter()
        if pending:
            scatter()
        s = (table * total)[:words].T
        if unigram is not None:
            return {BLOCK: np.ascontiguousarray(s).ravel(), UNIGRAM_BLOCK: unigram}
        return {BLOCK: np.ascontiguousarray(s).ravel()}

    def postprocess(self, noised_means: dict[str, Array], dimension: int) -> dict[str, Array]:
        if self.unigram_share > 0:
            return {
                BLOCK: np.asarray(noised_means[BLOCK]).reshape(self.topics, dimension),
                UNIGRAM_BLOCK: np.asarray(noised_means[UNIGRAM_BLOCK]).reshape(dimension),
            }
        s = np.maximum(noised_means[BLOCK], 0.0).reshape(self.topics, dimension)
        return {BLOCK: s}
