"""``promptlookup serve``: an OpenAI-compatible HTTP server on one :class:`~promptlookup.api.Engine`.

``app`` holds the routes and a request's way through the queue to its response, ``guard`` the ASGI
middleware in front of them (API key, body checks) and the error object, ``render`` the OpenAI
response and stream chunk objects, ``schemas`` the request and response models, ``queue`` a request as
the engine loop runs it and its events, ``history`` the history file's saves, ``metrics`` the Prometheus
registry and ``server`` the uvicorn process (signals, the "listening" line). Only the CLI imports
this package.
"""
