"""Whether a value an output shows bears out a number as the answer writes it: within its
rounding, its bound ("over 1,000"), its approximation ("about 10") and its direction."""

from __future__ import annotations

import math

from .quantities import DOWN, Num

_APPROX_SHARE = 0.05  # "about 10" may be off by its rounding but no more than 5% of it
_FRACTION_PRINTED_SHARE = 0.05
_WORD_FRACTION_SHARE = 0.1  # "about a third" holds for 0.30-0.37, not for 0.25
# A bound is a claim about size too: "over 1,000" holds for 5,000, not for 5 million.
BOUND_RANGE = 10.0


def matches(
    num: Num, fact: float, fact_step: float = 0.0, where: str = "", shown_percent: bool = False
) -> bool:
    """Whether the output value `fact` (printed to `fact_step`, on the line `where`; with its
    own % sign: `shown_percent`) bears out the number as written, within its rounding."""
    targets = [fact]
    if num.direction == "down" and num.value >= 0:
        # "fell by 3" is -3; a printed 3 counts only where the output calls it a fall.
        targets = [-fact, fact] if DOWN.search(where) else [-fact]
    if any(
        within(num, value, step, target, fact_step)
        for value, step in num.candidates()
        for target in targets
    ):
        return True
    # "50%" for a printed 50 only when that number is itself a percentage ("50%"): a %
    # elsewhere on its line ("25%    85.0", a quantile's label) says nothing of it.
    return (
        num.percent
        and shown_percent
        and any(
            within(num, num.value * f, num.step * f, target, fact_step)
            for f in num.factors
            for target in targets
        )
    )


def within(num: Num, value: float, step: float, fact: float, fact_step: float = 0.0) -> bool:
    tiny = 1e-9 * max(1.0, abs(value))
    if value == 0 and math.copysign(1.0, value) < 0 < math.copysign(1.0, fact):
        return False  # "-0" is a negative value rounded: a printed 0.4 or 0.0 is not one
    if num.literal or (num.bound == "nearly" and fact > value + tiny):
        return False  # "nearly 1000" is short of it
    if num.bound in ("above", "below"):
        sign = 1 if num.bound == "above" else -1
        margin = (fact - value) * sign
        if margin < -tiny or (num.strict and margin <= tiny):
            return False
        if value <= 0:
            return True
        # "fewer than 10 errors" holds for none.
        return fact <= value * BOUND_RANGE if sign > 0 else fact >= value / BOUND_RANGE or fact == 0
    # An exact fraction ("two thirds") names any value a printed decimal of two significant
    # digits or more may stand for (0.6667, not 0.3); a written decimal may not be finer.
    if (
        step == 0
        and num.bound in ("approx", "nearly")
        and 0 < value < 1
        and any(c.isalpha() for c in num.text)
    ):
        # "about a third" for 30.7%: a fraction in words is a coarse word, not 0.3333.
        return abs(fact - value) <= _WORD_FRACTION_SHARE * value + tiny
    rounded = step == 0 and fact_step <= _FRACTION_PRINTED_SHARE * abs(fact)
    slack = step / 2 + (fact_step / 2 if rounded else 0.0) + tiny
    if abs(fact - value) <= slack:
        # "about 10" rounds 6 to one digit, but is not a fair word for it.
        stated = num.stated_step * step / num.step if num.step else step
        return (
            num.bound not in ("approx", "nearly")
            or abs(fact - value) <= _APPROX_SHARE * abs(value) + tiny
            or abs(fact - value) <= stated / 2 + tiny
        )
    # Truncated, as the answer says ("3.1415, truncated" for 3.14159): the stated digits.
    return (
        num.bound == "exact"
        and num.truncatable
        and step > 0
        and abs(math.trunc(fact / step) * step - value) <= tiny
    )
