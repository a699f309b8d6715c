"""bench/ab.py's paired ratios: each round's B over the A measured beside it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _ab() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_ab", BENCH / "ab.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paired_ratios_divide_out_what_the_machine_did_in_each_round() -> None:
    # B costs 10% more than A in every round, while the machine's speed halves and doubles
    # between rounds: the sides' medians alone would not say 1.1.
    a = [4.0, 8.0, 16.0, 4.5, 9.0]
    b = [x * 1.1 for x in a]
    low, mid, high = _ab().paired_ratios(a, b)
    assert low == pytest.approx(1.1) and mid == pytest.approx(1.1) and high == pytest.approx(1.1)
    assert _ab().paired_ratios([1.0, 2.0, 4.0], [0.9, 2.4, 4.0]) == pytest.approx((0.9, 1.0, 1.2))


@pytest.mark.parametrize(("a", "b"), [([], []), ([1.0, 2.0], [1.0])])
def test_paired_ratios_refuse_sides_of_unequal_rounds(a: list[float], b: list[float]) -> None:
    with pytest.raises(ValueError, match="as many rounds on each side"):
        _ab().paired_ratios(a, b)
