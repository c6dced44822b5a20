"""The COPY streams' prefetching (``state_store.versioned._PrefetchedStream``): chunks
made on a thread of their own come out in order, errors reach the reader, and ``close``
stops the thread wherever it is."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import pytest

from state_store.versioned import _PrefetchedStream


def test_chunks_come_in_order_then_the_empty_chunk_made_on_another_thread() -> None:
    makers: set[int] = set()

    def chunks() -> Iterator[bytes]:
        for i in range(10):
            makers.add(threading.get_ident())
            yield b"%d\n" % i

    stream = _PrefetchedStream(chunks(), b"")
    try:
        got = list(iter(stream.read, b""))
        assert got == [b"%d\n" % i for i in range(10)]
        assert stream.read() == b"" and stream.read() == b""  # the driver may read again
    finally:
        stream.close()
    assert makers and threading.get_ident() not in makers


def test_an_error_of_the_chunks_reaches_the_reader_after_the_chunks_before_it() -> None:
    def chunks() -> Iterator[str]:
        yield "a\n"
        raise ValueError("bad record")

    stream = _PrefetchedStream(chunks(), "")
    try:
        assert stream.read() == "a\n"
        with pytest.raises(ValueError, match="bad record"):
            stream.read()
        assert stream.read() == ""
    finally:
        stream.close()


def test_everything_joins_the_chunks_read_and_the_rest() -> None:
    stream = _PrefetchedStream(iter(["a\n", "b\n", "c\n"]), "", keep=True)
    try:
        assert stream.read() == "a\n"
        assert stream.everything() == "a\nb\nc\n"
    finally:
        stream.close()


def test_close_stops_the_thread_while_chunks_keep_coming() -> None:
    made = itertools.count()

    def endless() -> Iterator[bytes]:
        while True:
            next(made)
            yield b"x\n"

    stream = _PrefetchedStream(endless(), b"")
    assert stream.read() == b"x\n"
    stream.close()  # (a failed COPY: the reader stops reading)
    after = next(made)
    assert next(made) == after + 1  # nothing else advances the chunks now
