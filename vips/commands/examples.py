"""`vips data examples`: the bundled public datasets as files for `vips data ingest`, `vips fit --local`,
`vips evaluate` and `vips predict`.

UCI Adult's training and test splits, encoded and scaled to rows of norm <= 1 (what `make run` ingests), and
the bundled Wikipedia excerpt's training and test paragraphs as UCI docword files over the training
split's vocabulary. All of it is public: for trying the service, never a template for where sensitive data
goes. Every file is written under a temporary name and renamed, and nothing is written if any would replace
an existing file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vips.errors import UsageError
from vips.output import check_writable, print_json
from vips.progress import note

#: The files written, by their key in the printed JSON line.
FILES = {
    "adult_train": "adult_train.csv",
    "adult_test": "adult_test.csv",
    "wiki_docword": "wiki.docword.txt",
    "wiki_vocab": "wiki.vocab.txt",
    "wiki_test_docword": "wiki_test.docword.txt",
}


def run(args: argparse.Namespace) -> int:
    from vips.datasets.adult import load_adult, write_tabular_csv
    from vips.datasets.wikipedia import load_wikipedia, write_bag_of_words

    folder = Path(args.output)
    paths = {key: folder / name for key, name in FILES.items()}
    taken = [str(path) for path in paths.values() if path.exists()]
    if taken:
        raise UsageError(f"{', '.join(taken)} already exist(s): remove them or choose another --output")
    folder.mkdir(parents=True, exist_ok=True)
    for path in paths.values():
        check_writable(path)
    temporary = {key: path.with_name(path.name + ".tmp") for key, path in paths.items()}
    try:
        write_tabular_csv(load_adult("train"), temporary["adult_train"])
        write_tabular_csv(load_adult("test"), temporary["adult_test"])
        corpus = load_wikipedia()
        write_bag_of_words(
            corpus.train, corpus.vocabulary, temporary["wiki_docword"], temporary["wiki_vocab"]
        )
        unused_vocab = temporary["wiki_vocab"].with_name("wiki.test-vocab.tmp")
        write_bag_of_words(corpus.test, corpus.vocabulary, temporary["wiki_test_docword"], unused_vocab)
        unused_vocab.unlink()
        for key, path in paths.items():
            temporary[key].replace(path)
    finally:
        for path in temporary.values():
            path.unlink(missing_ok=True)
    note(
        f"next: vips data ingest adult --kind tabular --input {paths['adult_train']}, or "
        f"vips data ingest wiki --kind bow --input {paths['wiki_docword']} --vocab {paths['wiki_vocab']} "
        "--vocab-is-public (the bundled Wikipedia vocabulary is public)"
    )
    print_json({key: str(path) for key, path in paths.items()})
    return 0
