"""Summaries of a posterior document that people read: the CLI prints them, pages show them.

Pure Python on the document's JSON values (the API side imports no numerics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TopicWords:
    """One LDA topic: its index, its share of the topic-word mass (sum_w lambda_kw / sum lambda) and its
    most probable words under E[beta_k] = lambda_k / sum_w lambda_kw, most probable first."""

    topic: int
    share: float
    words: tuple[str, ...]
    probabilities: tuple[float, ...]


def top_words(document: dict[str, Any], count: int = 10) -> list[TopicWords]:
    """Each topic's `count` (at most 20) most probable words: the document's "topics" (word ids and
    E[beta_kw], most probable first, as vips.models.lda.model writes them) named by its "vocabulary" (word
    ids as text when it has none), with each topic's share of "lambda"."""
    lam: list[list[float]] = document["lambda"]
    vocabulary: list[str] = document.get("vocabulary") or [str(v) for v in range(len(lam[0]))]
    totals = [sum(row) for row in lam]
    everything = sum(totals)
    return [
        TopicWords(
            topic=k,
            share=totals[k] / everything,
            words=tuple(vocabulary[v] for v in topic["word_ids"][:count]),
            probabilities=tuple(topic["probabilities"][:count]),
        )
        for k, topic in enumerate(document["topics"])
    ]


def repeated_topics(document: dict[str, Any]) -> int:
    """How many topics share their word distribution E[beta_k] = lambda_k / sum_w lambda_kw with another
    topic (to 1e-9 of the largest probability). Topics in which no excess over the word frequencies cleared
    the noise threshold are all that one distribution, the corpus's private word frequencies (the fallback
    of vips.models.lda.model): K of K when nothing cleared it. Rows are bucketed by sum_w beta_kw^2 (equal
    distributions share it to rounding) and compared within a bucket."""
    groups: dict[str, list[tuple[list[float], list[int]]]] = {}
    for row in document["lambda"]:
        total = sum(row)
        beta = [value / total for value in row] if total > 0 else [float(value) for value in row]
        tolerance = 1e-9 * max(beta, default=0.0)
        bucket = groups.setdefault(f"{sum(p * p for p in beta):.6g}", [])
        for representative, count in bucket:
            if all(abs(a - b) <= tolerance for a, b in zip(beta, representative, strict=True)):
                count[0] += 1
                break
        else:
            bucket.append((beta, [1]))
    return sum(count[0] for bucket in groups.values() for _, count in bucket if count[0] > 1)


def repeated_topics_note(document: dict[str, Any]) -> str | None:
    """One sentence on an LDA posterior's topics that are one word distribution (repeated_topics), or None
    when none are."""
    repeated, topics = repeated_topics(document), len(document["lambda"])
    if repeated == 0:
        return None
    which = f"All {topics} topics are" if repeated == topics else f"{repeated} of the {topics} topics are"
    return (
        f"{which} one word distribution, the corpus's private word frequencies: no topic structure in them "
        "cleared the release noise (more documents, a larger epsilon or fewer topics let topics form)."
    )


@dataclass(frozen=True)
class Coefficient:
    """A regression coefficient: its name, posterior mean and 95% credible interval (mean +- 1.96 sd)."""

    name: str
    mean: float
    lower: float
    upper: float


def coefficients(document: dict[str, Any], names: list[str] | None = None) -> list[Coefficient]:
    """The coefficients of a BLR or linear-regression posterior (Gaussian q(w): "mean", "covariance"),
    named by `names` (the dataset's feature columns) or x0, x1, ..."""
    mean: list[float] = document["mean"]
    covariance: list[list[float]] = document["covariance"]
    labels = names if names is not None and len(names) == len(mean) else [f"x{j}" for j in range(len(mean))]
    result = []
    for j, (name, m) in enumerate(zip(labels, mean, strict=True)):
        half = 1.959963984540054 * math.sqrt(max(covariance[j][j], 0.0))
        result.append(Coefficient(name, m, m - half, m + half))
    return result
