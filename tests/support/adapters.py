"""
The adapters the tests select with ``RINDLE["ADAPTER"]`` (by dotted path, so a
served child process can load them too): refusals, read rules and broken hooks.
"""

from django.core.exceptions import PermissionDenied

from rindle_app.adapter import RindleAdapter
from rindle_app.ivm.builder import cond

# The comment body the judges' read rule hides (HideComments).
HIDDEN_BODY = "hidden"
HIDDEN_COMMENTS = {"comment": cond("body", "!=", HIDDEN_BODY)}


class Refusing(RindleAdapter):
    """Refuses issueDetail, raises for users, refuses every mutation."""

    def authorize_query(self, user, name, args):
        if name == "users":
            raise PermissionDenied("no user directory for you")
        return name != "issueDetail"

    def authorize_mutation(self, user, name, args):
        return False


class HidesDone(RindleAdapter):
    """Nobody may read an issue whose status is done."""

    def read_rules(self, user):
        return {"issue": cond("status", "!=", "done")}


class HidesSecrets(RindleAdapter):
    """Nobody may read an issue whose title, or a comment whose body, starts with "secret"."""

    def read_rules(self, user):
        return {
            "issue": cond("title", "NOT LIKE", "secret%"),
            "comment": cond("body", "NOT LIKE", "secret%"),
        }


class HideComments(RindleAdapter):
    """Nobody reads a comment whose body is ``HIDDEN_BODY``: not in a list, not in a count."""

    def read_rules(self, user):
        return HIDDEN_COMMENTS


class NoUsersQuery(RindleAdapter):
    def authorize_query(self, user, name, args):
        return name != "users"


class BrokenReadRules(RindleAdapter):
    def read_rules(self, user):
        raise RuntimeError("the read rules are broken")


class BrokenMutations(RindleAdapter):
    def authorize_mutation(self, user, name, args):
        raise RuntimeError("authorize_mutation is broken")
