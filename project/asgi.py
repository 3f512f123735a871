"""ASGI entry point: HTTP through Django, websockets through rindle (rindle_app.asgi)."""

import os

from rindle_app.asgi import application as rindle_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
application = rindle_application()
