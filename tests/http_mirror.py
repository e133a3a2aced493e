"""A small dump mirror on 127.0.0.1 with Range support and scripted faults, for the downloader's
tests (tests/test_download.py): `with serve() as mirror:` ... `mirror.url`."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import re
import socket
import sys
import threading
from typing import Iterator


class Mirror:
    """Files served by path; `faults[path]` is a list consumed one entry per GET:
    ("drop", n) sends the headers of the full answer, then n bytes, then closes the connection;
    ("corrupt", i) flips byte i of the body; ("header", name, value) adds a header to the answer
    (a misconfigured server's Content-Encoding); ("ignore-range",) answers 200 with the whole file
    whatever the Range header asked; ("status", code) answers that HTTP status (a loaded mirror's
    503); ("replace", data) makes `data` the file from this request on (a new version published
    between two GETs); None serves the request normally. With `etags`, every answer carries an
    ETag (the content's sha1) and If-Range is honoured: the whole file (200) when it no longer
    matches, as a web server does, unless `if_range` is False (a server or proxy that sends ETags
    but does not implement If-Range: the Range is served whatever If-Range says). With
    `range_cap` = n, a Range is answered with at most n bytes (a 206 of a shorter range than asked,
    as servers and CDNs that cap range replies send: its Content-Range says which bytes)."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.faults: dict[str, list] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.bytes_sent = 0
        self.etags = False
        self.if_range = True
        self.range_cap: int | None = None


def _handler(mirror: Mirror):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep pytest output clean
            pass

        def do_GET(self):
            range_header = self.headers.get("Range")
            mirror.requests.append((self.path, range_header))
            if self.path.endswith("/") and self.path not in mirror.files:
                # A directory listing like dumps.wikimedia.org's (the `latest` lookup reads it).
                prefix = self.path
                names = sorted(
                    {p[len(prefix) :].split("/")[0] for p in mirror.files if p.startswith(prefix)}
                )
                body = "".join(f'<a href="{n}/">{n}/</a>\n' for n in names).encode()
                return self._send(200, body, {})
            if self.path not in mirror.files:
                return self._send(404, b"not found", {})
            faults = mirror.faults.get(self.path)
            fault = faults.pop(0) if faults else None
            if fault and fault[0] == "replace":
                mirror.files[self.path] = fault[1]
            data = mirror.files[self.path]
            if fault and fault[0] == "status":
                return self._send(fault[1], b"busy", {})
            start, status, headers = 0, 200, {}
            if fault and fault[0] == "header":
                headers[fault[1]] = fault[2]
            if mirror.etags:
                headers["ETag"] = f'"{hashlib.sha1(data).hexdigest()}"'
                stale = self.headers.get("If-Range", headers["ETag"]) != headers["ETag"]
                if stale and mirror.if_range:
                    range_header = None
            if range_header and fault != ("ignore-range",):
                start = int(re.fullmatch(r"bytes=(\d+)-", range_header).group(1))
                if start >= len(data):
                    return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                status = 206
                end = len(data) if mirror.range_cap is None else min(len(data),
                                                                    start + mirror.range_cap)
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
                data = data[:end]
            body = data[start:]
            if fault and fault[0] == "corrupt":
                i = fault[1] - start
                body = body[:i] + bytes([body[i] ^ 0xFF]) + body[i + 1 :]
            if fault and fault[0] == "drop":
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body[: fault[1]])
                self.wfile.flush()
                mirror.bytes_sent += fault[1]
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._send(status, body, headers)

        def _send(self, status, body, headers):
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            # Counted before the write: a client can read the whole body and its test check the
            # count before this thread runs again (a CI run saw the count short by the body).
            mirror.bytes_sent += len(body)
            self.wfile.write(body)

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A client that hung up (the downloader giving up on a dropped or corrupt answer) is what
        the fault tests script; anything else is reported as usual."""
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve() -> Iterator[Mirror]:
    """A Mirror serving on a free port of 127.0.0.1 (its base URL in `.url`) until the block ends."""
    state = Mirror()
    server = _Server(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
