"""The data side of the wall: reading, storing and caching the sensitive rows.

Strict readers of input files (`formats`), ingestion into the sensitive database (`ingest`), the block
layout and the row stores the gate samples from (`blocks`, `store`, `db_store`), a worker's cache of decoded
datasets (`dataset_cache`), the sensitive database's tables (`schema`) and the one settings class that holds
its URL (`settings`). Only the wall opens these; the API never imports this package.
"""
