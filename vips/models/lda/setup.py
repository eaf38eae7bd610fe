"""Which public half and wall query an LDA job runs (vips.models.registry calls `setup`): the paper's
defaults (K = 10, N_w = 500, a = 0.1) unless the job gives its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from privacy_wall.data.store import MAX_COUNT
from vips.models.base import ModelSetup
from vips.models.lda.spec import DEFAULTS

#: doc_length 0 (sigma 0 only, so no noise is calibrated to it): documents are kept as they are. The
#: query still declares a bound to clip to; this one is far above any real document's length.
UNCLIPPED_DOCUMENT_LENGTH = MAX_COUNT * 10_000


def setup(
    options: Mapping[str, float],
    *,
    algorithm: str,
    vocabulary: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
) -> ModelSetup:
    """VIPS's public half and query; `vocabulary` (the dataset's public word list) for the unigram
    fallback's public prior (option word_prior)."""
    from privacy_wall.queries.lda import LdaQuery
    from vips.models.lda.model import LatentDirichletAllocation, default_smoothing

    topics = int(options.get("topics", DEFAULTS["topics"]))
    doc_length = int(options.get("doc_length", DEFAULTS["doc_length"]))
    unigram_share = float(options.get("unigram_share", 0.0))
    word_prior, source = None, None
    if unigram_share > 0 and vocabulary and options.get("word_prior", 1):
        from vips.models.lda.word_prior import english_prior

        word_prior, source = english_prior(vocabulary) or (None, None)
    lda = LatentDirichletAllocation(
        topics=topics,
        alpha=options.get("alpha"),
        eta=options.get("eta"),
        smoothing=float(options.get("smoothing", default_smoothing(doc_length))),
        word_prior=word_prior,
        word_prior_source=source,
    )
    query = LdaQuery(
        topics,
        alpha=lda.doc_topic_prior,
        doc_length=doc_length,
        clip=float(options.get("clip", DEFAULTS["clip"])),
        max_document_length=UNCLIPPED_DOCUMENT_LENGTH if doc_length == 0 else None,
        unigram_share=unigram_share,
        unigram_clip=float(options.get("unigram_clip", 1.0)),
    )
    return ModelSetup(lda, query)
