"""Latent Dirichlet allocation's facts (vips.models.spec): bag-of-words documents, fitted by VIPS. The
upper bounds keep one job's memory reasonable: LDA holds K x V topic parameters and resamples S x N_w
tokens."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

from vips.models.spec import (
    CLIP_FRACTION,
    NON_NEGATIVE,
    SCALE,
    SHARE,
    SWITCH,
    Footprint,
    ModelSpec,
    Rule,
    whole,
)

#: The defaults planning reads too (the worker's model setup reads them from here): the paper's K = 10,
#: N_w = 500 and clip a = 0.1.
DEFAULTS = {"topics": 10, "doc_length": 500, "clip": 0.1}


def statistic_size(options: Mapping[str, float], dimension: int) -> int:
    """The entries of LDA's K x V topic-word counts (K the job's topics, else the default), whose signal
    to noise its rule reads."""
    return int(options.get("topics", DEFAULTS["topics"])) * dimension


#: The schedule rule of each algorithm (control.planning.schedules; docs/schedules.md has the table each
#: was read off).
RULES: dict[str, Rule] = {
    # Small epsilon x D: most of each release on the word frequencies (the unigram fallback) and few
    # iterations; the topics get more as the scale grows. T 10 for a job that gives sigma. Read off V about
    # 5,000 and K 20-50 (docs/schedules.md, "VIPS-LDA"); a topic-word count's signal to noise grows as
    # epsilon x D / (K V), so K topics over V words read the rows at epsilon x D x 100,000 / (K V). Above
    # 600,000 the topic statistics stand far above their noise and the fallback only costs.
    "vips": Rule(
        iterations=((10_000.0, 3), (200_000.0, 10), (sys.float_info.max, 20), (math.inf, 10)),
        options=(
            (10_000.0, {"unigram_share": 0.97, "unigram_clip": 3.0}),
            (60_000.0, {"unigram_share": 0.8, "unigram_clip": 3.0}),
            (200_000.0, {"unigram_share": 0.5, "unigram_clip": 3.0}),
            (600_000.0, {"unigram_share": 0.3, "unigram_clip": 3.0}),
            (math.inf, {"unigram_share": 0.0}),
        ),
        source="VIPS-LDA's grids on the bundled Wikipedia corpus and planted-topic corpora "
        "(bench/lda.py --sweep-unigram)",
        reference_size=100_000,
        # What the sweeps measured against the private unigram at the same epsilon (docs/schedules.md,
        # "What the topics buy over a private unigram at the same epsilon").
        expect=(
            (
                10_000.0,
                "about the private word frequencies the fit falls back to (its posterior's private_unigram): "
                "at this scale topics clear the noise only where they are very strong",
            ),
            (
                60_000.0,
                "strong topics to pay; on encyclopedia or news text, about the private word frequencies",
            ),
        ),
    ),
}


def conflict(options: Mapping[str, float], sigma: float) -> tuple[str, str] | None:
    """doc_length 0 keeps documents as they are; their length then bounds each contribution, and a private
    dataset does not publish it, so it is allowed only without noise (docs/design.md section 6)."""
    if options.get("doc_length") == 0 and sigma > 0:
        return "doc_length", "doc_length 0 (documents kept as they are) is only allowed with sigma 0"
    return None


def public_extra(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The vocabulary (word ids -> words)."""
    return {"vocabulary": list(schema["vocabulary"])} if "vocabulary" in schema else {}


#: privacy_wall.queries.lda.RESAMPLE_CHUNK and CHUNK_ELEMENTS, mirrored
#: (tests/control/planning/test_resources.py).
LDA_RESAMPLE_CHUNK = 1024
LDA_CHUNK_ELEMENTS = 2**19


def lda_footprint(v: int, s: int, topics: int, doc_length: int, unigram: bool = False) -> Footprint:
    """LDA (K topics, V words, N_w tokens per document): the K x V arrays, i.e. lambda, the last release,
    E[log beta], the query's table and totals, means, noise, noised and clipped copies (9 K V); the
    resampling's S x N_w uniforms plus 4 arrays of min(S, 1024) x N_w per chunk of documents; the
    resampled counts (2 S min(V, N_w)); and the E-step's padded chunks (4 x 2^19). Release s (K V), with
    the unigram fallback also u (V). Posterior: E[log beta], the statistics and lambda twice (4 K V) plus
    K x 10 top words."""
    tokens = doc_length if doc_length > 0 else v
    resample = s * doc_length + 4 * min(s, LDA_RESAMPLE_CHUNK) * doc_length
    kv = topics * v
    working = 9 * kv + resample + 2 * s * min(v, tokens) + 4 * LDA_CHUNK_ELEMENTS
    driver = ("options", "doc_length") if resample > 9 * kv else ("options", "topics")
    why = f"{topics} topics x {v} words, {s} documents x doc_length {doc_length}"
    release = kv + (v if unigram else 0)
    return Footprint(working, release, 4 * kv + 10 * topics, driver, why)


def footprint(options: Mapping[str, float], v: int, s: int) -> Footprint:
    """VIPS-LDA's footprint from the job's options (the defaults where it gives none)."""
    topics = int(options.get("topics", DEFAULTS["topics"]))
    doc_length = int(options.get("doc_length", DEFAULTS["doc_length"]))
    return lda_footprint(v, s, topics, doc_length, unigram=options.get("unigram_share", 0.0) > 0)


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
    rules=RULES,
    statistic_size=statistic_size,
    conflict=conflict,
    public_extra=public_extra,
    footprints={"vips": footprint},
)
