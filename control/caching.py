"""A bounded map shared by request threads: least recently used out first, each value computed once."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class BoundedCache(Generic[T]):
    """At most `size` entries, least recently used out first, safe across threads."""

    def __init__(self, size: int = 64) -> None:
        self._items: OrderedDict[tuple[Any, ...], T] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()
        self._computing: dict[tuple[Any, ...], threading.Lock] = {}

    def get(self, key: tuple[Any, ...]) -> T | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def put(self, key: tuple[Any, ...], value: T) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def get_or_compute(self, key: tuple[Any, ...], compute: Callable[[], T]) -> T:
        """The cached value, else `compute()`'s, computed once however many threads ask at the same time
        (the others wait for it and read it from the cache)."""
        value = self.get(key)
        if value is not None:
            return value
        with self._lock:
            computing = self._computing.setdefault(key, threading.Lock())
        try:
            with computing:
                value = self.get(key)
                if value is None:
                    value = compute()
                    self.put(key, value)
                return value
        finally:
            with self._lock:
                self._computing.pop(key, None)
