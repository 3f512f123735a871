"""
``POST /api/rindle/room-boot``: a room host's cold boot, as the original answers it.

A room host (the original's room shell, or any process that holds a ``rooms``
token) boots one doc: the doc's profile resolves its footprint (checked unwindowed
and against the table map), the next placement epoch is claimed FIRST (so a boot
that loses the race learns it before anything is leased), and the answer carries
the upstream lease (subscribe it on ``/ws/rindle/`` as ``_rindle/room``), the
per-table write scopes and the flush routes with the headers to present on them::

    {epoch, upstreamLeaseToken, upstreamWsEndpoint, scopes: [...],
     flush: {urls: {apply, claim, lmids}, headers: {X-Rindle-Room-Credential: ...}}}

The flush header is a credential minted for this doc and placement, not the boot
request's own bearer token (which may hold every scope): it acts as the booting
token narrowed to scope ``rooms``, this doc and this epoch on, and dies with the
token (``rindle_app.room_credentials``). A credential cannot boot again.
"""

from django.urls import NoReverseMatch, reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from .. import leases, room_credentials, rooms
from ..engine import get_engine
from ..exceptions import INVALID_QUERY, PlaneNotMounted, QueryRefused
from ..ivm.ast import QueryError, parse
from ..mount import prefix_of, ws_url
from .ingest_views import RoomView
from .serializers import ErrorResponse, StrictCharField


def _flush_urls():
    """The flush routes; ``PlaneNotMounted`` (501) when one is not mounted (rindle.E041)."""
    names = {
        "apply": "rindle-apply-txn",
        "claim": "rindle-claim-room-epoch",
        "lmids": "rindle-room-lmids",
    }
    try:
        return {key: reverse(name) for key, name in names.items()}
    except NoReverseMatch:
        raise PlaneNotMounted(
            "a room flushes through /apply-row-change-txn, and the ingest URLconf plane "
            "(rindle_app.urls.ingest) is not mounted"
        ) from None


class RoomBootRequest(serializers.Serializer):
    doc = StrictCharField(max_length=255, trim_whitespace=False)
    instance = StrictCharField(
        max_length=255,
        trim_whitespace=False,
        required=False,
        help_text="The booting host's identity, for diagnostics only.",
    )


class RoomBootResponse(serializers.Serializer):
    epoch = serializers.IntegerField()
    upstreamLeaseToken = serializers.CharField()
    upstreamWsEndpoint = serializers.CharField()
    scopes = serializers.ListField(child=serializers.DictField())
    flush = serializers.DictField()


class RoomBootView(RoomView):
    """``POST /api/rindle/room-boot {doc}``: claim the doc's epoch and lease its footprint."""

    @extend_schema(
        operation_id="rindle_room_boot",
        summary="Boot a room: claim its epoch, lease its footprint",
        request=RoomBootRequest,
        responses={
            200: RoomBootResponse,
            **{status: OpenApiResponse(ErrorResponse) for status in (400, 401, 403, 404, 501, 503)},
        },
    )
    def post(self, request):
        data = self.validated(RoomBootRequest)
        doc = data["doc"]
        profile, key = rooms.split_doc(doc)
        engine = get_engine()
        ast = rooms.footprint_for(profile, key, request.user)
        try:
            parse(ast, engine.tables)
        except QueryError as exc:
            raise QueryRefused(
                f"room profile {profile.name!r} built an invalid footprint: {exc}", INVALID_QUERY
            ) from None
        urls = _flush_urls()  # before the claim: a refusal claims nothing
        epoch = engine.claim_room_epoch(doc)
        token, _info = leases.mint(
            rooms.ROOM_QUERY_NAME, {"doc": doc}, request.user, token=request.auth
        )
        prefix = prefix_of("rindle-room-boot", "api/rindle/room-boot")
        headers = {room_credentials.HEADER: room_credentials.mint(request.auth, doc, epoch)}
        return Response(
            {
                "epoch": epoch,
                "upstreamLeaseToken": token,
                "upstreamWsEndpoint": ws_url(request, prefix, "ws/rindle/"),
                "scopes": rooms.compile_scopes(ast, set(profile.context)),
                "flush": {"urls": urls, "headers": headers},
            }
        )
