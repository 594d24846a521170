"""An HTTP server that records every request it gets (one path a line, in `--log`), for the image
fetcher's tests: run in a network namespace on a public address, or on loopback where nothing
may reach it. `python tests/integration/recording_server.py HOST PORT LOG [REDIRECT_TO]`."""

from __future__ import annotations

import contextlib
import io
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image


def red_png() -> bytes:
    png = io.BytesIO()
    Image.new("RGB", (16, 16), "red").save(png, "PNG")
    return png.getvalue()


class Recording(BaseHTTPRequestHandler):
    log_path = ""
    redirect_to = ""  # where /redirect-away sends the client

    def do_GET(self) -> None:
        with open(self.log_path, "a") as log:
            log.write(self.path + "\n")
        if self.path.startswith("/red.png"):
            self._send(200, "image/png", red_png())
        elif self.path == "/big.png":
            self._send(200, "image/png", red_png() + b"\0" * (2 * 1024 * 1024))
        elif self.path == "/page":
            self._send(200, "text/html", b"<html></html>")
        elif self.path == "/redirect-home":
            self._redirect("/red.png?again")
        elif self.path == "/redirect-away":
            self._redirect(self.redirect_to)
        elif self.path == "/redirect-broken":
            self._redirect("http://[::1")
        else:
            self._send(404, "text/plain", b"no")

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(ConnectionError):  # a client that stopped reading, past its limit
            self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(host: str, port: int, log: str, redirect_to: str = "") -> ThreadingHTTPServer:
    handler = type("Handler", (Recording,), {"log_path": log, "redirect_to": redirect_to})
    return ThreadingHTTPServer((host, port), handler)


if __name__ == "__main__":
    host, port, log, *rest = sys.argv[1:]
    server = serve(host, int(port), log, *rest)
    print("serving", flush=True)
    server.serve_forever()
