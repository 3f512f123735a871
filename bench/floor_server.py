"""
The server side of bench/floor.py: Django settings, a URL route and the ASGI
application, in one module so it can be copied into the baseline's worktree.

``DJANGO_SETTINGS_MODULE=bench.floor_server`` is the project's settings plus one
route, ``POST /floor/write?n=N[&cv=1]``: an ORM ``update()`` of the newest issue's
title (a row ``issuesPage`` shows) in ``transaction.atomic()``, answered with the
outbox's high-water read inside the transaction (with ``cv=1``) and the
``time.monotonic()`` of the commit (the transaction's first ``on_commit`` callback,
so before anything rindle runs after the commit). With ``FLOOR_PLAIN=1`` rindle is
not installed and the application is Django's own: the plain-Django side of the
CPU comparison (its database has no capture triggers).
"""

import functools
import os
import time

from project.settings import *  # noqa: F403

PLAIN = os.environ.get("FLOOR_PLAIN") == "1"
if PLAIN:
    INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "rindle_app"]  # noqa: F405
ROOT_URLCONF = "bench.floor_server"
OUTBOX = "_rindle_change_events"


def orm_write(n, with_cv):
    """One ORM write of the newest issue's title; (cv or None, commit time)."""
    from django.db import connection, transaction

    from project.demo.models import Issue

    stamp = []
    with transaction.atomic():
        transaction.on_commit(lambda: stamp.append(time.monotonic()))
        Issue.objects.filter(id=_target()).update(title=f"floor {n}")
        cv = None
        if with_cv:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT MAX(seq) FROM {OUTBOX}")
                cv = cursor.fetchone()[0]
    return cv, stamp[0]


@functools.cache
def _target():
    from project.demo.models import Issue

    return Issue.objects.order_by("-created_at", "id").values_list("id", flat=True)[0]


def write(request):
    from django.http import JsonResponse

    cv, t = orm_write(int(request.GET["n"]), request.GET.get("cv") == "1")
    return JsonResponse({"cv": cv, "t": t})


@functools.cache
def _urlpatterns():
    from django.urls import include, path
    from django.views.decorators.csrf import csrf_exempt

    routes = [path("floor/write", csrf_exempt(write))]
    if not PLAIN:
        routes.append(path("", include("project.urls")))
    return routes


@functools.cache
def _application():
    if PLAIN:
        from django.core.asgi import get_asgi_application

        return get_asgi_application()
    from project.asgi import application

    return application


def __getattr__(name):
    # Looked up after Django is configured: by the URL resolver and by Daphne.
    if name == "urlpatterns":
        return _urlpatterns()
    if name == "application":
        return _application()
    raise AttributeError(name)
