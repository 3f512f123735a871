"""
The HTTP routes of rindle's app tier (the original's ``@rindle/api-server``) and the
client schema. Every answer carries ``Rindle-Boot-Id``: the engine's boot id, so a
client can tell that the server restarted.

Every route counts its traffic in the usage ledger (``rindle_app.flow``) under the
namespace ``RindleAdapter.namespace`` names for its caller: an answered request is
a transfer of its body bytes in (``Content-Length``) and its rendered body bytes out;
a refused one (4xx, 5xx) is a refusal by reason instead, and a 401 an auth failure.
A namespace over its quota is refused with 429 ``quota_exceeded`` before the view
runs.
"""

import hashlib
import logging

from django.db import DatabaseError
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from .. import leases, named, rooms
from ..adapter import check_anonymous_mutation, get_adapter
from ..conf import rindle_settings
from ..engine import InvalidInput, RindleError, Unavailable, get_engine
from ..engine.mutations import principal_key, validate_envelope
from ..engine.writer import is_infrastructure_error
from ..exceptions import UNKNOWN_QUERY, UNSUPPORTED
from ..flow import quota
from ..ivm.ast import QueryError, parse, query_key
from ..runtime import get_runtime
from ..stream.reader import read_query
from . import serializers as s
from .errors import exception_handler
from .parsers import StrictJSONParser
from .permissions import IsAuthenticatedWithScope, TokenHasScope

BOOT_ID_HEADER = "Rindle-Boot-Id"
SYSTEM_PREFIX = "_rindle/"

logger = logging.getLogger("rindle.api")


def _errors(*statuses):
    return {status: OpenApiResponse(s.ErrorResponse) for status in statuses}


class FlowMeteredMixin:
    """
    Counts a DRF view's requests in the usage ledger and checks the caller's quota.

    After authentication and the permission checks, and before the handler, a
    namespace over its quota is refused (429 ``quota_exceeded`` with
    ``Retry-After``): nothing is done. Once the response is rendered it is counted:
    a 2xx or 3xx as a transfer, a 401 as an auth failure under the namespace of
    nobody, any other status as a refusal by reason (``flow.quota.refusal_for``).
    """

    _flow_meter = None

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        self._flow_meter = request_meter(request)
        self._flow_meter.check()

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        meter = self._flow_meter
        if hasattr(response, "add_post_render_callback"):
            response.add_post_render_callback(lambda rendered: _count(request, rendered, meter))
        else:
            _count(request, response, meter)
        return response


def request_meter(request, refused=False):
    """
    The ``flow.quota.Meter`` of a DRF request's caller; ``refused``: its credentials
    were refused, so it counts under the namespace of nobody. Reads the
    authentication DRF already did, never authenticates again.
    """
    from ..models import RindleToken
    from ..room_credentials import RoomCredential

    if refused:
        return quota.meter(get_adapter().namespace(None, None))
    user = request.__dict__.get("_user")
    token = request.__dict__.get("_auth")
    if isinstance(token, RoomCredential):  # a room flush credential counts as its token
        token = token.token
    token = token if isinstance(token, RindleToken) else None
    namespace = get_adapter().namespace(user, token)
    if token is not None:
        session = f"token:{token.prefix}"
    else:
        key = getattr(getattr(request._request, "session", None), "session_key", None)
        session = f"session:{hashlib.sha256(key.encode()).hexdigest()[:16]}" if key else None
    return quota.meter(namespace, session)


