"""Alembic migration histories of the two databases (`control/`, `sensitive/`), shipped as package data."""
