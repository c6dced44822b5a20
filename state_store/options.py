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
