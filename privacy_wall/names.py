"""The one pattern for dataset names (and key scopes, which are dataset names).

Letters, digits, '_', '.' and '-', 1-128 characters, starting with a letter or digit (so never "." or
".."). Used by ingestion, the API's schemas and path parameters, and every CLI verb that takes a name.
This module imports only the standard library, so every side of the wall may use it; `did_you_mean` is
the one suggestion of a close name for a mistyped one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from difflib import get_close_matches

NAME_MAX_LENGTH = 128
#: For pydantic / FastAPI (`$` is the end of the text there) and for `re.fullmatch` here.
NAME_REGEX = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
NAME_RULE = "a dataset name is 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit"

_NAME = re.compile(NAME_REGEX)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """ " (did you mean 'x'?)" naming the choices closest to a mistyped `word` (difflib), or "" when none
    is close. For names of a public schema or catalogue only (columns, labels, datasets, models)."""
    close = get_close_matches(word, list(choices), n=3, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean {' or '.join(repr(name) for name in close)}?)"


def is_dataset_name(name: object) -> bool:
    """Whether `name` follows the rule (fullmatch: a trailing newline does not slip through `$`)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None
