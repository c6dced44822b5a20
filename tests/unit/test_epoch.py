import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_core.epoch import EPOCH_ORIGIN_UNIX_MS, Epoch, EpochPair, InvalidEpoch, lag_ms


def test_layout_is_ms_since_2021_04_01_shifted_16() -> None:
    e = Epoch.from_unix_ms(EPOCH_ORIGIN_UNIX_MS + 1234)
    assert int(e) == 1234 << 16
    assert e.physical_time == 1234
    assert e.unix_ms == EPOCH_ORIGIN_UNIX_MS + 1234


def test_zero_and_negative_are_invalid() -> None:
    with pytest.raises(InvalidEpoch):
        Epoch(0)
    with pytest.raises(InvalidEpoch):
        Epoch.from_unix_ms(EPOCH_ORIGIN_UNIX_MS - 1)


def test_next_follows_the_clock() -> None:
    e = Epoch.from_unix_ms(EPOCH_ORIGIN_UNIX_MS + 1000)
    assert e.next(EPOCH_ORIGIN_UNIX_MS + 1500) == Epoch.from_unix_ms(EPOCH_ORIGIN_UNIX_MS + 1500)


@given(
    start=st.integers(1, 10**9),
    clock=st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=50),
)
def test_next_is_strictly_increasing_even_when_the_clock_stalls_or_goes_back(
    start: int, clock: list[int]
) -> None:
    e = Epoch.from_physical_time(start)
    now = EPOCH_ORIGIN_UNIX_MS + start
    for delta in clock:
        now += delta
        n = e.next(max(now, EPOCH_ORIGIN_UNIX_MS))
        assert n > e
        e = n


def test_epoch_pair() -> None:
    p = EpochPair(1 << 16, 2 << 16)
    assert (p.prev, p.curr) == (65536, 131072)
    assert EpochPair.first(5).prev == 0
    with pytest.raises(InvalidEpoch):
        EpochPair(2 << 16, 2 << 16)
    with pytest.raises(InvalidEpoch):
        EpochPair(3 << 16, 2 << 16)


def test_lag_is_in_physical_milliseconds() -> None:
    assert lag_ms((5000 << 16) + 3, 2000 << 16) == 3000
    assert lag_ms(1 << 16, 9 << 16) == 0
