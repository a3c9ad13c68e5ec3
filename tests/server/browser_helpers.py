"""Headless Chromium driven over the DevTools protocol (a websocket), for the dashboard test.

``Browser`` starts Debian's ``chromium --headless`` on a free debugging port, opens one page
and keeps every console error and uncaught exception it reports. Nothing but ``websockets``
and ``httpx``: no Playwright, no download of a browser.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import connect

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


class Browser:
    """One headless page; ``errors`` collects console errors and exceptions as they come."""

    def __init__(self, executable: str, *, width: int = 1100, height: int = 760) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="speclane-chromium-")
        self.process = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-port=0", f"--user-data-dir={self._profile.name}",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = self._debugging_port()
        pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json() if t["type"] == "page"]
        self._ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=64 * 2**20)
        self._ids = itertools.count(1)
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self.errors: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable")

    def _debugging_port(self) -> int:
        assert self.process.stderr is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if match:
                threading.Thread(target=self.process.stderr.read, daemon=True).start()  # keep the pipe drained
                return int(match.group(1))
        raise RuntimeError("chromium did not open its debugging port")

    def _read(self) -> None:
        for raw in self._ws:
            message = json.loads(raw)
            method = message.get("method")
            if method == "Runtime.consoleAPICalled" and message["params"]["type"] == "error":
                self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in message["params"]["args"]))
            elif method == "Runtime.exceptionThrown":
                self.errors.append(message["params"]["exceptionDetails"].get("text", "exception"))
            elif method == "Log.entryAdded" and message["params"]["entry"]["level"] == "error":
                self.errors.append(message["params"]["entry"]["text"])
            elif "id" in message:
                with self._cond:
                    self._replies[message["id"]] = message
                    self._cond.notify_all()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        with self._cond:
            if not self._cond.wait_for(lambda: call_id in self._replies, timeout=30):
                raise TimeoutError(f"chromium did not answer {method}")
            reply = self._replies.pop(call_id)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self._ws.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            # Chromium's helper processes may still write to the profile for a moment after
            # the browser process has exited ("Directory not empty"): try again briefly.
            for _ in range(30):
                try:
                    self._profile.cleanup()
                    break
                except OSError:
                    time.sleep(0.1)
