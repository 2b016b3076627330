"""The daemon: ``perdure serve``'s HTTP API, Server-Sent Events and web page.

``app.create_app`` builds the ASGI application over a ``Runtime`` from its parts:
``auth`` (who may call), ``payloads`` (request and answer JSON, one converter),
``errors`` (exception handlers: whose fault, which status) and ``streams`` (the
SSE pump). ``daemon.serve`` runs it with Hypercorn's trio worker inside
``open_runtime``.
"""
