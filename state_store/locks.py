"""Advisory lock keys that the control plane and the workers both take."""

# The advisory lock ("grap", graph id) the rounds of a Spark job spanning epochs fence
# themselves with (``spark_workers.rounds``): each round holds it shared instead of
# locking the graph's row, so that barriers and collects never wait for rounds; a
# recovery takes it exclusively before it rolls back. The lock manager queues a shared
# request behind a waiting exclusive one (row locks do not): a job's overlapping rounds
# never keep a recovery out for longer than the rounds under way.
GRAPH_GATE_LOCK = 0x6772_6170
