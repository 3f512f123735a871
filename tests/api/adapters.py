"""Adapters the API tests install with override_settings(RINDLE=...)."""

from django.core.exceptions import PermissionDenied

from rindle_app.adapter import RindleAdapter


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
        return {
            "issue": {
                "type": "simple",
                "op": "!=",
                "left": {"type": "column", "name": "status"},
                "right": {"type": "literal", "value": "done"},
            }
        }
