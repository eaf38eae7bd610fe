"""How `vips data prepare-text` cuts a text into words: deterministic, the same everywhere.

1. Unicode NFKC normalisation (compatibility forms folded: ligatures, full-width letters, ...);
2. lower case (str.lower);
3. a word is a maximal run of letters and combining marks (Unicode categories L* and M*: "café", "हिन्दी")
   from a letter on (a mark after a non-letter is dropped); anything else (digits, punctuation, spaces,
   symbols) separates words.
TOKEN_RULES says it to users (`--help`, README). Only the standard library: the CLI's parser imports it.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections.abc import Sequence

TOKEN_RULES = (
    "Unicode NFKC normalisation, then lower case, then words are the maximal runs of letters and "
    "combining marks (Unicode categories L* and M*) from a letter on; digits, punctuation, spaces and "
    "symbols separate words"
)


@functools.cache
def _runs() -> re.Pattern[str]:
    """A letter, then letters and combining marks (re's word class lacks the marks; built once, as code
    point ranges). Letters are word characters that are neither digits nor "_"; the rare non-decimal
    numerals among them are split off by _split."""
    ranges: list[list[int]] = []
    for c in range(sys.maxunicode + 1):
        if unicodedata.category(chr(c)).startswith("M"):
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1][1] = c
            else:
                ranges.append([c, c])
    marks = "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)
    return re.compile(rf"[^\W\d_]+(?:[{marks}]+[^\W\d_]*)*")


def _is_word_character(c: str) -> bool:
    return unicodedata.category(c)[0] in "LM"


def tokenize(text: str) -> list[str]:
    """The words of `text` under the module's rules (NFKC, lower case, maximal runs of letters and marks)."""
    words: list[str] = []
    for run in _runs().findall(unicodedata.normalize("NFKC", text).lower()):
        if run.isalpha():
            words.append(run)
        else:
            words.extend(_split(run))
    return words


def _split(run: str) -> list[str]:
    return "".join(c if _is_word_character(c) else " " for c in run).split()


def unmatchable(vocabulary: Sequence[str]) -> int:
    """How many vocabulary entries no text can produce (not a single word under the rules): a public
    vocabulary in another normalisation (upper case, digits, hyphens) would silently match nothing."""
    return sum(1 for word in vocabulary if tokenize(word) != [word])
