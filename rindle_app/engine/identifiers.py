"""Validation and quoting of SQL identifiers (table and column names)."""

import re

from .errors import InvalidInput

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def validate(name, what="identifier"):
    """Return ``name`` if it is a plain SQL identifier, else raise InvalidInput."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise InvalidInput(f"invalid {what}: {name!r}", code=f"invalid_{what.replace(' ', '_')}")
    return name


def quote(name):
    """Double-quote a validated identifier."""
    return '"' + validate(name) + '"'
