"""A small real corpus for LDA: 106 English Wikipedia articles, split into paragraph documents.

The bundled MediaWiki XML export (enwiki-206-articles.xml.bz2: 206 pages, of which 100 are redirects) is
parsed with the standard library. Markup is stripped crudely but
reasonably: comments, <ref> footnotes, templates {{...}}, tables {|...|}, file/image/category links and
HTML tags are removed; [[target|label]] links keep their label, external links their text; everything
from a "References" / "See also" / "External links" / "Notes" / "Further reading" / "Bibliography"
section on is dropped. Each remaining paragraph (blank-line separated; headings also separate) is a
document, short paragraphs being merged with the next one in the same section until they have
`min_tokens` tokens.

Tokens: lower-case alphabetic runs of >= 3 letters, minus scikit-learn's English stop words. Articles are
split into train and test (seeded, by article, so test documents come from unseen articles); the public
vocabulary is chosen from the training documents only (document frequency >= min_df and <= max_df, the
max_words most frequent). Source and licence: vips/datasets/data/README.md.
"""

from __future__ import annotations

import bz2
import html
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import scipy.sparse as sp

FILE = "enwiki-206-articles.xml.bz2"

END_SECTIONS = frozenset(
    {"references", "see also", "external links", "notes", "further reading", "bibliography", "sources"}
)

_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_REF_SELF_CLOSING = re.compile(r"<ref[^>/]*/>", re.IGNORECASE)
_REF = re.compile(r"<ref[^>]*>.*?</ref\s*>", re.IGNORECASE | re.DOTALL)
_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_TABLE = re.compile(r"\{\|(?:(?!\{\|).)*?\|\}", re.DOTALL)
_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_EXTERNAL = re.compile(r"\[(?:https?:)?//[^\s\]]+\s*([^\]]*)\]")
_TAG = re.compile(r"<[^>]+>")
_QUOTES = re.compile(r"'{2,}")
_HEADING = re.compile(r"^\s*(=+)\s*(.*?)\s*\1\s*$")
_WORD = re.compile(r"[a-z]+")
_DROPPED_LINK = re.compile(r"^\s*(?:file|image|category|media|[a-z]{2,3}(?:-[a-z]+)?)\s*:", re.IGNORECASE)


@dataclass(frozen=True, eq=False)
class WikipediaCorpus:
    """Train and test documents as D x V word counts (CSR, int32) over the public vocabulary."""

    train: sp.csr_array
    test: sp.csr_array
    vocabulary: tuple[str, ...]
    train_articles: tuple[str, ...]
    test_articles: tuple[str, ...]


def data_path() -> Path:
    return Path(str(resources.files("vips.datasets").joinpath("data", FILE)))


def load_articles(path: Path | None = None) -> list[tuple[str, str]]:
    """(title, wikitext) of every non-redirect page of the article namespace (ns 0), in file order."""
    articles: list[tuple[str, str]] = []
    with bz2.open(path or data_path(), "rb") as stream:
        for _, element in ET.iterparse(stream, events=("end",)):
            if not element.tag.endswith("}page"):
                continue
            ns = element.findtext("{*}ns")
            redirect = element.find("{*}redirect")
            text = element.findtext("{*}revision/{*}text") or ""
            title = element.findtext("{*}title") or ""
            if ns == "0" and redirect is None and not text.lstrip().upper().startswith("#REDIRECT"):
                articles.append((title, text))
            element.clear()
    return articles


def _repeat(pattern: re.Pattern[str], replacement: str, text: str) -> str:
    """Apply a substitution until nothing changes (for nested constructs, innermost first)."""
    while True:
        new = pattern.sub(replacement, text)
        if new == text:
            return text
        text = new


def _link_text(match: re.Match[str]) -> str:
    content = match.group(1)
    if _DROPPED_LINK.match(content):
        return ""
    return content.rsplit("|", 1)[-1]


def strip_markup(wikitext: str) -> str:
    """Plain text (with its line structure) from wikitext; headings are kept as heading lines."""
    text = html.unescape(wikitext)
    text = _COMMENT.sub("", text)
    text = _REF_SELF_CLOSING.sub("", text)
    text = _REF.sub("", text)
    text = _repeat(_TEMPLATE, "", text)
    text = _repeat(_TABLE, "", text)
    while True:
        new = _LINK.sub(_link_text, text)
        if new == text:
            break
        text = new
    text = _EXTERNAL.sub(r"\1", text)
    text = _TAG.sub("", text)
    text = _QUOTES.sub("", text)
    return html.unescape(text)


