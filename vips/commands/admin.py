"""Custodian- and admin-side verbs that act on this machine's databases directly (no HTTP):
`vips admin create-key|list-keys|revoke-key` and `vips data ingest`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from control.store.keys import InvalidKeyRequest, create_key, key_record, list_keys, revoke_key
from privacy_wall.data.ingest import IngestError, ingest
from privacy_wall.sqlengine import create_db_engine
from vips.choices import DEFAULT_LABEL
from vips.commands.server import open_store
from vips.errors import UsageError
from vips.output import print_json


@contextmanager
def _control() -> Iterator[Engine]:
    """The configured control database, which must exist (vips.commands.server.open_store)."""
    wall = open_store(("control",))
    engine = create_db_engine(wall.control_url())
    try:
        yield engine
    finally:
        engine.dispose()


def _printable(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in record.items()}


def run_create_key(args: argparse.Namespace) -> int:
    with _control() as engine:
        try:
            key_id, key = create_key(
                engine,
                args.role,
                args.dataset,
                all_datasets=args.all_datasets,
                expires_in_days=args.expires_in,
                name=args.key_name,
            )
        except InvalidKeyRequest as exc:
            raise UsageError(f"argument --name: {exc}" if exc.field == "name" else str(exc)) from None
        record = key_record(engine, key_id)
    assert record is not None
    print(key)
    scope = f"dataset {args.dataset}" if args.dataset else "every dataset"
    expiry = (
        ""
        if record["expires_at"] is None
        else f", expires {record['expires_at'].isoformat()}, in {args.expires_in:g} days"
    )
    named = "" if record["name"] is None else f" named {record['name']!r}"
    print(
        f"vips: created {args.role} key {key_id}{named} ({scope}{expiry}); it is shown only once",
        file=sys.stderr,
    )
    return 0


def run_list_keys(args: argparse.Namespace) -> int:
    """One JSON line per key: id, name, role, scope, created, expires, revoked; never the key or its hash."""
    with _control() as engine:
        records = list_keys(engine)
    for record in records:
        print_json(_printable(record))
    return 0


def run_revoke_key(args: argparse.Namespace) -> int:
    with _control() as engine:
        if not revoke_key(engine, args.id):
            raise UsageError(f"key {args.id} not found (see vips admin list-keys)")
        record = key_record(engine, args.id)
    assert record is not None
    print_json(_printable(record))
    print(f"vips: revoked key {args.id}", file=sys.stderr)
    return 0


def run_ingest(args: argparse.Namespace) -> int:
    if args.append and args.public:
        raise UsageError("--public applies to a new dataset; --append keeps the dataset's own setting")
    if args.vocab_is_public and (args.kind != "bow" or args.append):
        raise UsageError(
            "--vocab-is-public confirms a new bag-of-words dataset's --vocab (--kind bow, no --append)"
        )
    wall = open_store()
    control = create_db_engine(wall.control_url())
    sensitive = create_db_engine(wall.sensitive_url())
    try:
        meta = ingest(
            control=control,
            sensitive=sensitive,
            name=args.name,
            kind=args.kind,
            path=Path(args.input),
            label=_label(args),
            vocab=None if args.vocab is None else Path(args.vocab),
            vocabulary_public=args.vocab_is_public,
            public=args.public,
            append=args.append,
        )
    except IngestError as exc:
        raise UsageError(str(exc)) from None
    finally:
        control.dispose()
        sensitive.dispose()
    print_json(
        {
            "dataset": meta.name,
            "kind": meta.kind,
            "population": meta.population,
            "dimension": meta.dimension,
            "public": meta.public,
            **{key: meta.schema[key] for key in ("vocabulary_source",) if key in meta.schema},
        }
    )
    return 0


def _label(args: argparse.Namespace) -> str | None:
    """The label column: as given, else `label` for the kinds that have one (docs/design.md section 6)."""
    if args.label is not None:
        return str(args.label)
    return DEFAULT_LABEL if args.kind in ("tabular", "regression") else None
