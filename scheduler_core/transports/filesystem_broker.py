"""The filesystem broker, one message file at a time: a consumer never takes a half-written one.

kombu's filesystem transport creates a message's file under its final name and then writes it.
A consumer listing the folder in between moves the empty file away, fails to decode it and
stops the Celery worker ("Unrecoverable error: JSONDecodeError"), and the message is lost. Its
channel here writes each message under a name the consumers' listing skips and renames it to
its final name once written: a rename within one folder is atomic, so a consumer sees a whole
message or none. Everything else is kombu's.

Use it where the broker is ``filesystem://`` (the example project's embedded default, one host
only): ``CELERY_BROKER_TRANSPORT = "scheduler_core.transports.filesystem_broker:Transport"``
(docs/transports.md; ``tests/transports/test_filesystem_broker.py``).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable
from time import monotonic
from typing import Any, cast

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils import json as kombu_json

# kombu's own JSON (it encodes the types its messages may carry); untyped upstream.
_dumps = cast(Callable[[Any], str], kombu_json.dumps)


class Channel(filesystem.Channel):
    """kombu's filesystem channel whose messages appear whole."""

    # kombu names the argument `payload` here and `message` in its base: keep its own name.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # The name kombu's consumers look for (time-ordered, then the queue), and a hidden name
        # beside it that their listing skips: it does not end in ``.<queue>.msg``.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(partial, "wb") as f:
                f.write(_dumps(payload).encode())
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    """kombu's filesystem transport with :class:`Channel`."""

    Channel = Channel
