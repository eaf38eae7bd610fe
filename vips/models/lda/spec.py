"""Latent Dirichlet allocation's facts (vips.models.spec): bag-of-words documents, fitted by VIPS. The
upper bounds keep one job's memory reasonable: LDA holds K x V topic parameters and resamples S x N_w
tokens."""

from __future__ import annotations

from vips.models.spec import CLIP_FRACTION, NON_NEGATIVE, SCALE, SHARE, SWITCH, ModelSpec, whole

#: The defaults planning reads too (the worker's model setup reads them from here): the paper's K = 10,
#: N_w = 500 and clip a = 0.1.
DEFAULTS = {"topics": 10, "doc_length": 500, "clip": 0.1}

SPEC = ModelSpec(
    name="lda",
    kind="bow",
    title="a topic model",
    options={
        "topics": whole(1, 1000),
        "alpha": SCALE,
        "eta": SCALE,
        # The M-step's pull of the topics towards the corpus's word frequencies (vips.models.lda.model; 0:
        # the paper's M-step).
        "smoothing": NON_NEGATIVE,
        "doc_length": whole(0, 100_000),
        "clip": CLIP_FRACTION,
        # The unigram fallback (privacy_wall.queries.lda): the release's share for the word frequencies
        # (0: topic statistics alone) and each document's clip for them.
        "unigram_share": SHARE,
        "unigram_clip": SCALE,
        # word_prior 1 (default): the fallback's unigram shrinks towards public English word frequencies
        # when the vocabulary is English (vips.models.lda.word_prior); 0: towards nothing but the release.
        "word_prior": SWITCH,
    },
    defaults=DEFAULTS,
    aliases=("topics",),
)
