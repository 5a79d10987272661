"""A headless Chromium driven through the DevTools protocol, for the browser tests.

Chromium started with ``--remote-debugging-pipe`` reads DevTools commands on
its file descriptor 3 and writes answers and events on 4, each message JSON
ending with a NUL byte: no websocket, no driver to install, nothing but the
browser (Debian's ``chromium`` or ``chromium-headless-shell``, which
``.ci/run`` installs). :func:`start` returns ``None`` when no browser starts,
and the tests skip, saying so.

A :class:`Page` records what a person would see go wrong: console errors,
uncaught exceptions and failed loads (``errors``), and takes screenshots,
moves the mouse and reads the DOM (``evaluate``).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome")
TIMEOUT = 60.0


KEYS = {
    "Tab": 9,
    "Enter": 13,
    "Escape": 27,
    " ": 32,
    "End": 35,
    "Home": 36,
    "ArrowLeft": 37,
    "ArrowUp": 38,
    "ArrowRight": 39,
    "ArrowDown": 40,
}
"""The keys :meth:`Page.press` knows, with their virtual key codes."""


class BrowserError(RuntimeError):
    """The browser answered a command with an error, or not in time."""


def find() -> str | None:
    """Return the path of a Chromium, or ``None`` (``SCIO_CHROMIUM`` first)."""
    named = os.environ.get("SCIO_CHROMIUM")
    if named:
        return shutil.which(named) or (named if Path(named).is_file() else None)
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One Chromium process, spoken to through its DevTools pipe."""

    def __init__(self, path: str) -> None:
        self.profile = tempfile.TemporaryDirectory(prefix="scio-chromium-")
        to_browser, self._commands = os.pipe()
        self._answers, from_browser = os.pipe()
        # above 4, so that putting one on 3 cannot overwrite the other
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser)]
        for fd in (to_browser, from_browser):
            os.close(fd)
        to_browser, from_browser = high

        def pipes() -> None:  # in the child: the DevTools pipe on fds 3 and 4
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.process = subprocess.Popen(  # noqa: S603 (a browser we found by name)
            [
                path,
                "--headless",
                "--no-sandbox",  # root in CI
                "--disable-gpu",
                "--remote-debugging-pipe",
                f"--user-data-dir={self.profile.name}",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--hide-scrollbars",
                "--mute-audio",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=pipes,  # noqa: PLW1509 (a single-threaded test process)
            pass_fds=(3, 4),  # kept open in the child (set by `pipes`)
        )
        os.close(to_browser)
        os.close(from_browser)
        self._next = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._answers], [], [], left)[0]:
                msg = "the browser did not answer in time"
                raise BrowserError(msg)
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                msg = "the browser closed its DevTools pipe"
                raise BrowserError(msg)
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        found: dict[str, Any] = json.loads(message)
        return found

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
    ) -> dict[str, Any]:
        """Send a command; return its result (events meanwhile go to ``events``)."""
        self._next += 1
        message: dict[str, Any] = {
            "id": self._next,
            "method": method,
            "params": params or {},
        }
        if session is not None:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._next:
                if "error" in answer:
                    msg = f"{method}: {answer['error']}"
                    raise BrowserError(msg)
                result: dict[str, Any] = answer.get("result", {})
                return result
            self.events.append(answer)

    def wait_for(
        self, method: str, session: str, timeout: float = TIMEOUT
    ) -> dict[str, Any]:
        """Return the next event ``method`` of ``session`` (read or kept)."""
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method and event.get("sessionId") == session:
                self.events.remove(event)
                return event
        while True:
            event = self._read(deadline)
            if event.get("method") == method and event.get("sessionId") == session:
                return event
            self.events.append(event)

    def page(
        self, width: int = 1280, height: int = 900, *, mobile: bool = False
    ) -> Page:
        """Open a new tab of ``width`` x ``height`` CSS pixels (a phone: ``mobile``).

        A mobile tab lays a page out as a phone does: at 980 px scaled down,
        unless the page has a viewport tag.
        """
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send(
            "Target.attachToTarget", {"targetId": target, "flatten": True}
        )["sessionId"]
        return Page(self, session, width, height, mobile=mobile)

    def close(self) -> None:
        """End the browser and remove its profile."""
        with contextlib.suppress(OSError, BrowserError):
            self.send("Browser.close")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for fd in (self._commands, self._answers):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.profile.cleanup()


