"""`vips data prepare-text`: sensitive texts to the docword and vocab files of `vips data ingest --kind bow`.

It runs on the custodian's machine, on the sensitive texts: what it writes and prints carries no text.
The vocabulary must be public, never the sensitive texts' own words: by default the --vocab-size most
frequent English words of wordfreq's list (privacy_wall.data.vocabulary: public by construction, so
`data ingest` takes it as it is), or the --vocab-size most frequent words of another, public corpus
(--vocab-from), or a file the custodian gives (--vocab); for the last two `data ingest` asks the custodian
to confirm the list is public (--vocab-is-public). Words outside it are dropped and reported in aggregate
only (their total and share, never which words or which documents).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from privacy_wall.data.docword import read_vocabulary
from privacy_wall.data.vocabulary import public_construction, public_words
from vips.bow import count_documents, frequent_words
from vips.datasets.wikipedia import write_bag_of_words
from vips.errors import UsageError
from vips.output import check_writable, print_json
from vips.progress import note
from vips.text_sources import csv_texts, folder_texts, texts_of
from vips.tokens import unmatchable

#: Words of the vocabulary when --vocab-size is not given.
DEFAULT_VOCABULARY_SIZE = 5000


def _overlaps(a: Path, b: Path) -> bool:
    """Whether one path is, or is inside, the other (after resolving links)."""
    a, b = a.resolve(), b.resolve()
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def _vocabulary(args: argparse.Namespace, sensitive: Path) -> tuple[str, ...]:
    """The public vocabulary: --vocab's words, the --vocab-size most frequent words of --vocab-from, or
    (neither given) the --vocab-size most frequent English words of wordfreq's list."""
    if args.vocab is not None:
        if args.vocab_size is not None:
            raise UsageError(
                "--vocab-size goes with --vocab-from or wordfreq's list (a --vocab file is used as it is)"
            )
        return read_vocabulary(Path(args.vocab))
    if args.vocab_from is None:
        return public_words(args.vocab_size or DEFAULT_VOCABULARY_SIZE)
    public = Path(args.vocab_from)
    if not public.exists():
        raise UsageError(f"--vocab-from {public}: no such file or directory")
    if _overlaps(public, sensitive):
        raise UsageError(
            "--vocab-from must be another, public corpus: it overlaps the input, and a vocabulary built "
            "from the sensitive texts would release their words"
        )
    words = frequent_words(texts_of(public, None), args.vocab_size or DEFAULT_VOCABULARY_SIZE)
    if not words:
        raise UsageError(f"--vocab-from {public}: the public corpus has no words")
    return words


def run(args: argparse.Namespace) -> int:
    sensitive = Path(args.input_dir if args.input_dir is not None else args.input_csv)
    if args.input_csv is not None and args.text_column is None:
        raise UsageError("--input-csv needs --text-column: the name of the column holding the texts")
    if args.input_dir is not None and args.text_column is not None:
        raise UsageError("--text-column goes with --input-csv")
    docword = Path(f"{args.output}.docword.txt")
    vocab = Path(f"{args.output}.vocab.txt")
    check_writable(docword)
    vocabulary = _vocabulary(args, sensitive)
    never = unmatchable(vocabulary)
    if never:
        note(
            f"warning: {never} of the {len(vocabulary)} vocabulary words can never match (they are not "
            "one lower-case run of letters after NFKC; see --help)"
        )
    texts = folder_texts(sensitive) if args.input_dir is not None else csv_texts(sensitive, args.text_column)
    counts = count_documents(texts, vocabulary)
    if counts.documents == 0:
        raise UsageError(f"{sensitive}: no documents")
    if counts.kept == 0:
        raise UsageError(f"{sensitive}: no word of any document is in the vocabulary; nothing to write")
    write_bag_of_words(counts.matrix, vocabulary, docword, vocab)
    share = counts.out_of_vocabulary / counts.tokens
    note(
        f"{counts.documents} documents, {counts.tokens} words, {counts.out_of_vocabulary} of them "
        f"({share:.1%}) out of the vocabulary and dropped; {_documents_have(counts.empty_documents)} no "
        "word in it (kept, empty)"
    )
    source = public_construction(vocabulary)
    if source is None:
        note(
            "the vocabulary is not one the service can tell is public: `data ingest` needs your "
            "confirmation that it is (--vocab-is-public), since analysts see it"
        )
    confirm = "" if source is not None else " --vocab-is-public"
    note(f"next: vips data ingest NAME --kind bow --input {docword} --vocab {vocab}{confirm}")
    print_json(
        {
            "docword": str(docword),
            "vocab": str(vocab),
            "documents": counts.documents,
            "vocabulary": len(vocabulary),
            "vocabulary_source": source,
            "tokens": counts.tokens,
            "out_of_vocabulary": counts.out_of_vocabulary,
            "out_of_vocabulary_share": share,
            "empty_documents": counts.empty_documents,
        }
    )
    return 0


def _documents_have(count: int) -> str:
    return f"{count} document has" if count == 1 else f"{count} documents have"
