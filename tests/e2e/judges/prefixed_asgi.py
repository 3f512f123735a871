"""The ASGI application of settings_prefixed: the websocket routes under ``sync/`` too."""

import os

from rindle_app.asgi import application as rindle_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.e2e.judges.settings_prefixed")
application = rindle_application(prefix="sync/")
