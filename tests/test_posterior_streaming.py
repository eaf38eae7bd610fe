"""Posteriors stored in chunks and streamed (issue 34, item 10): a download holds one chunk of the document
in the API, carries its Content-Length, equals the stored text byte for byte, and ends short (never
silently wrong) when the outputs are deleted meanwhile; `vips posterior` streams to its file; migration
0011 moves stored documents into chunks and back."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import JSON, DateTime, String, column, func, insert, select, table

from control.store.models import posterior_chunks
from control.store.posteriors import (
    CHUNK_BYTES,
    PosteriorMissing,
    delete_posterior,
    iter_posterior,
    posterior_text,
)
from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import fresh_database, schema_drift
from tests.test_api import Api, finish, make_api
from tests.test_cli_verbs import use
from vips.cli import main
from vips.migrate import alembic_config


def large_document(job_id: str, values: int) -> dict[str, Any]:
    """A BLR-shaped posterior whose JSON text spans several chunks."""
    mean = [((i * 7919) % 10007) / 10007 - 0.5 for i in range(values)]
    return {"job_id": job_id, "model": "blr", "algorithm": "vips", "privacy": {"epsilon": 0.5}, "mean": mean}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path) as url:
        yield from make_api(url, tmp_path)


def succeeded_with(api: Api, values: int) -> tuple[str, bytes]:
    """A succeeded job holding a posterior of `values` floats, and its stored text."""
    job_id = api.submit().json()["id"]
    finish(api.engine, job_id, large_document(job_id, values))
    return job_id, posterior_text(api.engine, job_id)


def chunk_count(api: Api, job_id: str) -> int:
    with api.engine.connect() as conn:
        count = conn.execute(select(func.count()).where(posterior_chunks.c.job_id == job_id)).scalar_one()
    return int(count)


def test_a_posterior_of_several_chunks_is_sent_whole_with_its_length(api: Api) -> None:
    job_id, text = succeeded_with(api, 300_000)  # ~6 MB of JSON
    assert len(text) > 4 * CHUNK_BYTES and chunk_count(api, job_id) == -(-len(text) // CHUNK_BYTES)
    answer = api.call("GET", f"/v1/jobs/{job_id}/posterior", "client")
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    assert answer.headers["content-length"] == str(len(text)) and answer.content == text
    assert answer.json() == large_document(job_id, 300_000)


def test_reading_a_posterior_holds_one_chunk_not_the_document(api: Api) -> None:
    job_id, text = succeeded_with(api, 400_000)  # ~8 MB
    tracemalloc.start()
    try:
        sizes = [len(chunk) for chunk in iter_posterior(api.engine, job_id)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(sizes) == len(text) and max(sizes) == CHUNK_BYTES
    # One chunk and the driver's copy of it, not the 8 MB document (nor its 4x when parsed).
    assert peak < 3 * CHUNK_BYTES, peak


def test_a_posterior_deleted_while_it_streams_ends_short_never_wrong(api: Api) -> None:
    job_id, _ = succeeded_with(api, 200_000)
    chunks = iter_posterior(api.engine, job_id)
    assert len(next(chunks)) == CHUNK_BYTES
    with api.engine.begin() as conn:
        delete_posterior(conn, job_id)
    with pytest.raises(PosteriorMissing):
        next(chunks)


def test_deleting_a_jobs_outputs_deletes_its_chunks(api: Api) -> None:
    job_id, _ = succeeded_with(api, 200_000)
    assert chunk_count(api, job_id) >= 2
    assert api.call("DELETE", f"/v1/jobs/{job_id}/outputs", "analyst").status_code == 200
    assert chunk_count(api, job_id) == 0
    assert api.call("GET", f"/v1/jobs/{job_id}/posterior", "analyst").status_code == 410


def test_vips_posterior_streams_into_its_file_and_a_refusal_keeps_the_old_one(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    job_id, text = succeeded_with(api, 200_000)
    use(api, monkeypatch, "analyst")
    output = tmp_path / "p.json"
    assert main(["posterior", job_id[:8], "-o", str(output)]) == 0
    assert output.read_bytes() == text
    assert f"posterior of job {job_id} written to {output}" in capsys.readouterr().err
    queued = api.submit().json()["id"]  # no posterior yet: 409, and the file from before stays
    assert main(["posterior", queued, "-o", str(output)]) == 1
    assert "succeeded" in capsys.readouterr().err
    assert output.read_bytes() == text and not (tmp_path / "p.json.tmp").exists()


# ---- migration 0011 --------------------------------------------------------------------------------------

#: The posteriors table as migration 0010 left it: the document as one JSON value.
posteriors_0010 = table(
    "posteriors", column("job_id", String(32)), column("document", JSON), column("created_at", DateTime)
)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_migration_0011_moves_stored_documents_into_chunks_and_back(tmp_path: Path, kind: str) -> None:
    from alembic import command

    from control.store.keys import create_key
    from privacy_wall.ledger.schema import metadata
    from tests.test_api import add_dataset
    from tests.test_storage_caps import insert_job

    with fresh_database(kind, tmp_path) as url:
        config = alembic_config("control", url)
        command.upgrade(config, "0010")
        engine = create_db_engine(url)
        try:
            owner, _ = create_key(engine, "analyst", None, all_datasets=True)
            add_dataset(engine, "priv")
            documents = {
                "a" * 32: large_document("a" * 32, 120_000),
                "b" * 32: {"model": "blr", "mean": [1.5]},
            }
            with engine.begin() as conn:
                for job_id, document in documents.items():
                    insert_job(conn, job_id, owner)
                    conn.execute(
                        insert(posteriors_0010).values(
                            job_id=job_id, document=document, created_at=datetime.now(UTC)
                        )
                    )
            command.upgrade(config, "0011")
            engine.dispose()
            assert schema_drift(engine, metadata, "posterior") == []
            for job_id, document in documents.items():
                assert json.loads(posterior_text(engine, job_id)) == document
            assert len(posterior_text(engine, "a" * 32)) > 2 * CHUNK_BYTES
            command.downgrade(config, "0010")
            engine.dispose()
            with engine.connect() as conn:
                back = dict(conn.execute(select(posteriors_0010.c.job_id, posteriors_0010.c.document)).all())
            assert back == documents
        finally:
            engine.dispose()
