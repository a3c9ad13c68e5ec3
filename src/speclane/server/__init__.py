"""The OpenAI-compatible HTTP server (``speclane serve``).

``app.create_app`` builds the FastAPI app around an ``AsyncEngine``; ``app.serve`` loads
the engine and runs it on uvicorn. The parts, one job each:

- ``protocol.py``: the request and response models (OpenAI's fields plus ours);
- ``prompts.py``: a validated request -> prompt token ids, sampling and engine options;
- ``streaming.py``: engine outputs -> OpenAI responses and server-sent events;
- ``reasoning.py``: a reasoning model's ``<think>`` block -> ``reasoning_content``;
- ``auth.py``: the ``--api-keys`` file and who a request is for (tenant, weight);
- ``errors.py``: every error in OpenAI's shape, and the handlers that guarantee it;
- ``limits.py``: the request body size limit, enforced before any parsing;
- ``lifecycle.py``: live requests, draining on SIGTERM, the uvicorn server;
- ``metrics.py``: ``/metrics`` (prometheus-client, names as in docs/api.md).
"""
