"""A vocabulary is public by construction or by its custodian's word (issue 52, item 10):
privacy_wall.data.vocabulary recognises wordfreq's most frequent English words, and ingest refuses any
other list of a sensitive dataset unless the custodian confirms it, writing nothing."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from sqlalchemy import Engine

from privacy_wall.data.ingest import PUBLIC_DATASET, IngestError, ingest
from privacy_wall.data.vocabulary import DECLARED, public_construction, public_words
from tests.privacy_wall.data.test_ingest_store import row_count
from vips.datasets.wikipedia import write_bag_of_words


def test_the_public_list_is_wordfreqs_one_word_entries_most_frequent_first() -> None:
    import wordfreq

    words = public_words(2_000)
    assert len(words) == len(set(words)) == 2_000
    assert all(w.isalpha() and w == w.lower() and unicodedata.normalize("NFKC", w) == w for w in words)
    frequencies = [wordfreq.word_frequency(w, "en", wordlist="large") for w in words]
    assert frequencies == sorted(frequencies, reverse=True)  # in the list's order
    assert public_words(50) == words[:50]  # a prefix: N words are the first N, whatever N


def test_only_the_lists_first_n_words_in_its_order_or_sorted_are_recognised() -> None:
    words = public_words(500)
    assert "most frequent first" in str(public_construction(words))
    assert "alphabetical" in str(public_construction(sorted(words)))
    # anything chosen among them, or reordered by another rule, may follow the texts: not recognised
    assert public_construction(words[:250] + words[251:]) is None  # one word left out
    assert public_construction(words[1:] + words[:1]) is None  # another order
    assert public_construction([*words[:499], "zyzzyva"]) is None
    assert public_construction([]) is None


@pytest.mark.parametrize("confirmed", [False, True])
def test_ingest_refuses_an_unrecognised_vocabulary_unless_its_custodian_confirms_it(
    engines: tuple[Engine, Engine], tmp_path: Path, confirmed: bool
) -> None:
    import scipy.sparse as sp

    control, sensitive = engines
    corpus_words = ["quasar", "nebula", "pulsar"]  # a corpus's own words, as its usual vocab file has them
    docword, vocab = tmp_path / "docword.txt", tmp_path / "vocab.txt"
    write_bag_of_words(sp.csr_array([[1, 0, 2], [0, 3, 1]]), corpus_words, docword, vocab)
    before = row_count(sensitive)
    if not confirmed:
        with pytest.raises(IngestError, match="--vocab-is-public") as refused:
            ingest(control=control, sensitive=sensitive, name="sky", kind="bow", path=docword, vocab=vocab)
        assert not any(word in str(refused.value) for word in corpus_words)
        assert row_count(sensitive) == before  # nothing written
        return
    meta = ingest(
        control=control,
        sensitive=sensitive,
        name="sky",
        kind="bow",
        path=docword,
        vocab=vocab,
        vocabulary_public=True,
    )
    assert meta.schema == {"vocabulary": corpus_words, "vocabulary_source": DECLARED}
    # appending keeps the dataset's vocabulary and its source
    appended = ingest(
        control=control, sensitive=sensitive, name="sky", kind="bow", path=docword, vocab=vocab, append=True
    )
    assert appended.population == 4 and appended.schema["vocabulary_source"] == DECLARED


def test_a_recognised_vocabulary_or_a_public_dataset_needs_no_confirmation(
    engines: tuple[Engine, Engine], tmp_path: Path
) -> None:
    import scipy.sparse as sp

    control, sensitive = engines
    words = sorted(public_words(3))
    docword, vocab = tmp_path / "docword.txt", tmp_path / "vocab.txt"
    write_bag_of_words(sp.csr_array([[1, 0, 2]]), words, docword, vocab)
    meta = ingest(control=control, sensitive=sensitive, name="plain", kind="bow", path=docword, vocab=vocab)
    assert meta.schema["vocabulary_source"] == public_construction(words)
    odd = tmp_path / "odd.txt"
    write_bag_of_words(sp.csr_array([[1, 0, 2]]), ["quasar", "nebula", "pulsar"], docword, odd)
    demo = ingest(
        control=control, sensitive=sensitive, name="demo", kind="bow", path=docword, vocab=odd, public=True
    )
    assert demo.schema["vocabulary_source"] == PUBLIC_DATASET


def test_migration_0016_marks_earlier_vocabularies_as_not_recorded(tmp_path: Path) -> None:
    """A bag-of-words dataset stored before sources were recorded names that after the upgrade, and the
    downgrade takes it back; other datasets and recorded sources are left as they were."""
    from datetime import UTC, datetime

    from alembic import command
    from sqlalchemy import create_engine, insert, select

    from privacy_wall.ledger.schema import datasets
    from vips.migrate import alembic_config, upgrade

    url = f"sqlite:///{tmp_path / 'control.db'}"
    command.upgrade(alembic_config("control", url), "0015")
    engine = create_engine(url)
    schemas = {
        "old": ("bow", {"vocabulary": ["w"]}),
        "recorded": ("bow", {"vocabulary": ["w"], "vocabulary_source": DECLARED}),
        "table": ("tabular", {"columns": ["x"]}),
    }
    try:
        with engine.begin() as conn:
            for name, (kind, schema) in schemas.items():
                conn.execute(
                    insert(datasets).values(
                        name=name, kind=kind, population=1, dimension=1, schema=schema, public=False,
                        created_at=datetime.now(UTC),
                    )
                )  # fmt: skip
        upgrade("control", url)
        with engine.connect() as conn:
            stored = dict(conn.execute(select(datasets.c.name, datasets.c.schema)).all())
        assert stored["old"]["vocabulary_source"].startswith("not recorded")
        assert stored["recorded"] == schemas["recorded"][1] and stored["table"] == schemas["table"][1]
        command.downgrade(alembic_config("control", url), "0015")
        with engine.connect() as conn:
            back = dict(conn.execute(select(datasets.c.name, datasets.c.schema)).all())
        assert back == {name: schema for name, (_, schema) in schemas.items()}
    finally:
        engine.dispose()
