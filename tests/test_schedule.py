"""Schedule properties (hypothesis) and the errors for every invalid parameter."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skipdecode.schedule import DECAYS, MODES, Schedule, for_speedup, max_speedup


@st.composite
def schedules(draw):
    L = draw(st.integers(1, 64))
    w = draw(st.integers(0, L - 1))
    hi = draw(st.integers(w + 1, L))
    lo = draw(st.integers(w + 1, hi))
    return Schedule(L, hi, lo, warmup=w, horizon=draw(st.integers(1, 200)), decay=draw(st.sampled_from(DECAYS)),
                    mode=draw(st.sampled_from(MODES)))


@settings(max_examples=300, deadline=None)
@given(schedules(), st.integers(0, 400))
def test_budget_is_monotone_bounded_and_layers_are_kv_safe(schedule, extra):
    L, w = schedule.num_layers, schedule.warmup
    steps = schedule.horizon + 1 + extra
    budgets = [schedule.budget(s) for s in range(steps)]
    assert budgets[0] == schedule.max_budget
    assert all(later <= earlier for earlier, later in zip(budgets, budgets[1:]))
    assert all(w + 1 <= b <= L for b in budgets)
    assert all(b == schedule.min_budget for b in budgets[schedule.horizon:])  # past the horizon: the minimum
    ran_before = set(range(L))  # the prompt runs every layer
    for s in range(steps):
        layers = schedule.layers(s)
        assert len(layers) == budgets[s] and list(layers) == sorted(set(layers))
        assert set(range(w)) <= set(layers)  # warm-up always runs
        if schedule.mode == "skip":
            assert layers[-1] == L - 1  # the top layer always feeds the LM head
        else:
            assert layers == tuple(range(budgets[s]))
        assert set(layers) <= ran_before  # every layer run holds all earlier positions
        ran_before = set(layers)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 64), st.data())
def test_for_speedup_hits_target_average(L, data):
    w = data.draw(st.integers(0, max(0, L // 4)))
    target = data.draw(st.floats(1.0, max_speedup(L, w)))
    horizon = data.draw(st.integers(1, 256))
    decay = data.draw(st.sampled_from(DECAYS))
    spread = data.draw(st.floats(1.0, 2.0))
    schedule = for_speedup(target, L, horizon, warmup=w, decay=decay, spread=spread)
    assert abs(schedule.average_budget() - L / target) <= 1.0
    assert schedule.warmup == w and schedule.horizon == horizon and schedule.decay == decay


def test_full_and_known_values():
    assert Schedule.full(30).layers(100) == tuple(range(30))
    s = for_speedup(3, 30, 64, warmup=2)
    assert abs(s.average_budget() - 10) <= 0.5
    assert s.layers(0)[:2] == (0, 1) and s.layers(0)[-1] == 29
    assert for_speedup(1, 30, 64).min_budget == 30


def test_spread_sets_the_shape_at_the_same_average():
    """Spread 1 is a constant budget: at 3x every position runs 2 warm-up + 8 top layers; the default
    spread 1.5 starts at 15 and ends at 2 + 3, with the same average."""
    flat, wide = for_speedup(3, 30, 32, warmup=2, spread=1.0), for_speedup(3, 30, 32, warmup=2)
    assert [flat.budget(s) for s in range(40)] == [10] * 40
    assert (wide.max_budget, wide.min_budget) == (15, 5)
    assert abs(flat.average_budget() - wide.average_budget()) <= 0.5
    for bad in (0.5, 31, math.nan, "2", True):
        with pytest.raises(ValueError, match="spread must be a number in"):
            for_speedup(3, 30, 32, spread=bad)


BAD = [
    (dict(num_layers=0, max_budget=1, min_budget=1), "num_layers"),
    (dict(num_layers=12, max_budget=4, min_budget=6, warmup=1), r"min_budget must be an integer in \[2, 4\]"),
    (dict(num_layers=12, max_budget=6, min_budget=3, warmup=3), r"min_budget must be an integer in \[4, 6\]"),
    (dict(num_layers=12, max_budget=6, min_budget=4, warmup=6), r"max_budget must be an integer in \[7, 12\]"),
    (dict(num_layers=12, max_budget=6, min_budget=4, warmup=12), r"warmup must be an integer in \[0, 11\]"),
    (dict(num_layers=12, max_budget=13, min_budget=4), r"max_budget must be an integer in \[3, 12\]"),
    (dict(num_layers=12, max_budget=6, min_budget=4, horizon=0), r"horizon must be an integer >= 1"),
    (dict(num_layers=12, max_budget=6.5, min_budget=4), "max_budget must be an integer"),
    (dict(num_layers=12, max_budget=math.nan, min_budget=4), "max_budget must be an integer"),
    (dict(num_layers=12, max_budget=6, min_budget="4"), "min_budget must be an integer"),
    (dict(num_layers=12, max_budget=6, min_budget=4, warmup=-1), "warmup must be an integer"),
    (dict(num_layers=12, max_budget=True, min_budget=1, warmup=0), "max_budget must be an integer"),
    (dict(num_layers=12, max_budget=6, min_budget=4, decay="zigzag"), "decay must be one of linear"),
    (dict(num_layers=12, max_budget=6, min_budget=4, mode="fast"), "mode must be one of skip, early_exit"),
]


@pytest.mark.parametrize("kwargs,message", BAD)
def test_invalid_schedule_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Schedule(**kwargs)


@pytest.mark.parametrize("target,message", [
    (0.5, r"speedup must be a number in \[1, 10\]"),
    (10.5, r"speedup must be a number in \[1, 10\]"),
    (math.nan, "speedup must be a number"),
    (math.inf, "speedup must be a number"),
    ("3", "speedup must be a number"),
])
def test_invalid_speedup_raises(target, message):
    with pytest.raises(ValueError, match=message):
        for_speedup(target, 30, 64, warmup=2)


def test_integral_floats_are_accepted():
    assert Schedule(12.0, 6.0, 4.0).max_budget == 6
