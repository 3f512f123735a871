"""A project whose adapter hides some comments: the judge of permission-compiled counts."""

from rindle_app.adapter import RindleAdapter

HIDDEN_BODY = "hidden"
RULES = {
    "comment": {
        "type": "simple",
        "op": "!=",
        "left": {"type": "column", "name": "body"},
        "right": {"type": "literal", "value": HIDDEN_BODY},
    }
}


class HideComments(RindleAdapter):
    """Nobody reads a comment whose body is ``HIDDEN_BODY``: not in a list, not in a count."""

    def read_rules(self, user):
        return RULES
