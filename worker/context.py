"""Per-process resources of a worker: database engines and the dataset cache, built once from the
settings."""

from __future__ import annotations

from functools import lru_cache

from sqlalchemy import Engine

from privacy_wall.data.dataset_cache import DatasetCache
from privacy_wall.data.settings import get_wall_settings
from privacy_wall.sqlengine import create_db_engine


@lru_cache
def control_engine() -> Engine:
    return create_db_engine(get_wall_settings().control_url())


@lru_cache
def sensitive_engine() -> Engine:
    return create_db_engine(get_wall_settings().sensitive_url())


@lru_cache
def dataset_cache() -> DatasetCache:
    """This worker's decoded datasets (VIPS_WORKER_CACHE_MB of arrays), shared by its job threads."""
    from control.settings import get_settings

    return DatasetCache(int(get_settings().worker_cache_mb * (1 << 20)))
