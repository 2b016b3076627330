"""The daemon: ``perdure serve``'s HTTP API, Server-Sent Events and web page.

``app.create_app`` builds the ASGI application over a ``Runtime``; ``daemon.serve``
runs it with Hypercorn's trio worker inside ``open_runtime``.
"""
