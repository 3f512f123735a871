"""
The OpenAPI document and its viewers (drf-spectacular's own views).

``GET /api/schema/openapi`` answers YAML (``application/vnd.oai.openapi``), or JSON
with ``?format=json`` or by ``Accept``. A browser opening it directly (its ``Accept``
names ``text/html``) gets the same text as ``text/plain`` (YAML) or
``application/json``, shown in the tab instead of downloaded as a file.
``/api/rindle/docs/`` is Swagger UI and ``/api/rindle/redoc/`` Redoc over that
document; they load their assets from drf-spectacular's ``SWAGGER_UI_DIST`` and
``REDOC_DIST`` (a CDN by default, or ``"SIDECAR"`` with
``drf_spectacular_sidecar`` installed, for a site without internet access).
"""

from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

# What a browser is shown instead of the OpenAPI media types, which it would download.
_BROWSER_TYPES = {"yaml": "text/plain; charset=utf-8", "json": "application/json; charset=utf-8"}


class OpenAPIView(SpectacularAPIView):
    """The OpenAPI document; readable in a browser tab."""

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        renderer = getattr(response, "accepted_renderer", None)
        browser = "text/html" in request.META.get("HTTP_ACCEPT", "")
        if browser and response.status_code == 200 and renderer is not None:
            shown = _BROWSER_TYPES.get(renderer.format)
            if shown is not None:
                response.content_type = shown
        return response


class SwaggerView(SpectacularSwaggerView):
    """Swagger UI over ``rindle-openapi``."""


class RedocView(SpectacularRedocView):
    """Redoc over ``rindle-openapi``."""