def _count(request, response, meter):
    try:
        status = response.status_code
        if status == 401:
            request_meter(request, refused=True).auth_failure()
            return
        meter = meter or request_meter(request)
        if status < 400 and getattr(response, "streaming", False):
            return  # a streaming view counts its bytes as it sends them (stream_views)
        if status < 400:
            try:
                bytes_in = max(0, int(request.META.get("CONTENT_LENGTH") or 0))
            except ValueError:
                bytes_in = 0
            meter.transfer(bytes_in=bytes_in, bytes_out=len(response.content))
            return
        data = getattr(response, "data", None)
        error = data.get("error") if isinstance(data, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        meter.refuse(quota.refusal_for(code if isinstance(code, str) else None, status))
    except Exception:
        logger.exception("rindle api: counting a request in the usage ledger failed")


class RindleSchema(AutoSchema):
    """Documents the 429 ``quota_exceeded`` every metered route may answer."""

    def get_operation(self, *args, **kwargs):
        operation = super().get_operation(*args, **kwargs)
        responses = (operation or {}).get("responses")
        if not responses or "429" in responses:
            return operation
        # The route's own error body (the SQL routes' envelope is richer).
        error = next(
            (
                responses[c]
                for c in ("400", "401", "403", "503")
                if "content" in responses.get(c, {})
            ),
            None,
        )
        if error is not None:
            responses["429"] = {
                "description": "The caller's namespace moved its quota of bytes "
                "(`quota_exceeded`, retryable); nothing was done.",
                "headers": {
                    "Retry-After": {
                        "schema": {"type": "integer"},
                        "description": "Seconds until enough of the window has passed.",
                    }
                },
                "content": error["content"],
            }
        return operation


class RindleView(FlowMeteredMixin, APIView):
    """
    JSON in, JSON out, errors in one shape, the boot id on every answer, and the
    caller's traffic counted in the usage ledger (``FlowMeteredMixin``).
    """

    parser_classes = [StrictJSONParser]
    renderer_classes = [JSONRenderer]
    permission_classes = [TokenHasScope]
    required_scope = None
    schema = RindleSchema()

    def get_permissions(self):
        # The project's REST_FRAMEWORK["DEFAULT_PERMISSION_CLASSES"] guard rindle's
        # routes too: a request must pass them and the route's own (token scopes).
        classes = [*api_settings.DEFAULT_PERMISSION_CLASSES, *self.permission_classes]
        return [permission() for permission in dict.fromkeys(classes)]

    def get_exception_handler(self):
        return exception_handler

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        try:
            response[BOOT_ID_HEADER] = get_engine().boot_id
        except (RindleError, DatabaseError):
            pass  # no engine could start: the response already says why
        return response

    def validated(self, serializer_class):
        serializer = serializer_class(data=self.request.data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


def resolve(name, args, user, client_id=None):
    """(engine, parsed query) of named query ``name`` for ``user``."""
    if name.startswith(SYSTEM_PREFIX):
        # System queries are subscribed over the websocket after init, never leased.
        raise named.QueryRefused(f"unknown query {name!r}", UNKNOWN_QUERY)
    engine = get_engine()
    ast = named.resolve(name, args, user, client_id=client_id)
    return engine, parse(ast, engine.tables)


class QueryView(RindleView):
    """``POST /api/rindle/query``: a lease on a named query, to subscribe with."""

    required_scope = "read"

    @extend_schema(
        operation_id="rindle_query_lease",
        summary="Lease a named query",
        request=s.QueryRequest,
        responses={200: s.LeaseResponse, **_errors(400, 401, 403, 404)},
    )
    def post(self, request):
        data = self.validated(s.QueryRequest)
        name, args, client_id = data["name"], data["args"], data["clientId"]
        engine, query = resolve(name, args, request.user, client_id)
        token, info = leases.mint(name, args, request.user, client_id, token=request.auth)
        body = {"leaseToken": token, "queryKey": query_key(query), "expiresAt": info["expiresAt"]}
        body.update(lifecycle_block(request, engine, name, args, client_id))
        return Response(body)


def lifecycle_block(request, engine, name, args, client_id):
    """
    The additions to a realtime-labelled query's lease, after writing the caller's
    occupancy row: ``lifecycle`` (the doorbell; with a room, the fence streams too)
    and, once ``ROOM_MIN_SESSIONS`` sessions share the doc on a server hosting rooms,
    ``realtime`` (the room to serve it from). Empty when unlabelled or the lifecycle
    is off. It fails open: a lease is never refused for them (logged instead).
    """
    if not rindle_settings.REALTIME_LIFECYCLE:
        return {}
    user, auth = request.user, request.auth
    try:
        doc = named.realtime_doc(name, args)
        if doc is None:
            return {}
        others, lingering, shared = rooms.touch_session(engine, doc, client_id)
        parent = {"name": name, "args": args}

        def entry(table, **identity):
            lease_args = {"table": table, **identity, "parent": parent}
            token, _info = leases.mint(
                rooms.LIFECYCLE_QUERY_NAME, lease_args, user, client_id, token=auth
            )
            return {"table": table, "leaseToken": token, **identity}

        out = {"lifecycle": {"doorbell": entry(rooms.SCOPE_SESSIONS, scope=doc)}}
        if not rindle_settings.ROOMS_ENABLED:
            return out
        sessions = others + (1 if client_id else 0)
        if sessions >= int(rindle_settings.ROOM_MIN_SESSIONS) or lingering:
            out["realtime"] = rooms.realtime_block(request, name, args, doc, user, client_id, auth)
        elif shared:
            # The room's other sessions are gone past the grace: drain it, and fence the
            # downgrade on its last committed flush (the ghost holds until it is seen).
            final = get_runtime(None).rooms.drain(doc)
            out["realtimeFence"] = {"sourceKey": f"room:{doc}", "doc": doc, "finalFlushSeq": final}
        else:
            return out
        fence = [entry(rooms.ROOM_WATERMARK, doc=doc)]
        mine = {"clientId": client_id} if client_id else {}
        fence += [entry(t, doc=doc, **mine) for t in (rooms.ROOM_LEDGER, rooms.ROOM_OUTCOMES)]
        out["lifecycle"]["fence"] = fence
        return out
    except (RindleError, DatabaseError):
        logger.warning("rindle: the lifecycle streams of %r were not minted", name, exc_info=True)
        return {}


class FollowsSchema:
    """
    A route that reads the table map (``/schema``, the SSR reads): before it runs, the
    engine re-reads what another process's migration changed, when no live queries
    of this process follow the outbox (``Engine.follow_schema``).
    """

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        try:
            get_engine().follow_schema()
        except (RindleError, DatabaseError):  # the route answers from what it has
            logger.warning("rindle: following the schema failed", exc_info=True)


class ReadView(FollowsSchema, RindleView):
    """
    ``POST /api/rindle/read``: a named query's rows once, with the outbox version
    they reflect (``cvMin``), for server-side rendering. It subscribes nothing.
    """

    required_scope = "read"

    @extend_schema(
        operation_id="rindle_read",
        summary="Read a named query once",
        request=s.ReadRequest,
        responses={200: s.ReadResponse, **_errors(400, 401, 403, 404, 503)},
    )
    def post(self, request):
        data = self.validated(s.ReadRequest)
        engine, query = resolve(data["name"], data["args"], request.user)
        # A named query's definition is the server's: an aggregate there is its bug.
        return Response(read_once(engine, query, refusal=QueryError))


def read_once(engine, query, *, refusal):
    """
    ``{rows, cvMin, queryKey}`` of ``query`` read once (the SSR read of ``/read`` and
    the daemon's ``/query``). A root aggregate has no rows: ``refusal`` (the error
    class of whoever is at fault) says so. The clients' SSR store maps over rows,
    so a one-query is 0 or 1 rows, not an object.
    """
    if query.aggregate is not None:
        raise refusal("a root aggregate has no rows to read", code=UNSUPPORTED)
    try:
        cv, view = read_query(engine.using, query, engine.tables)
    except DatabaseError as exc:
        if is_infrastructure_error(exc):
            raise Unavailable(f"the database is unavailable: {exc}") from exc
        raise
    if query.one:
        view = [] if view is None else [view]
    return {"rows": view, "cvMin": cv, "queryKey": query_key(query)}


class MutateView(RindleView):
    """
    ``POST /api/rindle/mutate``: client mutations, applied strictly in order.

    ``{"envelope": {...}}`` answers one outcome; ``{"envelopes": [...]}`` a list of
    them, in order. A malformed body applies nothing. A mid gap stops the batch with
    409 and the stored lmid; a client id owned by another principal with 403
    ``client_id_taken``; a database failure with a retryable 503. Envelopes before
    the stopping one were applied: retrying the same batch is safe, since a mid at or
    below the lmid is absorbed. A body failing validation is 400 ``invalid_request``
    with DRF's field errors as ``error.details``; a rejected mutation (its arguments
    failing validation included) is a 200 outcome, since its mid is consumed, with
    the field errors as ``details``. An applied outcome carries the mutator's return
    value as ``result``.
    """

    required_scope = "mutate"

    @extend_schema(
        operation_id="rindle_mutate",
        summary="Apply client mutations",
        request=s.MutateRequest,
        responses={
            200: OpenApiResponse(
                s.MutationOutcome(many=True),
                description="One outcome per envelope (a single object for `envelope`).",
            ),
            **_errors(400, 401, 403, 409, 503),
        },
    )
    def post(self, request):
        check_anonymous_mutation(request.user)
        data = self.validated(s.MutateRequest)
        single = "envelope" in data
        envelopes = [data["envelope"]] if single else data["envelopes"]
        limit = int(rindle_settings.MAX_MUTATIONS_PER_REQUEST)
        if not 1 <= len(envelopes) <= limit:
            raise InvalidInput(f"send 1 to {limit} envelopes, not {len(envelopes)}")
        for i, e in enumerate(envelopes):
            try:
                validate_envelope(e["clientID"], e["mid"], e["name"], e["args"])
            except InvalidInput as exc:
                raise InvalidInput(f"envelopes[{i}]: {exc.message}", code=exc.code) from None
        engine = get_engine()
        owner = _principal(request)
        outcomes = []
        for e in envelopes:
            result = engine.mutate(
                e["clientID"],
                e["mid"],
                e["name"],
                e["args"],
                request.user,
                owner=owner,
                request=request,
            )
            outcomes.append(_outcome(result))
        return Response(outcomes[0] if single else outcomes)


def _principal(request):
    """The principal key a request's client ids are bound to (as a socket's)."""
    from ..models import RindleToken

    token = request.auth if isinstance(request.auth, RindleToken) else None
    session = getattr(request, "session", None)
    return principal_key(request.user, token, getattr(session, "session_key", None))


def _outcome(result):
    if result.accepted:
        out = {"accepted": True, "rejected": False, "lmid": result.lmid, "cv": result.cv}
        if result.status == "absorbed":
            out["duplicate"] = True
        if result.result is not None:
            out["result"] = result.result
        return out
    out = {
        "accepted": False,
        "rejected": True,
        "reason": result.reason,
        "code": result.code,
        "lmid": result.lmid,
        "cv": result.cv,
    }
    if result.details is not None:
        out["details"] = result.details
    return out


class SchemaView(FollowsSchema, RindleView):
    """
    ``GET /schema``: the tables clients may query, sorted by name, bookkeeping tables
    left out. Open to any signed-in user and to tokens with the ``schema`` scope.
    """

    permission_classes = [IsAuthenticatedWithScope]
    required_scope = "schema"

    @extend_schema(
        operation_id="rindle_schema",
        summary="The client schema",
        responses={200: s.SchemaResponse, **_errors(401, 403)},
    )
    def get(self, request):
        return Response({"tables": get_engine().base_table_schemas()})
