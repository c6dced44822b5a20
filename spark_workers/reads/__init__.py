"""The worker's read strategies: one per way of moving an actor's reads (on the driver,
a Spark job per epoch, a Spark job spanning epochs, Kafka), behind one interface
(``interface.ReadStrategy``), chosen per actor in one place (``choose.Strategies``).
``docs/architecture.md#the-workers-read-strategies``."""

from spark_workers.reads.choose import Strategies
from spark_workers.reads.interface import CHUNK_ROWS, ReadContext, ReadStrategy

__all__ = ["CHUNK_ROWS", "ReadContext", "ReadStrategy", "Strategies"]
