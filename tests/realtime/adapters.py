"""Adapters the realtime tests select with RINDLE["ADAPTER"]."""

from rindle_app.adapter import RindleAdapter
from rindle_app.ivm.builder import cond


class HidesSecrets(RindleAdapter):
    """Nobody may read an issue whose title, or a comment whose body, starts with "secret"."""

    def read_rules(self, user):
        return {
            "issue": cond("title", "NOT LIKE", "secret%"),
            "comment": cond("body", "NOT LIKE", "secret%"),
        }


class NoUsersQuery(RindleAdapter):
    def authorize_query(self, user, name, args):
        return name != "users"


class BrokenReadRules(RindleAdapter):
    def read_rules(self, user):
        raise RuntimeError("the read rules are broken")


class BrokenMutations(RindleAdapter):
    def authorize_mutation(self, user, name, args):
        raise RuntimeError("authorize_mutation is broken")
