"""Whether a value an output shows bears out a number as the answer writes it: within its
rounding, its bound ("over 1,000"), its approximation ("about 10") and its direction.

Rounding: a number grounds on an output value when that value, correctly rounded to the
answer's last digit, gives it. At an exact half both half-up (away from zero) and half-even
count ("2.2" or "2.3" for 2.25); truncation and rounding the other way do not ("3.1" for
3.15 or 3.19). A number the answer does not say is rounded (no "about", "~", "roughly",
"rounded", "to 2 decimal places") may drop only digits that leave two significant ones
("0.83" for 0.8312, not "0.05" for 0.0549); written whole ("42") it claims a whole value, so
a fractional one (41.6, 4,200.5) needs the word, unless it is a whole percentage ("39%" for
39.2%, "5%" for 4.6%: the usual form) or converted from the unit shown ("15 days" of 15 days
04:00:00). A magnitude word says the number is rounded ("2 million" for 1,999,999), but
"0.1k" is no way to write 98. A rounding word allows coarser rounding, still correct ("about
2,500" for 2,450, not for 2,374). The answer may not show more digits than the output does
("3.1600" for a printed 3.16), save cents on money ("$1,543.50" for 1543.5) and any digits
of a value printed whole.
"""

from __future__ import annotations

import math

from .quantities import DOWN, Num
from .values import CURRENCY

_UNSAID_DIGITS = 2  # the significant digits a number not said to be rounded must keep
_APPROX_SHARE = 0.05  # "about 10" may be off by its rounding but no more than 5% of it
_FRACTION_PRINTED_SHARE = 0.05
_WORD_FRACTION_SHARE = 0.1  # "about a third" holds for 0.30-0.37, not for 0.25
# A bound is a claim about size too: "over 1,000" holds for 5,000, not for 5 million.
BOUND_RANGE = 10.0


def matches(
    num: Num,
    fact: float,
    fact_step: float = 0.0,
    where: str = "",
    shown_percent: bool = False,
    *,
    loose: bool = False,
) -> bool:
    """Whether the output value `fact` (printed to `fact_step`, on the line `where`; with its
    own % sign: `shown_percent`) bears out the number as written, within its rounding.
    `loose`: within any rounding, said or not (to name why a number is refused)."""
    targets = [fact]
    if num.direction == "down" and num.value >= 0:
        # "fell by 3" is -3; a printed 3 counts only where the output calls it a fall.
        targets = [-fact, fact] if DOWN.search(where) else [-fact]
    if any(
        within(num, value, step, target, fact_step)
        and (loose or _rounding_said(num, value, step, target, fact_step))
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
            and (loose or _rounding_said(num, num.value * f, num.step * f, target, fact_step))
            for f in num.factors
            for target in targets
        )
    )


def _rounding_said(num: Num, value: float, step: float, fact: float, fact_step: float) -> bool:
    """Whether the rounding from the output's `fact` to the answer's `value` (a candidate
    within it, its last digit `step`) is one the answer may do as written (module doc)."""
    if not (math.isfinite(value) and math.isfinite(step)):
        return False
    tiny = 1e-9 * max(1.0, abs(value))
    stated = num.stated_step * step / num.step if num.step else step
    if (
        fact_step > 0
        and not num.whole
        and 0 < stated < fact_step * (1 - 1e-6)
        and not (num.unit in CURRENCY.values() and math.isclose(num.stated_step, 0.01))
    ):
        return False  # "3.1600" for a printed 3.16: digits the output does not show
    if num.bound != "exact" or num.rounded or num.truncatable or abs(fact - value) <= tiny:
        return True
    if (
        num.whole
        and not (num.percent or num.rescaled)
        and abs(fact - value) > 1e-6 * max(1.0, abs(value))
    ):
        return False  # "42" for 41.6: a whole number hides the fraction
    if value == 0 or step <= 0 or (num.whole and num.percent):
        return True  # "-0.0" for -0.001 states its rounding; "1e3" is exact; "5%" usual
    digits = math.floor(math.log10(abs(value)) + 1e-9) - round(math.log10(step)) + 1
    return digits >= _UNSAID_DIGITS


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
        if step > 0 and abs(abs(fact - value) - step / 2) <= tiny:
            # An exact half: half-up (away from zero) or half-even, never the other way.
            return abs(value) > abs(fact) or round(value / step) % 2 == 0
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
