"""
rindle's HTTP API (Django REST framework): named-query leases, one-shot reads,
client mutations and the client schema. Routes are in ``rindle_app.urls``.
"""
