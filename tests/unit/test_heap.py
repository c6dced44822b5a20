"""The serving process freezes its start-up heap (``service/heap.py``)."""

import subprocess
import sys

PROBE = """
import gc
from service.api.app import create_app
from service.heap import GEN0_THRESHOLD, settle_after_start
from service.settings import Settings

app = create_app(Settings(auth=False))
settle_after_start()
assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()
assert len(gc.get_objects(2)) < 1_000  # a full collection walks none of it
assert gc.get_threshold()[0] == GEN0_THRESHOLD
"""


def test_the_start_up_heap_is_frozen_and_young_objects_collected_less_often() -> None:
    # in a process of its own: freezing is for the life of a process
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
