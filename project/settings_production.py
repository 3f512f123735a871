"""
A production settings template: the host project's settings with DEBUG off, HTTPS
only and every key from the environment. ``manage.py check --deploy`` passes it
with no warning::

    DJANGO_SETTINGS_MODULE=project.settings_production
    DJANGO_SECRET_KEY=...          # required: at least 50 random characters
    DJANGO_ALLOWED_HOSTS=rindle.example.com   # required: the site's host names
    DATABASE_URL=postgres://...    # and REDIS_URL, as for project.settings
    RINDLE_METRICS_TOKEN=...       # optional: the bearer token Prometheus scrapes with
    DJANGO_BEHIND_TLS_PROXY=1      # optional: trust X-Forwarded-Proto from the proxy

Copy it into your project and adjust; nothing here reads a default key or opens
a demo route. With DEBUG off nothing serves ``/static/``: run ``collectstatic`` and
let the proxy serve ``STATIC_ROOT`` (the demo pages and the admin need it).
"""

import os

from django.core.exceptions import ImproperlyConfigured

from .settings import *  # noqa: F403
from .settings import RINDLE


def _required(name):
    value = os.environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(f"{name} must be set in the environment for production")
    return value


DEBUG = False
SECRET_KEY = _required("DJANGO_SECRET_KEY")
ALLOWED_HOSTS = [host for host in _required("DJANGO_ALLOWED_HOSTS").split(",") if host]
CSRF_TRUSTED_ORIGINS = [
    o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o
]
# The demo's name-only sign-in is a 404 whatever DEBUG says.
RINDLE_DEMO_OPEN_SIGN_IN = False

# HTTPS only: redirect plain HTTP, cookies never sent over it, and HSTS for a year.
SECURE_SSL_REDIRECT = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = 365 * 24 * 3600
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True  # the header only; joining the browsers' list is a separate step
if os.environ.get("DJANGO_BEHIND_TLS_PROXY") == "1":
    # Only behind a proxy that sets this header itself (and strips a client's).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

_metrics_token = os.environ.get("RINDLE_METRICS_TOKEN", "")
RINDLE = {
    **RINDLE,
    # Anonymous visitors may read what the adapter allows, never write.
    "ALLOW_ANONYMOUS_MUTATIONS": False,
    # /metrics: staff sessions, plus the scraper's token when one is set.
    "METRICS_AUTH": {"TOKEN": _metrics_token} if _metrics_token else None,
}
