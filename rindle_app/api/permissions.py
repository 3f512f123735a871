"""DRF permissions of rindle's routes: token scopes."""

from rest_framework.permissions import BasePermission

from ..exceptions import INSUFFICIENT_SCOPE
from ..models import RindleToken
from ..room_credentials import RoomCredential
from ..tokens import SCOPES


class TokenHasScope(BasePermission):
    """
    A request authenticated by a ``RindleToken`` must hold the view's
    ``required_scope`` (``"admin"`` holds every scope). Other requests (a session, or
    none) are not scope-limited: the adapter decides what their user may do.
    """

    message = "This token lacks the scope this route needs."
    code = INSUFFICIENT_SCOPE

    def has_permission(self, request, view):
        token = request.auth
        if not isinstance(token, RindleToken):
            return True
        scope = getattr(view, "required_scope", None)
        return scope is None or token.has_scope(scope)


class IsAuthenticatedWithScope(TokenHasScope):
    """``TokenHasScope``, and anonymous requests are refused."""

    message = TokenHasScope.message

    def has_permission(self, request, view):
        user = request.user
        if user is None or not user.is_authenticated:
            return False
        return super().has_permission(request, view)


class TokenWithScope(TokenHasScope):
    """
    Machine routes: only a ``RindleToken`` holding the view's scope gets in, or on
    the room flush routes (which alone authenticate it) a ``RoomCredential``, whose
    one scope is ``rooms``.
    """

    message = "This route takes a bearer token with the scope it needs."

    def has_permission(self, request, view):
        auth = request.auth
        if isinstance(auth, RoomCredential):
            scope = getattr(view, "required_scope", None)
            return scope is None or auth.has_scope(scope)
        if not isinstance(auth, RindleToken):
            return False
        return super().has_permission(request, view)


def requires_scope(scope):
    """
    A permission class for a host project's own DRF views: token requests need
    ``scope``, other requests pass (``permission_classes = [requires_scope("read")]``).
    """
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; scopes are {SCOPES}")

    class RequiresScope(TokenHasScope):
        def has_permission(self, request, view):
            token = request.auth
            return not isinstance(token, RindleToken) or token.has_scope(scope)

    RequiresScope.__name__ = RequiresScope.__qualname__ = f"RequiresScope_{scope}"
    return RequiresScope