def tokenize(text: str, stop_words: frozenset[str]) -> list[str]:
    """Lower-case alphabetic tokens of >= 3 letters that are not stop words."""
    return [w for w in _WORD.findall(text.lower()) if len(w) >= 3 and w not in stop_words]


def article_documents(wikitext: str, stop_words: frozenset[str], min_tokens: int) -> list[list[str]]:
    """An article's paragraph documents (token lists), as described in the module docstring."""
    documents: list[list[str]] = []
    pending: list[str] = []

    def flush(force: bool) -> None:
        nonlocal pending
        if len(pending) >= min_tokens or (force and len(pending) >= min_tokens // 2 and pending):
            documents.append(pending)
            pending = []
        elif force:
            pending = []

    for line in _paragraph_lines(strip_markup(wikitext)):
        if line is None:  # a section boundary
            flush(force=True)
            continue
        if not line:  # a paragraph boundary
            flush(force=False)
            continue
        pending.extend(tokenize(line.lstrip("*#:; "), stop_words))
    flush(force=True)
    return documents


def _paragraph_lines(text: str) -> Iterator[str | None]:
    """Lines of the article body: None at headings, "" at blank lines; stops at the end sections."""
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading:
            if heading.group(2).strip().lower() in END_SECTIONS:
                return
            yield None
            continue
        yield line.strip()


def _counts(documents: Sequence[Sequence[str]], index: dict[str, int]) -> sp.csr_array:
    indptr = [0]
    ids: list[int] = []
    values: list[int] = []
    for tokens in documents:
        counter = Counter(index[t] for t in tokens if t in index)
        for word, count in sorted(counter.items()):
            ids.append(word)
            values.append(count)
        indptr.append(len(ids))
    return sp.csr_array(
        (
            np.asarray(values, dtype=np.int32),
            np.asarray(ids, dtype=np.int32),
            np.asarray(indptr, dtype=np.int64),
        ),
        shape=(len(documents), len(index)),
    )


def load_wikipedia(
    *,
    test_fraction: float = 0.2,
    min_df: int = 5,
    max_df: float = 0.5,
    max_words: int = 5000,
    min_tokens: int = 40,
    min_vocabulary_tokens: int = 10,
    seed: int = 0,
) -> WikipediaCorpus:
    """The bundled articles as train/test paragraph documents over a training-split vocabulary.

    Documents with fewer than min_vocabulary_tokens in-vocabulary tokens are dropped (from both splits).
    """
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    stop_words = frozenset(ENGLISH_STOP_WORDS)
    articles = load_articles()
    order = np.random.default_rng(seed).permutation(len(articles))
    test_count = max(1, round(test_fraction * len(articles)))
    test_ids = set(order[:test_count].tolist())
    split: dict[bool, list[list[str]]] = {False: [], True: []}
    titles: dict[bool, list[str]] = {False: [], True: []}
    for i, (title, text) in enumerate(articles):
        is_test = i in test_ids
        split[is_test].extend(article_documents(text, stop_words, min_tokens))
        titles[is_test].append(title)

    frequency = Counter(w for tokens in split[False] for w in set(tokens))
    limit = max_df * len(split[False])
    kept = [w for w, df in frequency.items() if min_df <= df <= limit]
    kept.sort(key=lambda w: (-frequency[w], w))
    vocabulary = tuple(sorted(kept[:max_words]))
    index = {w: i for i, w in enumerate(vocabulary)}

    def keep(documents: list[list[str]]) -> list[list[str]]:
        return [d for d in documents if sum(t in index for t in d) >= min_vocabulary_tokens]

    return WikipediaCorpus(
        _counts(keep(split[False]), index),
        _counts(keep(split[True]), index),
        vocabulary,
        tuple(titles[False]),
        tuple(titles[True]),
    )


def write_bag_of_words(counts: sp.csr_array, vocabulary: Sequence[str], docword: Path, vocab: Path) -> None:
    """Documents as a UCI docword file plus a one-word-per-line vocabulary (for `vips data ingest`)."""
    matrix = sp.coo_array(counts)
    order = np.lexsort((matrix.col, matrix.row))
    lines = [str(matrix.shape[0]), str(matrix.shape[1]), str(matrix.nnz)]
    lines += [
        f"{r + 1} {c + 1} {int(v)}"
        for r, c, v in zip(matrix.row[order], matrix.col[order], matrix.data[order], strict=True)
    ]
    Path(docword).write_text("\n".join(lines) + "\n", encoding="utf-8")
    Path(vocab).write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
