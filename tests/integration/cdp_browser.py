"""A headless Chromium driven over the Chrome DevTools Protocol, for the
web tests: Debian's `chromium` and `python3-websocket`, no npm.

Chromium starts with --remote-debugging-port=0 and prints the port it
took ("DevTools listening on ws://127.0.0.1:PORT/..."); the page target's
WebSocket comes from http://127.0.0.1:PORT/json/list. Calls are
synchronous: send {"id", "method", "params"}, read messages until the
reply with that id (events in between are dropped; the tests poll the DOM
instead of listening for events, which keeps this small).
"""
import base64
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import urllib.request

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def missing():
    """None when a browser can be driven, else the reason to skip."""
    if not CHROMIUM:
        return "chromium is not installed (Debian package `chromium`; `make deps` installs it)"
    try:
        import websocket  # noqa: F401
    except ImportError:
        return "python3-websocket is not installed (`make deps` installs it)"
    return None


class CdpError(RuntimeError):
    pass


class Browser:
    def __init__(self, width=1000, height=760):
        import websocket
        self.dir = tempfile.mkdtemp(prefix="redlm-chromium-")
        args = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--disable-component-update", "--mute-audio", "--hide-scrollbars",
                f"--window-size={width},{height}", f"--user-data-dir={self.dir}",
                "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                "--remote-allow-origins=*", "about:blank"]
        self.log_path = pathlib.Path(self.dir) / "chromium.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        port = None
        deadline = time.time() + 60
        while time.time() < deadline and port is None:
            if self.proc.poll() is not None:
                raise CdpError(f"chromium exited: {self.log_path.read_text()[-2000:]}")
            for line in self.log_path.read_text().splitlines():
                if "DevTools listening on ws://" in line:
                    port = int(line.split("ws://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
            time.sleep(0.05)
        if port is None:
            self.close()
            raise CdpError("chromium did not open its DevTools port")
        page = None
        while time.time() < deadline and page is None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as f:
                page = next((t for t in json.load(f) if t.get("type") == "page"), None)
            time.sleep(0.05)
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60,
                                              suppress_origin=True)
        self.next_id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method, **params):
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise CdpError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expr):
        """The value of a JavaScript expression (promises awaited)."""
        r = self.call("Runtime.evaluate", expression=expr, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise CdpError(f"{expr!r}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr, timeout=60, what=None):
        """Polls expr until it is truthy; returns its value."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.eval(expr)
            if v:
                return v
            time.sleep(0.02)
        raise AssertionError(f"timed out after {timeout}s waiting for {what or expr}")

    def goto(self, url):
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete' && location.href.startsWith(%s)" % json.dumps(url),
                  what=f"{url} to load")

    def click(self, selector):
        """A real mouse click in the middle of the element, scrolled into
        view first as a user would."""
        box = self.eval("(() => { const e = document.querySelector(%s);"
                        " e.scrollIntoView({block: 'nearest'}); const r = e.getBoundingClientRect();"
                        " return [r.x + r.width / 2, r.y + r.height / 2]; })()" % json.dumps(selector))
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left",
                      clickCount=1)

    def type(self, selector, text):
        self.eval("document.querySelector(%s).focus()" % json.dumps(selector))
        self.call("Input.insertText", text=text)

    def key(self, key, code=None, vk=0, text=None, modifiers=0):
        """A real key press (keyDown with its text, then keyUp) to the
        focused element: key("Enter", vk=13, text="\\r")."""
        base = dict(key=key, code=code or key, windowsVirtualKeyCode=vk, nativeVirtualKeyCode=vk,
                    modifiers=modifiers)
        self.call("Input.dispatchKeyEvent", type="keyDown", **base, **({"text": text} if text else {}))
        self.call("Input.dispatchKeyEvent", type="keyUp", **base)

    def enter(self):
        self.key("Enter", vk=13, text="\r")

    def grant_clipboard(self, origin):
        """Lets the page read and write the clipboard (for copy buttons)."""
        self.call("Browser.grantPermissions", origin=origin,
                  permissions=["clipboardReadWrite", "clipboardSanitizedWrite"])

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self):
        try:
            if getattr(self, "ws", None):
                self.ws.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            # chromium's helpers share its session: end the whole group
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
