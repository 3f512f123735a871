"""
Value semantics of COMPARATOR_VERSION 2, shared by every operator and oracle.

- null sorts first; ``=`` against null is false, ``IS`` is null-aware;
- numbers (int and float, one domain) by IEEE-754 totalOrder: -NaN < -inf < ... < -0.0
  < +0.0 < ... < +inf < NaN; integers beyond 2**53 keep their exact order;
- false < true;
- strings bytewise in UTF-8, which is code-point order (no collation);
- anything else (JSON arrays/objects) by its canonical JSON text;
- LIKE is case-sensitive with ``\\`` as escape; ILIKE folds ASCII only; a cell that is
  not text (null included) matches neither LIKE nor NOT LIKE.
"""

import json
import math
import re
from functools import lru_cache

COMPARATOR_VERSION = 2

_NULL, _BOOL, _NUMBER, _STRING, _OTHER = range(5)
_NULL_KEY = (_NULL,)


def _float_key(f, remainder=0):
    # IEEE-754 totalOrder with native float comparisons: NaNs beyond the infinities
    # on the side of their sign bit, and -0.0 just below +0.0.
    if f != f:
        return (_NUMBER, 1 if math.copysign(1.0, f) > 0 else -1, 0.0, 0, 0)
    if f == 0.0 and math.copysign(1.0, f) < 0:
        return (_NUMBER, 0, f, -1, 0)
    return (_NUMBER, 0, f, 0, remainder)


def sort_key(value):
    """A key whose Python ordering is the comparator's ordering of ``value``."""
    if value is None:
        return _NULL_KEY
    kind = type(value)
    if kind is int:
        as_float = float(value)
        # Beyond 2**53 the double rounds; the remainder keeps big integers exact. An
        # int is never NaN nor -0.0, so _float_key's cases reduce to this one.
        return (_NUMBER, 0, as_float, 0, value - int(as_float))
    if kind is str:
        return (_STRING, value)
    if kind is bool:
        return (_BOOL, int(value))
    if kind is float:
        return _float_key(value)
    if isinstance(value, (int, float)):  # subclasses
        return sort_key(float(value) if isinstance(value, float) else int(value))
    return (_OTHER, json.dumps(value, sort_keys=True, separators=(",", ":")))


def key_value(key):
    """
    The value a ``sort_key`` stands for, as the database compares it: the inverse of
    ``sort_key`` up to the comparator's equality (1 and 1.0 are one key; an integral
    number comes back as an int). A JSON key has no value to compare with.
    """
    kind = key[0]
    if kind == _NULL:
        return None
    if kind == _STRING:
        return key[1]
    if kind == _BOOL:
        return bool(key[1])
    if kind == _NUMBER:
        if key[1]:  # a NaN: no cell equals it
            return math.nan
        number, remainder = key[2], key[4]
        return int(number) + remainder if number.is_integer() else number
    raise ValueError("a JSON value is never a lookup key")


def reverse_sort_key(value):
    """
    A key whose Python ordering is the reverse of ``sort_key``'s: every component
    negated, so descending keys compare as plain tuples (text, which cannot be
    negated, compares through a reversing wrapper).
    """
    if type(value) is int:  # sort_key's int case, negated, without building it first
        as_float = float(value)
        return (-_NUMBER, 0, -as_float, 0, int(as_float) - value)
    key = sort_key(value)
    if key[0] >= _STRING:
        return (-key[0], _Reversed(key[1]))
    return tuple([-part for part in key])


class _Reversed:
    """Reverses the order of a text key."""

    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text

    def __lt__(self, other):
        return other.text < self.text

    def __gt__(self, other):
        return self.text < other.text

    def __eq__(self, other):
        return self.text == other.text

    def __hash__(self):
        return hash(self.text)


def compare(a, b):
    """-1, 0 or 1: the order of two values."""
    ka, kb = sort_key(a), sort_key(b)
    return (ka > kb) - (ka < kb)


def equal(a, b):
    """SQL ``=``: false when either side is null."""
    return a is not None and b is not None and sort_key(a) == sort_key(b)


# --- LIKE ---------------------------------------------------------------------------

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def fold_ascii(text):
    return text.translate(_ASCII_LOWER)


@lru_cache(maxsize=1024)
def _like_regex(pattern):
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def like(cell, pattern, *, fold=False):
    """True when text ``cell`` matches ``pattern``; False for any non-text cell."""
    if not isinstance(cell, str) or not isinstance(pattern, str):
        return False
    if fold:
        cell, pattern = fold_ascii(cell), fold_ascii(pattern)
    return _like_regex(pattern).fullmatch(cell) is not None


# --- simple predicates --------------------------------------------------------------

SIMPLE_OPS = frozenset(
    ["=", "!=", "<", "<=", ">", ">=", "IS", "IS NOT", "LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE"]
    + ["IN", "NOT IN"]
)


def matches(op, cell, literal):
    """Evaluate ``cell <op> literal`` with rindle's semantics (a bool, never null)."""
    if op == "=":  # by far the most common, so tested first
        return equal(cell, literal)
    if op == "IS":
        return sort_key(cell) == sort_key(literal)
    if op == "IS NOT":
        return sort_key(cell) != sort_key(literal)
    if op in ("LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE"):
        if not isinstance(cell, str) or not isinstance(literal, str):
            return False
        hit = like(cell, literal, fold=op.endswith("ILIKE"))
        return hit if not op.startswith("NOT") else not hit
    if cell is None:
        return False
    if op == "IN":
        return any(equal(cell, v) for v in literal)
    if op == "NOT IN":
        # As in SQL: a null in the list makes NOT IN unknown, hence false.
        return all(v is not None and not equal(cell, v) for v in literal)
    if literal is None:
        return False
    c = compare(cell, literal)
    if op == "=":
        return c == 0
    if op == "!=":
        return c != 0
    if op == "<":
        return c < 0
    if op == "<=":
        return c <= 0
    if op == ">":
        return c > 0
    if op == ">=":
        return c >= 0
    raise ValueError(f"unknown operator {op!r}")
