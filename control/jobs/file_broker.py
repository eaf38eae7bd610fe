"""The embedded mode's broker: kombu's file-system transport, with messages that appear whole.

kombu's own (kombu.transport.filesystem) creates a message's file in the queue folder and then writes it,
and its consumers never wait for the writer's lock: a consumer that lists the folder in between takes the
empty file, fails to decode it (the worker dies: "Unrecoverable error: JSONDecodeError") and the message
is lost with it. Here a message is written under a temporary name in the staging folder and renamed into
the queue folder whole (a rename within one file system is atomic), so a consumer sees it complete or not
at all. A consumer takes a message by renaming it into the processed folder (same file system: exactly
one consumer's rename succeeds, the others find it gone and go on to the next one), reads it there and
deletes it. A file that does not decode (left by another writer) is set aside and logged, never raised.

Celery uses it through `broker_transport` (control.settings.FILE_BROKER_TRANSPORT, in celery_config);
the URL stays `filesystem://`, and the folders are kombu's transport options plus `staging_folder`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import uuid
from queue import Empty
from time import monotonic_ns
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

log = logging.getLogger(__name__)

#: The suffix of a message file that did not decode, set aside in the processed folder.
UNREADABLE_SUFFIX = ".unreadable"


class Channel(filesystem.Channel):
    """kombu's file-system channel whose files are published by rename."""

    @property
    def staging_folder(self) -> str:
        """Where files are written before they are renamed into place (the queue folder's file system)."""
        return str(self.transport_options.get("staging_folder") or self.processed_folder)

    def _place(self, path: str, data: bytes, folder: str, *, exclusive: bool = False) -> None:
        """Write `data` to a temporary file in `folder` (on `path`'s file system), then give it the name
        `path` at once: a rename, or with `exclusive` a link, which fails with FileExistsError if `path`
        exists."""
        fd, staged = tempfile.mkstemp(dir=folder, prefix=".", suffix=".part")
        try:
            with open(fd, "wb") as file:
                file.write(data)
            (os.link if exclusive else os.rename)(staged, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)
            raise
        if exclusive:
            os.unlink(staged)

    # kombu names the argument `message` in AbstractChannel and `payload` in its file-system Channel
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Put `payload` on `queue`: its file appears in the queue folder whole."""
        # Consumers take files in name order. kombu's names start with the milliseconds, not zero-padded:
        # "10000_" sorts before "9999_", and two messages of one millisecond in either order.
        name = f"{monotonic_ns():020d}_{uuid.uuid4()}.{queue}.msg"
        path = os.path.join(self.data_folder_out, name)
        try:
            self._place(path, str_to_bytes(dumps(payload)), self.staging_folder)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {path!r} to the queue") from exc

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        """Take the first message of `queue` (in name order) that no other consumer took first."""
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            taken = os.path.join(self.processed_folder, name)
            try:
                os.rename(os.path.join(self.data_folder_in, name), taken)
            except FileNotFoundError:
                if not os.path.isdir(self.processed_folder):
                    raise ChannelError(f"The broker folder {self.processed_folder!r} is missing") from None
                continue  # another consumer took it
            except OSError as exc:
                raise ChannelError(f"Cannot take {name!r} from the queue") from exc
            try:
                with open(taken, "rb") as file:
                    message = loads(bytes_to_str(file.read()))
            except (OSError, ValueError) as exc:
                # Not written by _put (a stock kombu writer's half-written file): drop it, keep the worker.
                log.error(
                    "a broker message did not decode (%s); set aside as %s", exc, taken + UNREADABLE_SUFFIX
                )
                with contextlib.suppress(OSError):
                    os.rename(taken, taken + UNREADABLE_SUFFIX)
                continue
            if not self.store_processed:
                os.remove(taken)
            return message
        raise Empty()

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        """Bind `queue` to `exchange`. kombu creates a missing exchange table empty and then writes it (a
        reader can decode it empty; two creators each write their own); here the first table appears
        whole, once, and a binding added to an existing table is kombu's (under its lock, in place)."""
        table = self._exchange_file(exchange)
        if not table.exists():
            table.parent.mkdir(exist_ok=True)
            entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
            try:
                self._place(str(table), str_to_bytes(dumps([entry])), str(table.parent), exclusive=True)
                return
            except FileExistsError:
                pass  # another process created it meanwhile: add to it
            except OSError as exc:
                raise ChannelError(f"Cannot create {table}") from exc
        super()._queue_bind(exchange, routing_key, pattern, queue)


class Transport(filesystem.Transport):
    """kombu's file-system transport with the channel above."""

    Channel = Channel
