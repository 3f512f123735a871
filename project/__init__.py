"""The runnable host project: settings, routing, the Celery app and the demo app."""

from .celery import app as celery_app

__all__ = ["celery_app"]
