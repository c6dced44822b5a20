"""A real Kafka-protocol broker for tests: librdkafka's mock cluster.

A client configured with ``test.mock.num.brokers`` starts the cluster in-process, and its
metadata names the broker's address; the cluster lives as long as that client.
Other clients (the service, worker processes, Spark tasks) reach it over TCP. It creates
topics with 4 partitions on first produce, and has no admin API.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import confluent_kafka as ck

MOCK_PARTITIONS = 4


class MockKafka:
    def __init__(self) -> None:
        # no ``debug: mock``: its log lines go through a Python callback from the mock
        # brokers' threads, which then wait for the GIL behind the test's own threads and
        # serve fetches slowly. The metadata names the broker's address instead.
        quiet = logging.getLogger("mock-kafka-clients")
        quiet.propagate = False
        self._owner = ck.Producer({"test.mock.num.brokers": 1, "logger": quiet})
        brokers = self._owner.list_topics(timeout=10).brokers
        if not brokers:
            raise RuntimeError("the mock Kafka cluster did not report its address")
        broker = next(iter(brokers.values()))
        self.bootstrap = f"{broker.host}:{broker.port}"
        self._quiet = quiet
        self.producer = ck.Producer({"bootstrap.servers": self.bootstrap, "logger": quiet})
        self._bulk: ck.Producer | None = None
        self._transactional: ck.Producer | None = None
        self.produced = 0

    def produce(self, topic: str, docs: Iterable[tuple[int, Any]]) -> None:
        """Append ``(partition, JSON value)`` messages and wait until they are stored."""
        self._send(self.producer, topic, docs)

    def load(self, topic: str, docs: Iterable[tuple[int, Any]]) -> None:
        """``produce`` for a large backlog: the messages go in as few batches as librdkafka
        makes (about 1 MB), since the mock broker returns one stored batch per fetch and
        every reader of the topic (``verify`` too) would pay for many small ones."""
        if self._bulk is None:
            self._bulk = ck.Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "logger": self._quiet,
                    "linger.ms": 200,
                    "batch.num.messages": 100_000,
                    "batch.size": 16_000_000,
                    "queue.buffering.max.messages": 1_000_000,
                }
            )
        self._send(self._bulk, topic, docs)

    def transaction(self, topic: str, partition: int, docs: Iterable[Any], commit: bool) -> None:
        """One transaction of one transactional producer: its messages to ``partition``,
        then a commit (or an abort), whose marker takes an offset of the partition.
        (The mock broker does not tell consumers which transactions were aborted, so even
        ``read_committed`` readers get the messages of an aborted one.)"""
        if self._transactional is None:
            self._transactional = ck.Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "logger": self._quiet,
                    "transactional.id": f"kit-{id(self)}",
                }
            )
            self._transactional.init_transactions(30)
        p = self._transactional
        p.begin_transaction()
        self._send(p, topic, ((partition, d) for d in docs))  # stored: an abort has to undo it
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)

    def _send(self, producer: ck.Producer, topic: str, docs: Iterable[tuple[int, Any]]) -> None:
        for partition, doc in docs:
            value = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
            while True:
                try:
                    producer.produce(topic, value=value, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.05)
            self.produced += 1
        left = producer.flush(30)
        if left:
            raise RuntimeError(f"{left} messages were not delivered")

    def close(self) -> None:
        for p in (self.producer, self._bulk, self._transactional):
            if p is not None:
                p.flush(5)


class Producer:
    """Appends batches of ``doc(i)`` (i counting up from ``start``) to random partitions
    every ``every_s`` until stopped. Each batch goes to one partition: the mock broker
    returns one stored batch per fetch, so a topic of many one-message batches would be
    read unrealistically slowly."""

    def __init__(
        self,
        kafka: MockKafka,
        topic: str,
        doc: Callable[[int], Any],
        start: int,
        seed: int,
        every_s: float = 0.05,
        most: int = 60,
    ) -> None:
        self.kafka, self.topic, self.doc = kafka, topic, doc
        self.every_s, self.most = every_s, most
        self.next = start
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.batches = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            n, partition = self.rng.randint(1, self.most), self.rng.randrange(MOCK_PARTITIONS)
            docs = [(partition, self.doc(i)) for i in range(self.next, self.next + n)]
            self.kafka.produce(self.topic, docs)
            self.next += n
            self.batches += 1


@contextmanager
def mock_kafka() -> Iterator[MockKafka]:
    cluster = MockKafka()
    try:
        yield cluster
    finally:
        cluster.close()
