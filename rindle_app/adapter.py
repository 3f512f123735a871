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

    def allow_anonymous_mutations(self):
        """
        Whether client mutations from nobody (no session user, no token) reach the
        mutators at all: ``RINDLE["ALLOW_ANONYMOUS_MUTATIONS"]`` (default False).
        Refused ones get ``anonymous_mutations_disabled``, over HTTP and websocket.
        """
        from .conf import rindle_settings

        return bool(rindle_settings.ALLOW_ANONYMOUS_MUTATIONS)

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

    def namespace(self, user, token=None):
        """
        The namespace (tenant) a request or a websocket counts under in the usage
        ledger (``rindle_app.flow``) and whose quota it draws on.

        ``token`` is the bearer token the caller authenticated with (None for a
        session or nobody); ``user`` is its user, or the session's, or ``None``/an
        anonymous user. It is also called with ``(None, None)`` for a caller whose
        credentials were refused, to name where its auth failure is counted. By
        default a token counts under its user, a signed-in user as
        ``"user:<pk>"``, everyone else as ``"anonymous"`` (one shared namespace).

        Return a short printable string (at most 200 characters), the same for
        every call about the same tenant. Keep the number of namespaces low, a
        tenant, an organisation or a plan, never a request or a socket: the ledger
        keeps a counter slot per namespace in every process and a quota reads the
        store once per namespace per process. It is called once per HTTP request
        and once per websocket (in a worker thread): it may query the database,
        but it should be cheap.
        """
        if token is not None:
            return f"user:{token.user_id}"
        if user is not None and getattr(user, "is_authenticated", False):
            return f"user:{user.pk}"
        return "anonymous"


def get_adapter():
    from .conf import rindle_settings

    return rindle_settings.ADAPTER()


def check_anonymous_mutation(user):
    """Raise ``AnonymousMutationsDisabled`` for a mutation from nobody, unless opted in."""
    if user is not None and getattr(user, "is_authenticated", False):
        return
    if not get_adapter().allow_anonymous_mutations():
        from .engine.errors import AnonymousMutationsDisabled

        raise AnonymousMutationsDisabled(
            "anonymous client mutations are disabled here; sign in or use a token "
            "(a host project opts in with RINDLE['ALLOW_ANONYMOUS_MUTATIONS'])"
        )
