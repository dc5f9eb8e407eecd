"""``promptlookup serve``: an OpenAI-compatible HTTP server on one :class:`~promptlookup.api.Engine`.

``app`` holds the routes, ``schemas`` the request and response models, ``queue`` the worker thread
and its bounded FIFO, ``history`` the history file's saves, ``metrics`` the Prometheus registry and
``server`` the uvicorn process (signals, the "listening" line). Only the CLI imports this package.
"""
