"""The link shape of ``netem_delay`` (devkit/netem.py): holds within delay ± jitter, loses its share,
refuses shapes netem would refuse."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trimtab.devkit.netem import Shape


@given(
    delay=st.floats(0, 5000),
    jitter_frac=st.floats(0, 1),
    loss=st.floats(0, 0.99),
    seed=st.integers(0, 2**32),
)
def test_every_packet_is_held_within_delay_plus_or_minus_jitter_or_lost(
    delay: float, jitter_frac: float, loss: float, seed: int
) -> None:
    shape = Shape(delay, delay * jitter_frac, loss)
    rng = random.Random(seed)
    for _ in range(50):
        hold = shape.hold_s(rng)
        if hold is not None:
            assert (delay - shape.jitter_ms) / 1000 - 1e-9 <= hold <= (delay + shape.jitter_ms) / 1000 + 1e-9


def test_loss_is_its_share_and_no_loss_loses_nothing() -> None:
    rng = random.Random(7)
    lost = sum(Shape(200, 100, 0.05).hold_s(rng) is None for _ in range(20_000))
    assert 800 <= lost <= 1200  # 1 000 expected, sd 31
    assert all(Shape(200, 100, 0).hold_s(rng) is not None for _ in range(1000))


@pytest.mark.parametrize(
    ("delay", "jitter", "loss"),
    [(-1, 0, 0), (100, 101, 0), (100, 0, 1.0), (100, 0, -0.1), (61_000, 0, 0), (float("nan"), 0, 0)],
)
def test_nonsense_shapes_are_refused(delay: float, jitter: float, loss: float) -> None:
    with pytest.raises(ValueError, match="need"):
        Shape(delay, jitter, loss)
