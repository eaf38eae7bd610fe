"""Which vocabularies are public by construction (issue 52, item 10).

A bag-of-words dataset's vocabulary is shown to every analyst of it (GET /v1/datasets/{name}, the posterior's
word list), so it must not depend on the sensitive texts: the usual vocabulary file of a corpus (its words
that occur, say, 10 times or more, in its own order of appearance or frequency) tells which words the
documents use. The service can tell one construction is public from the list alone:

- PUBLIC_LIST: the first N words of wordfreq's English "large" list (Speer et al., the `wordfreq` package
  the service already ships for LDA's word prior), in its order (most frequent first) or alphabetical,
  keeping only the entries that are one word under every tokenizer the service uses: letters only
  (str.isalpha), lower case and NFKC-normal (so `vips data prepare-text` can match each of them).

Any other list (a public corpus's most frequent words, a domain glossary) may be public too, but only its
custodian knows: ingesting it needs their explicit confirmation (`--vocab-is-public`), which the dataset
records as the vocabulary's source next to the words.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

LANGUAGE = "en"
WORDLIST = "large"
#: What the dataset's schema records for a vocabulary its custodian confirmed public.
DECLARED = "declared public by the custodian"


def _one_word(entry: str) -> bool:
    return entry.isalpha() and entry == entry.lower() and unicodedata.normalize("NFKC", entry) == entry


def list_name() -> str:
    """wordfreq's version and list, for the record ("wordfreq 3.1.1 (en, large)")."""
    try:
        return f"wordfreq {version('wordfreq')} ({LANGUAGE}, {WORDLIST})"
    except PackageNotFoundError:
        return f"wordfreq ({LANGUAGE}, {WORDLIST})"


@functools.lru_cache(maxsize=4)
def public_words(size: int) -> tuple[str, ...]:
    """The first `size` one-word entries of wordfreq's English list, most frequent first (fewer if the list
    has fewer). wordfreq's own caches of the list (~50 MB) are cleared afterwards."""
    from wordfreq import get_frequency_dict, get_frequency_list, iter_wordlist

    words: list[str] = []
    try:
        for entry in iter_wordlist(LANGUAGE, wordlist=WORDLIST):
            if _one_word(entry):
                words.append(entry)
                if len(words) == size:
                    break
    finally:
        get_frequency_dict.cache_clear()
        get_frequency_list.cache_clear()
    return tuple(words)


def public_construction(vocabulary: Sequence[str]) -> str | None:
    """How `vocabulary` follows from public facts alone, or None when the service cannot tell: it is the
    first N one-word entries of wordfreq's English list (N its length), in the list's order or sorted."""
    words = tuple(str(word) for word in vocabulary)
    if not words:
        return None
    public = public_words(len(words))
    if words == public:
        return f"the {len(words)} most frequent English words of {list_name()}, most frequent first"
    if words == tuple(sorted(public)):
        return f"the {len(words)} most frequent English words of {list_name()}, in alphabetical order"
    return None
