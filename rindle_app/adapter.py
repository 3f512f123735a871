"""The extension point a host project subclasses to tell rindle about its users."""


class RindleAdapter:
    """
    Decides who may do what. Select a subclass with ``RINDLE["ADAPTER"]``.

    Every hook receives the acting Django user (``None`` or an anonymous user when
    nobody is authenticated); the user never comes from client-supplied arguments.
    """

    def authorize_mutation(self, user, name, args):
        """Return False (or raise PermissionDenied) to reject a client mutation."""
        return True

    def authorize_query(self, user, name, args):
        """Return False (or raise PermissionDenied) to refuse named query ``name``."""
        return True

    def read_rules(self, user):
        """
        Per-table read rules for ``user``: {table: condition} in the wire AST's
        condition form (see ``rindle_app.ivm.builder``). Each rule is ANDed into
        every query level over its table, so a hidden row is neither sent nor
        counted nor usable in an EXISTS. Use ``exists(..., system="permissions")``
        for a rule that needs another table (a membership, say) without syncing it.
        """
        return {}

    def authorize_sql_write(self, user, token, table):
        """
        Whether public SQL (``/v1/sql/*``) from ``user`` may write ``table``:
        ``token`` is the bearer token the request came with (None for a session).
        By default only a token listing the table in its ``tables`` may write it;
        ``_rindle_*``, ``django_*`` and ``auth_*`` tables are never writable there.
        """
        return token is not None and table in (token.tables or ())


def get_adapter():
    from .conf import rindle_settings

    return rindle_settings.ADAPTER()
