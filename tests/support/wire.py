"""
The wire AST (the JSON a client sends) as the tests write it, written once: plain
dicts, checked by nothing here, so a test can also spell what the parser must refuse.
``rindle_app.queries`` is the checked builder; the tests of the builder compare its
output with JSON written out in full.
"""


def column(name):
    return {"type": "column", "name": name}


def literal(value):
    return {"type": "literal", "value": value}


def parameter():
    """The right side a family template binds per instance."""
    return {"type": "parameter"}


def compare(name, op, right):
    """``name <op> right``, ``right`` an operand (``literal``, ``column``, ``parameter``)."""
    return {"type": "simple", "op": op, "left": column(name), "right": right}


def simple(name, op, value):
    """``name <op> value``, the value a literal."""
    return compare(name, op, literal(value))


def rel(parent_fields, child_fields, subquery, **extra):
    """A ``related`` entry: ``subquery`` correlated on the parent's and child's fields."""
    return {
        "correlation": {"parentField": parent_fields, "childField": child_fields},
        "subquery": subquery,
        **extra,
    }


def exists(parent_fields, child_fields, subquery, negated=False, **extra):
    """An EXISTS (``negated``: NOT EXISTS) condition over a correlated ``subquery``."""
    return {
        "type": "correlatedSubquery",
        "op": "NOT EXISTS" if negated else "EXISTS",
        "related": rel(parent_fields, child_fields, subquery, **extra),
    }
