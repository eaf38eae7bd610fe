"""Custodian- and admin-side verbs that act on this machine's databases directly (no HTTP):
`vips admin create-key` and `vips data ingest`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from privacy_wall.ingest import IngestError, ingest
from privacy_wall.settings import WallSettings
from privacy_wall.sqlengine import create_db_engine
from service.keys import InvalidKeyRequest, create_key
from vips.commands.server import migrate_all
from vips.errors import UsageError
from vips.output import print_json


def run_create_key(args: argparse.Namespace) -> int:
    wall = WallSettings()
    if wall.control_database_url is None:
        migrate_all()
    engine = create_db_engine(wall.control_url())
    try:
        key_id, key = create_key(engine, args.role, args.dataset)
    except InvalidKeyRequest as exc:
        raise UsageError(str(exc)) from None
    finally:
        engine.dispose()
    print(key)
    print(f"vips: created {args.role} key {key_id}; it is shown only once", file=sys.stderr)
    return 0


def run_ingest(args: argparse.Namespace) -> int:
    wall = WallSettings()
    if wall.control_database_url is None and wall.sensitive_database_url is None:
        migrate_all()
    control = create_db_engine(wall.control_url())
    sensitive = create_db_engine(wall.sensitive_url())
    try:
        meta = ingest(
            control=control,
            sensitive=sensitive,
            name=args.name,
            kind=args.kind,
            path=Path(args.input),
            label=args.label,
            vocab=None if args.vocab is None else Path(args.vocab),
            public=args.public,
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
        }
    )
    return 0
