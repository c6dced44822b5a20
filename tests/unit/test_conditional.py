"""The ETag's input: a body with its committed epochs zeroed, and nothing else changed."""

from __future__ import annotations

import json

from hypothesis import assume, given
from hypothesis import strategies as st

from service.api.conditional import _without_epoch


def test_every_committed_epoch_member_is_zeroed_at_any_depth() -> None:
    body = {
        "committed_epoch": "11698412915982339",
        "jobs": [{"id": 1, "committed_epoch": "5"}, {"x": [1]}],
    }
    out = json.loads(_without_epoch(json.dumps(body, separators=(",", ":")).encode()))
    assert out == {
        "committed_epoch": "0",
        "jobs": [{"id": 1, "committed_epoch": "0"}, {"x": [1]}],
    }


@given(st.text(), st.integers(min_value=0, max_value=2**63 - 1).map(str))
def test_text_that_spells_the_member_inside_a_string_is_left_alone(name: str, n: str) -> None:
    assume(name != "committed_epoch")
    for text in (
        name,
        f'"committed_epoch":"{n}"',
        f'{name}"committed_epoch',
        f'{name}"committed_epoch":"{n}"',
    ):
        body = {"name": text, "names": {text: n}, "committed_epoch": n}
        out = json.loads(_without_epoch(json.dumps(body, separators=(",", ":")).encode()))
        assert out == {"name": text, "names": {text: n}, "committed_epoch": "0"}