def start() -> Browser | None:
    """Start a Chromium, or return ``None`` if none is installed or it fails."""
    path = find()
    if path is None:
        return None
    try:
        browser = Browser(path)
        browser.send("Browser.getVersion")
    except (OSError, BrowserError):
        with contextlib.suppress(Exception):
            browser.close()
        return None
    return browser


_ERRORS = {
    "Runtime.exceptionThrown",
    "Runtime.consoleAPICalled",
    "Log.entryAdded",
    "Network.loadingFailed",
}


class Page:
    """A tab: load a URL, read its errors, move the mouse, evaluate, screenshot."""

    def __init__(
        self,
        browser: Browser,
        session: str,
        width: int,
        height: int,
        *,
        mobile: bool = False,
    ) -> None:
        self.browser = browser
        self.session = session
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {
                "width": width,
                "height": height,
                "deviceScaleFactor": 1,
                "mobile": mobile,
            },
        )
        self.requests: list[str] = []

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, self.session)

    def load(self, url: str) -> None:
        """Go to ``url`` and wait for its load event."""
        self.send("Page.navigate", {"url": url})
        self.browser.wait_for("Page.loadEventFired", self.session)

    def _mine(self) -> list[dict[str, Any]]:
        return [e for e in self.browser.events if e.get("sessionId") == self.session]

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads since the start."""
        self.evaluate("0")  # read what the page sent so far
        found = []
        for event in self._mine():
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                text = (
                    details.get("exception", {}).get("description") or details["text"]
                )
                found.append(f"exception: {text}")
            elif method == "Runtime.consoleAPICalled" and params["type"] in {
                "error",
                "assert",
            }:
                args = [a.get("value", a.get("description")) for a in params["args"]]
                found.append(f"console.{params['type']}: {args}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"log: {params['entry']['text']}")
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                found.append(f"failed load: {params.get('errorText')}")
        return found

    def requested(self) -> list[str]:
        """The URLs the page asked for (its own included)."""
        self.evaluate("0")
        return [
            e["params"]["request"]["url"]
            for e in self._mine()
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def evaluate(self, expression: str) -> Any:
        """Return the value of ``expression`` in the page (JSON-able values)."""
        answer = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details["text"]
            msg = f"{expression!r} raised in the page: {text}"
            raise BrowserError(msg)
        return answer["result"].get("value")

    def hover(self, x: float, y: float) -> None:
        """Move the mouse to ``(x, y)`` (CSS pixels of the viewport)."""
        self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    def click(self, x: float, y: float) -> None:
        """Click at ``(x, y)``."""
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )

    def press(self, key: str) -> None:
        """Press and release ``key`` (``"Tab"``, ``"Enter"``, ``"ArrowRight"``...)."""
        code = KEYS[key]
        for kind in ("keyDown", "keyUp"):
            self.send(
                "Input.dispatchKeyEvent",
                {
                    "type": kind,
                    "key": key,
                    "code": "Space" if key == " " else key,
                    "windowsVirtualKeyCode": code,
                    "nativeVirtualKeyCode": code,
                },
            )

    def center(self, selector: str) -> tuple[float, float]:
        """Return the centre of the element ``selector``, scrolled into view."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if box is None:
            msg = f"no element {selector!r} in the page"
            raise BrowserError(msg)
        return box[0], box[1]

    def screenshot(self, *, full: bool = False) -> bytes:
        """Return a PNG of the viewport (or of the whole page: ``full=True``)."""
        params: dict[str, Any] = {"format": "png"}
        if full:
            params["captureBeyondViewport"] = True
            size = self.evaluate(
                "[document.documentElement.scrollWidth,"
                " document.documentElement.scrollHeight]"
            )
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": size[0],
                "height": min(size[1], 16000),
                "scale": 1,
            }
        return base64.b64decode(self.send("Page.captureScreenshot", params)["data"])


def inked(png: bytes) -> float:
    """Return the share of pixels of a PNG that are not the background colour.

    The background is the most common colour; a blank page gives 0.
    """
    from PIL import Image  # noqa: PLC0415 (matplotlib's dependency, in the dev extra)

    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 24) or []
    if not colours:
        return 0.0
    background = max(colours)[0]
    return 1 - background / (image.width * image.height)
