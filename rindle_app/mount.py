"""
Where rindle's routes are mounted: the prefix ``include("rindle_app.urls")`` was given.

The websocket URLs rindle hands out (a room-served lease's ``realtime.wsEndpoint``,
``room-boot``'s ``upstreamWsEndpoint``) sit under the same prefix as the HTTP route
that answers, so the websocket routes are mounted under it too
(``rindle_app.asgi.application(prefix="sync/")``).
"""

from django.urls import NoReverseMatch, get_script_prefix, reverse


def prefix_of(name, route):
    """
    The path prefix (``"/"`` at the root, ``"/sync/"`` under ``sync/``) of the URL
    named ``name``, whose own route is ``route`` (``"api/rindle/query"``).
    """
    try:
        url = reverse(name)
    except NoReverseMatch:
        return get_script_prefix()
    return url[: -len(route)] if url.endswith(route) else get_script_prefix()


def ws_url(request, prefix, path):
    """The absolute websocket URL of ``path`` (``"ws/rindle/"``) under ``prefix``."""
    scheme = "wss" if request.is_secure() else "ws"
    return f"{scheme}://{request.get_host()}{prefix}{path}"
