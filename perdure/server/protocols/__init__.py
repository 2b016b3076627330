"""Other encodings of a session's event stream, for frontends built on other protocols.

The daemon's own stream sends each committed record as it is. The modules here
read the same stream (the log, then live events) and speak a frontend protocol:

- ``parts``: a pure fold of the stream into neutral *parts* (a text part opens,
  grows, closes; a tool call is asked, approved, answered; a run starts and ends),
  which is where live deltas are reconciled with the committed reply;
- ``ai_sdk``: the Vercel AI SDK's UI message stream (``useChat``);
- ``ag_ui``: AG-UI events (CopilotKit and the frameworks that adopted it).

Everything here is pure (no I/O): the routes in ``perdure.server.protocol_routes``
drive these encoders over ``Runtime.events``.
"""
