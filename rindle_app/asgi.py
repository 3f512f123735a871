"""
Public API: the ASGI applications that serve rindle's websocket.

A project's ``asgi.py`` becomes::

    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")

    from rindle_app.asgi import application as rindle_application

    application = rindle_application()

``websocket_application()`` is the websocket half alone, for a project that builds
its own ``ProtocolTypeRouter``. Both take ``prefix``: with the HTTP routes under
``path("sync/", include("rindle_app.urls"))``, ``application(prefix="sync/")`` serves
``/sync/ws/rindle/``, where rindle's answers point websocket clients.
"""


def websocket_application(prefix=""):
    """
    The websocket ASGI app: ``/ws/rindle/`` (``/<prefix>ws/rindle/``) behind
    host/origin validation and auth.

    Origins are checked against ``ALLOWED_HOSTS`` (rindle's
    ``AllowedHostsOriginValidator``: a connection with a bearer token needs no
    ``Origin``, and never brings its cookies); the user comes from the session cookie
    or the bearer token (rindle's ``AuthMiddlewareStack``, the consumer). Django is
    set up first if it is not yet.
    """
    _setup()
    from channels.routing import URLRouter

    from .realtime.auth import AuthMiddlewareStack
    from .realtime.security import AllowedHostsOriginValidator
    from .routing import websocket_urlpatterns_under

    router = URLRouter(websocket_urlpatterns_under(prefix))
    return AllowedHostsOriginValidator(AuthMiddlewareStack(router))


def application(http_app=None, *, prefix=""):
    """
    A ``ProtocolTypeRouter``: HTTP to ``http_app`` (Django's ASGI app by default),
    websockets to ``websocket_application(prefix)``.

    Django is set up first (``get_asgi_application``), then the router is built, then
    the garbage collector is tuned for a process holding many sockets
    (``rindle_app.realtime.tuning.tune_gc``): call it once, at the end of the ASGI
    module's imports.
    """
    from django.core.asgi import get_asgi_application

    if http_app is None:
        http_app = get_asgi_application()
    from channels.routing import ProtocolTypeRouter

    from .realtime.tuning import tune_gc

    _setup()
    router = ProtocolTypeRouter({"http": http_app, "websocket": websocket_application(prefix)})
    tune_gc()
    return router


def _setup():
    from django.apps import apps

    if not apps.ready:
        import django

        django.setup(set_prefix=False)
