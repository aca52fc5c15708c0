"""The filesystem broker's messages appear whole: consumers in other processes never take one
half-written, and none is lost (``scheduler_core.transports.filesystem_broker``).

Real processes: this one publishes as fast as it can while two others consume through kombu's
own consumer path, as two Celery workers on one folder do. The interleaving that race hits by
chance is then made certain in one process, on this transport and, as the negative control, on
kombu's own.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path
from queue import Empty
from typing import Any

import pytest

OURS = "scheduler_core.transports.filesystem_broker:Transport"
KOMBUS = "filesystem"

pytestmark = [pytest.mark.process]


def _channel(folder: str, transport: str) -> Any:
    from kombu import Connection

    options = {"data_folder_in": folder, "data_folder_out": folder}
    return Connection("filesystem://", transport=transport, transport_options=options).channel()


def _consume(folder: str, transport: str, stop_at: float, done: Any, out: Any) -> None:
    ch = _channel(folder, transport)
    got, undecodable = 0, 0
    while time.monotonic() < stop_at:
        try:
            ch._get("q")
            got += 1
        except Empty:
            if done.is_set():  # everything published is taken
                break
        except ValueError:  # an empty or partial file: what stops a Celery worker
            undecodable += 1
    out.put((got, undecodable))


def _race(tmp_path: Path, transport: str, publish_seconds: float) -> tuple[int, int, int]:
    """Publish for ``publish_seconds`` beside two consumers; (published, received, undecodable)."""
    folder = str(tmp_path)
    ch = _channel(folder, transport)
    ctx = mp.get_context("fork")
    out: Any = ctx.Queue()
    done = ctx.Event()
    stop_at = time.monotonic() + publish_seconds + 10
    consumers = [
        ctx.Process(target=_consume, args=(folder, transport, stop_at, done, out)) for _ in range(2)
    ]
    for p in consumers:
        p.start()
    published = 0
    end = time.monotonic() + publish_seconds
    while time.monotonic() < end:
        ch._put("q", {"body": "x" * 200, "n": published})
        published += 1
    done.set()
    results = [out.get(timeout=30) for _ in consumers]
    for p in consumers:
        p.join(timeout=10)
    left = len([n for n in Path(folder).iterdir() if n.name.endswith(".q.msg")])
    received = sum(r[0] for r in results) + left
    return published, received, sum(r[1] for r in results)


def test_two_consumers_never_take_a_half_written_message_and_none_is_lost(
    tmp_path: Path,
) -> None:
    published, received, undecodable = _race(tmp_path, OURS, publish_seconds=3)
    assert published > 500
    assert undecodable == 0
    assert received == published


class _ConsumerBetween:
    """A payload value whose encoding runs a consumer's read: the read happens after the
    publisher has started writing the message and before it has finished."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.seen: list[str] = []


def _take_while_written(tmp_path: Path, transport: str) -> list[str]:
    from kombu.utils.json import register_type

    def encode(value: _ConsumerBetween) -> str:
        try:
            value.consumer._get("q")
            value.seen.append("a message")
        except Empty:
            value.seen.append("nothing")
        except ValueError:
            value.seen.append("an undecodable file")
        return "x"

    register_type(_ConsumerBetween, "tenure-test-consumer-between", encode, lambda v: v)
    between = _ConsumerBetween(_channel(str(tmp_path), transport))
    _channel(str(tmp_path), transport)._put("q", {"body": between})
    return between.seen


@pytest.mark.parametrize(
    ("transport", "taken"), [(OURS, ["nothing"]), (KOMBUS, ["an undecodable file"])]
)
def test_a_consumer_reading_while_a_message_is_written_sees_it_whole_or_not_at_all(
    tmp_path: Path, transport: str, taken: list[str]
) -> None:
    """The interleaving the race above hits by chance, made certain: a consumer reads between
    the start and the end of a publisher's write. On this transport it finds nothing (the
    message is still under its hidden name); on kombu's own, the negative control, it takes
    the empty file, which stops a Celery worker."""
    assert _take_while_written(tmp_path, transport) == taken
