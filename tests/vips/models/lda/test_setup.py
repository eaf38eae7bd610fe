"""LDA's public word prior is wired where a fit is set up: the option, the registry, the estimators, the
worker's jobs (the dataset's public vocabulary) and the posterior that names the prior it used.

The estimate itself (vips.models.lda.word_prior) is tested in tests/vips/models/lda/test_word_prior.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp
from fastapi.testclient import TestClient

from control.jobs.queue import RecordingQueue
from control.planning.options import option_problem
from control.settings import ServiceSettings
from control.store.keys import create_key
from privacy_wall.data.ingest import ingest
from privacy_wall.sqlengine import create_db_engine
from service.app import create_app
from tests.dbservers import fresh_database
from vips.datasets.wikipedia import write_bag_of_words
from vips.estimators import VIPSLatentDirichletAllocation
from vips.models.lda.model import LatentDirichletAllocation
from vips.models.registry import model_setup
from worker.jobs import execute_job

DELTA = 1e-5
#: Common English words (all in wordfreq's list) and a few made-up ones: coverage well above one half.
# fmt: off
ENGLISH = [
    "the", "year", "government", "people", "city", "music", "film", "team", "school", "water", "country",
    "world", "family", "history", "game", "church", "river", "party", "court", "station", "club",
    "company", "army", "season", "album", "league", "island", "village", "market", "energy", "science",
    "theatre", "garden", "window", "bridge", "mountain", "letter", "doctor", "winter", "summer", "ocean",
    "zzqx", "vvkr",
]
# fmt: on
TOKEN_IDS = [f"w{v:03d}" for v in range(len(ENGLISH))]


def _corpus(documents: int = 300, seed: int = 0) -> sp.csr_array:
    """Documents of ~40 tokens over ENGLISH, word v drawn with probability proportional to 1 / (v + 1)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(ENGLISH) + 1)
    return sp.csr_array(rng.multinomial(40, p / p.sum(), size=documents).astype(np.float64))


def _model(options: dict[str, float], vocabulary: list[str] | None) -> LatentDirichletAllocation:
    model = model_setup("lda", options, sigma=1.0, vocabulary=vocabulary).model
    assert isinstance(model, LatentDirichletAllocation)
    return model


def test_the_registry_gives_the_prior_only_to_the_fallback_on_an_english_vocabulary() -> None:
    with_fallback = {"topics": 3, "unigram_share": 0.5}
    model = _model(with_fallback, ENGLISH)
    assert model.word_prior is not None and len(model.word_prior) == len(ENGLISH)
    assert abs(sum(model.word_prior) - 1.0) < 1e-9
    assert model.word_prior[ENGLISH.index("the")] > model.word_prior[ENGLISH.index("theatre")]
    assert model.word_prior_source is not None and model.word_prior_source.startswith("wordfreq ")
    assert _model({**with_fallback, "word_prior": 0}, ENGLISH).word_prior is None  # switched off
    assert _model({"topics": 3}, ENGLISH).word_prior is None  # no unigram block: nothing to shrink
    assert _model(with_fallback, TOKEN_IDS).word_prior is None  # not words: no prior applies
    assert _model(with_fallback, None).word_prior is None


def test_word_prior_is_a_switch() -> None:
    assert option_problem("lda", "word_prior", 0) is None and option_problem("lda", "word_prior", 1) is None
    assert option_problem("lda", "word_prior", 0.5) == "option 'word_prior' must be a whole number in [0, 1]"
    assert "unknown option 'word_prior'" in str(option_problem("sbn", "word_prior", 1))


def test_an_estimator_with_a_vocabulary_names_its_prior_in_the_posterior() -> None:
    counts = _corpus()
    fitted = VIPSLatentDirichletAllocation(topics=3, epsilon=2.0, vocabulary=ENGLISH).fit(counts)
    document = fitted.posterior_
    assert document["vocabulary"] == ENGLISH
    assert str(document["word_prior"]).startswith("wordfreq ")
    off = VIPSLatentDirichletAllocation(topics=3, epsilon=2.0, vocabulary=ENGLISH, word_prior=0).fit(counts)
    assert "word_prior" not in off.posterior_
    assert "word_prior" not in VIPSLatentDirichletAllocation(topics=3, epsilon=2.0).fit(counts).posterior_


def test_a_job_on_an_english_corpus_uses_the_prior_its_schema_allows(tmp_path: Path) -> None:
    """The worker reads the dataset's public vocabulary from the catalogue for the prior; a job that
    switches it off gets none."""
    with (
        fresh_database("sqlite", tmp_path, "control") as control_url,
        fresh_database("sqlite", tmp_path, "sensitive") as sensitive_url,
    ):
        control, sensitive = create_db_engine(control_url), create_db_engine(sensitive_url)
        try:
            custodian_id, custodian = create_key(control, "custodian", "docs")
            _, analyst = create_key(control, "analyst", all_datasets=True)
            docword, vocab = tmp_path / "docs.docword.txt", tmp_path / "docs.vocab.txt"
            write_bag_of_words(_corpus(), ENGLISH, docword, vocab)
            ingest(control=control, sensitive=sensitive, name="docs", kind="bow", path=docword, vocab=vocab,
                   vocabulary_public=True, owner=custodian_id)  # fmt: skip
            settings = ServiceSettings(home=tmp_path, control_database_url=control_url)
            with TestClient(create_app(settings, queue=RecordingQueue())) as http:
                as_custodian = {"Authorization": f"Bearer {custodian}"}
                as_analyst = {"Authorization": f"Bearer {analyst}"}
                budget = {"epsilon": 10.0, "delta": DELTA}
                assert (
                    http.put("/v1/datasets/docs/budget", json=budget, headers=as_custodian).status_code == 200
                )
                sources = []
                for extra in ({}, {"word_prior": 0}):
                    spec = {"dataset": "docs", "model": "lda", "epsilon": 2.0, "iterations": 2,
                            "options": {"topics": 3, **extra}}  # fmt: skip
                    r = http.post("/v1/jobs", json=spec, headers=as_analyst)
                    assert r.status_code == 202, r.text
                    job_id = r.json()["id"]
                    assert r.json()["options"].get("unigram_share", 0) > 0  # the rule's fallback
                    assert execute_job(job_id, control, sensitive) == "succeeded"
                    document = http.get(f"/v1/jobs/{job_id}/posterior", headers=as_analyst).json()
                    sources.append(document.get("word_prior"))
                assert str(sources[0]).startswith("wordfreq ") and sources[1] is None
        finally:
            control.dispose()
            sensitive.dispose()
