"""The accountants' names. Imports nothing, so the CLI's parser can offer them without loading them."""

from __future__ import annotations

ACCOUNTANT_NAMES = ("filter", "pld", "rdp", "paper")
DEFAULT_ACCOUNTANT = "filter"
