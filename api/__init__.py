"""healer's dashboard and JSON API (FastAPI): pages, operator actions, ``/api/v1``, ops endpoints.

Build the app with :func:`api.app.create_app`; ``healer serve`` runs it standalone and ``healer run``
serves it inside the controller.
"""
