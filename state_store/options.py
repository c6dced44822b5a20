"""libpq options of the connections to the store's Postgres (control plane and workers)."""

# The store's reads are many short index walks (a UNION ALL branch per vnode): a server
# built with LLVM would JIT-compile every branch, which costs far more than the query
# itself (bench/HISTORY.md#jit-off).
NO_JIT = "-c jit=off"
# A worker's writes need not wait for the WAL flush: they count only once the control
# plane commits their epoch, and that commit (synchronous) flushes the WAL up to itself,
# past every write the workers committed before collecting. Waiting would add a flush
# per actor, read and epoch, which the upstream's commits queue behind on a shared
# server. A crash before the epoch's commit loses the epoch either way (recovery rolls
# the view back to the committed epoch).
WORKER_DATA_OPTIONS = NO_JIT + " -c synchronous_commit=off"


def with_options(given: str | None, ours: str) -> str:
    """libpq ``options`` of a URL's own (``?options=...``) and ours after them: passing
    ours alone as ``options=`` would replace the URL's."""
    return f"{given} {ours}" if given else ours


def worker_dsn(url: str) -> str:
    """The connection string a worker and its Spark tasks connect with: every parameter of
    the URL it was handed (TLS's ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``
    among them) and ``WORKER_DATA_OPTIONS``."""
    from psycopg2.extensions import make_dsn, parse_dsn

    return make_dsn(url, options=with_options(parse_dsn(url).get("options"), WORKER_DATA_OPTIONS))
