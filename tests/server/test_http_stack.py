"""``speclane serve`` runs on uvicorn's C HTTP parser (httptools) and libuv's event loop
(uvloop), both dependencies: every streamed chunk costs the event-loop thread CPU that
the engine's threads share, and these cut it (docs/design.md, "The HTTP stack in C too")."""

from __future__ import annotations

import sys

import pytest
from fastapi import FastAPI

from speclane.server.app import uvicorn_config


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop has no Windows build")
def test_the_server_config_picks_httptools_and_uvloop():
    import uvloop
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    config = uvicorn_config(FastAPI(), host="127.0.0.1", port=0, grace_s=1.0)
    config.load()
    assert config.http_protocol_class is HttpToolsProtocol
    loop = config.get_loop_factory()()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
