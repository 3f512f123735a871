"""Bearer-token authentication for DRF: ``Authorization: Bearer rdl_...``."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from .. import room_credentials, tokens


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """
    Authenticates a request carrying ``Authorization: Bearer <token>`` with a
    ``RindleToken`` (see ``rindle_app.tokens``); ``request.auth`` is the token. A
    request without the header is left to the next authentication class; a header
    with an unknown, revoked or expired token is refused (401). Token requests are
    exempt from CSRF, which protects cookies, not headers a page cannot set.
    """

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        try:
            raw = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Malformed bearer token.") from None
        found = tokens.authenticate(raw)
        if found is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        return found

    def authenticate_header(self, request):
        return f'{self.keyword} realm="rindle"'


class RoomCredentialAuthentication(authentication.BaseAuthentication):
    """
    Authenticates a room flush route by ``X-Rindle-Room-Credential``, the credential
    ``/room-boot`` handed out (``rindle_app.room_credentials``); ``request.auth`` is
    its ``RoomCredential``. Without the header the next class decides; a credential
    that does not hold is refused (401). Only the flush routes install it.
    """

    def authenticate(self, request):
        value = request.META.get("HTTP_X_RINDLE_ROOM_CREDENTIAL")
        if value is None:
            return None
        try:
            credential = room_credentials.verify(value)
        except room_credentials.Refused as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        return credential.token.user, credential

    def authenticate_header(self, request):
        return 'RoomCredential realm="rindle"'


class RoomCredentialScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI document describes ``RoomCredentialAuthentication``."""

    target_class = RoomCredentialAuthentication
    name = "rindleRoomCredential"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": room_credentials.HEADER,
            "description": "The flush credential of a `/api/rindle/room-boot` answer.",
        }


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI document describes ``BearerTokenAuthentication``."""

    target_class = BearerTokenAuthentication
    name = "rindleToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from `manage.py rindle_token_create`: rdl_<prefix>_<secret>.",
        }
