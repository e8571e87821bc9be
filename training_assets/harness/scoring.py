"""Strict answer scoring: the whole answer must be the expected one, read the way its kind says.

    score("12.", "12")                      # True: a trailing period is not part of a number
    score("3", "53 - 50")                   # False: never a substring match
    score("3.1069 miles", "3.1069", units=["mi", "mile", "miles"])  # True: the task's unit may follow
    score("apple, Fig, pear", "apple, fig, pear")                    # True: items compared one by one

The expected answer's form decides the comparison: a number (compared as a number, relative
tolerance ``REL_TOL``), a comma-separated list (compared item by item, in order, each item
normalised), or text (compared whole, case and whitespace normalised). The feasibility run scored
"contains the expected string" and let "3" match "53 - 50": nothing here searches inside an answer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

REL_TOL = 1e-6
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")


def _trimmed(text: str) -> str:
    """Surrounding whitespace and one trailing period dropped, inner whitespace collapsed."""
    text = " ".join(str(text).split())
    return text[:-1].rstrip() if text.endswith(".") else text


def parse_number(text: str, units: Sequence[str] = ()) -> float | None:
    """The number ``text`` is, whole (an optional trailing unit from ``units`` allowed), else None.

    >>> parse_number("1,250.5 km", ["km"]), parse_number("53 - 50"), parse_number("12.")
    (1250.5, None, 12.0)
    """
    text = _trimmed(text)
    for unit in sorted(units, key=len, reverse=True):  # "degrees celsius" before "c"
        if len(text) > len(unit) and text.casefold().endswith(unit.casefold()):
            head = text[: -len(unit)].strip()
            if _NUMBER.match(head) or _THOUSANDS.match(head):  # "12 km", "12km", "1,200 m"
                text = head
                break
    text = text.strip()
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    if not _NUMBER.match(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def numbers_equal(a: float, b: float, rel_tol: float = REL_TOL) -> bool:
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=0.0)


def _items(text: str) -> list[str]:
    text = _trimmed(text)
    if text.startswith("[") and text.endswith("]"):  # a list written as a list: ["a", "b"] or [a, b]
        text = text[1:-1]
    return [_normal_item(item) for item in text.split(",")]


def _normal_item(item: str) -> str:
    return " ".join(item.strip().strip("'\"").split()).casefold()


def _items_equal(answer: list[str], expected: list[str]) -> bool:
    if len(answer) != len(expected):
        return False
    for got, want in zip(answer, expected, strict=True):
        got_n, want_n = parse_number(got), parse_number(want)
        if want_n is not None:
            if got_n is None or not numbers_equal(got_n, want_n):
                return False
        elif got != want:
            return False
    return True


def answer_kind(expected: str) -> str:
    """``number``, ``list`` or ``text``: how an answer to ``expected`` is compared."""
    if parse_number(expected) is not None:
        return "number"
    return "list" if "," in expected else "text"


def score(answer: str | None, expected: str, *, units: Sequence[str] = ()) -> bool:
    """Whether ``answer`` is ``expected``, strictly (see the module docstring); None never scores."""
    if answer is None:
        return False
    kind = answer_kind(expected)
    if kind == "number":
        got = parse_number(answer, units)
        return got is not None and numbers_equal(got, parse_number(expected))
    if kind == "list":
        return _items_equal(_items(answer), _items(expected))
    return _normal_item(_trimmed(answer)) == _normal_item(_trimmed(expected))
