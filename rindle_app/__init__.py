"""
rindle: a Django database as a real-time sync engine speaking the rindle protocol.

The public API is these modules, named for what a project writes:

- ``rindle_app.mutators``: ``mutator``, ``MutationRejected``, ``Tx``;
- ``rindle_app.queries``: ``named_query``, ``table`` and its conditions (``cond``,
  ``and_``, ``or_``, ``not_``, ``exists``, ``not_exists``, ``correlate``),
  ``from_queryset``;
- ``rindle_app.asgi``: ``application()``, ``websocket_application()``;
- ``rindle_app.runtime``: ``Runtime``, ``get_runtime()``;
- ``rindle_app.exceptions``: the error classes and codes;
- ``rindle_app.testing``: helpers for a project's own tests;

plus the settings (``RINDLE = {...}``), ``RINDLE["ADAPTER"]``
(``rindle_app.adapter.RindleAdapter``), the URLconf (``rindle_app.urls``) and the
management commands. Every other module (``engine``, ``ivm``, ``stream``, ``flow``,
``realtime``, ``api`` and the rest) is internal: it may change in any release.
"""

__version__ = "0.1.0"
