"""Shared pieces of the remote-source test servers (tools/peers/remote/*.py), standard library only.

- `Server`: a ThreadingHTTPServer bound to loopback (daemon threads, address reuse, a deep listen queue).
- `parse_range(header, size)`: one `bytes=a-b` / `bytes=a-` / `bytes=-n` range, as S3 and the Hub's CDN read it.
- `send_file_range(handler, path, size, ...)`: 200 / 206 / 416 answer for a file on disk, streamed.
- `watch_parent(pid)`: exit this process when its parent dies (polls, so it works whatever thread started us).
- `ready(obj)`: print the one JSON "ready" line on stdout and flush.
"""

import json
import os
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = 256 * 1024


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        # A client that resets or drops its connection is normal here (tests kill readers, proxies cut bodies).
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class V6Server(Server):
    address_family = socket.AF_INET6


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler that logs to stderr only when XPACKFS_SERVER_VERBOSE is set."""

    protocol_version = "HTTP/1.1"
    server_version = "xpackfs-test"
    sys_version = ""

    def version_string(self):
        return self.server_version

    last_status = 0

    def send_response(self, code, message=None):
        self.last_status = code
        super().send_response(code, message)

    def log_message(self, fmt, *args):  # noqa: D102
        if os.environ.get("XPACKFS_SERVER_VERBOSE"):
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    def send_bytes(self, status, body, content_type="application/json", headers=()):
        """A complete answer with a body (or none for HEAD), Content-Length always set."""
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return len(body) if self.command != "HEAD" else 0

    def send_json(self, status, obj, headers=()):
        return self.send_bytes(status, json.dumps(obj), "application/json; charset=utf-8", headers)

    def drain_body(self):
        """Read (and return) a request body sent with Content-Length, so keep-alive stays in step."""
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""


_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$")


def parse_range(header, size):
    """Parse one Range header against an object of `size` bytes.

    Returns None (no usable range: serve the whole object with 200; this covers a missing header, a header
    that is not a single bytes range, and multi-range requests, which S3 also answers with the whole object),
    "unsatisfiable" (416), or (first, last) inclusive.
    """
    if not header:
        return None
    m = _RANGE.match(header)
    if not m:
        return None
    a, b = m.group(1), m.group(2)
    if a == "" and b == "":
        return None
    if a == "":  # suffix: the last n bytes
        n = int(b)
        if n == 0 or size == 0:
            return "unsatisfiable"
        return (max(0, size - n), size - 1)
    first = int(a)
    last = int(b) if b != "" else size - 1
    if b != "" and last < first:
        return None  # syntactically invalid: RFC 9110 says ignore the header
    if first >= size:
        return "unsatisfiable"
    return (first, min(last, size - 1))


def etag_matches(header, etag):
    """If-Match / If-None-Match list semantics (strong comparison; `*` matches anything)."""
    if header is None:
        return None
    items = [x.strip() for x in header.split(",")]
    if "*" in items:
        return True
    bare = etag.strip('"')
    for it in items:
        if it.startswith("W/"):
            it = it[2:]
        if it.strip('"') == bare:
            return True
    return False


def send_file_range(h, path, size, headers=(), etag=None, last_modified=None, counters=None):
    """Answer GET/HEAD of a file with Range support. Returns the number of body bytes written.

    `headers` are extra (name, value) pairs for the success answers. If-Match (412), If-None-Match (304) and
    If-Range (a mismatching validator drops the range) are honoured when `etag` is given.
    """
    if etag is not None:
        im = etag_matches(h.headers.get("If-Match"), etag)
        if im is False:
            return h.send_bytes(412, b"precondition failed\n", "text/plain", [("ETag", etag)])
        inm = etag_matches(h.headers.get("If-None-Match"), etag)
        if inm is True:
            h.send_response(304)
            h.send_header("ETag", etag)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return 0
    rng = parse_range(h.headers.get("Range"), size)
    if_range = h.headers.get("If-Range")
    if rng is not None and if_range is not None and etag is not None and etag_matches(if_range, etag) is not True:
        rng = None
    if rng == "unsatisfiable":
        return h.send_bytes(416, b"requested range not satisfiable\n", "text/plain", [("Content-Range", "bytes */%d" % size)])
    if rng is None:
        first, last, status = 0, size - 1, 200
    else:
        first, last = rng
        status = 206
    length = last - first + 1 if size else 0
    h.send_response(status)
    h.send_header("Content-Type", "application/octet-stream")
    h.send_header("Content-Length", str(length))
    h.send_header("Accept-Ranges", "bytes")
    if status == 206:
        h.send_header("Content-Range", "bytes %d-%d/%d" % (first, last, size))
    if etag is not None:
        h.send_header("ETag", etag)
    if last_modified is not None:
        h.send_header("Last-Modified", last_modified)
    for k, v in headers:
        h.send_header(k, v)
    h.end_headers()
    if h.command == "HEAD" or length == 0:
        return 0
    sent = 0
    with open(path, "rb") as f:
        f.seek(first)
        left = length
        while left > 0:
            buf = f.read(min(CHUNK, left))
            if not buf:
                break
            h.wfile.write(buf)
            sent += len(buf)
            left -= len(buf)
    if sent != length:  # the file shrank under us: the answer is broken, do not keep the connection
        h.close_connection = True
    return sent


_EXIT_HOOKS = []


def on_exit(fn):
    """Run `fn` before this process exits through any of the paths below (signal, parent gone, stdin EOF)."""
    _EXIT_HOOKS.append(fn)


def die(code=0):
    for fn in reversed(_EXIT_HOOKS):
        try:
            fn()
        except Exception:
            pass
    os._exit(code)


def watch_parent(parent_pid=None, interval=0.5):
    """Exit (os._exit) when the parent process is gone.

    With `parent_pid`, watch that pid; otherwise watch for this process being re-parented (getppid changes),
    which is what happens when the process that started us dies. Polling instead of PR_SET_PDEATHSIG, because
    that signal follows the parent *thread* (a Rust test thread that spawned a shared server may end first).
    """
    start_ppid = os.getppid()

    def loop():
        while True:
            time.sleep(interval)
            if parent_pid is not None:
                try:
                    os.kill(parent_pid, 0)
                except ProcessLookupError:
                    die(0)
                except PermissionError:
                    pass
            if os.getppid() != start_ppid:
                die(0)

    threading.Thread(target=loop, daemon=True, name="watch-parent").start()


def exit_on_stdin_eof():
    """Exit when stdin reaches end of file (the parent closed its end of our stdin pipe)."""

    def loop():
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except Exception:
            pass
        die(0)

    threading.Thread(target=loop, daemon=True, name="stdin-eof").start()


def add_lifetime_args(ap):
    ap.add_argument("--parent-pid", type=int, default=None, help="exit when this pid is gone (default: exit when re-parented)")
    ap.add_argument("--exit-on-stdin-eof", action="store_true", help="exit when stdin is closed (give the server a pipe as stdin)")


def apply_lifetime_args(args):
    watch_parent(args.parent_pid)
    if args.exit_on_stdin_eof:
        exit_on_stdin_eof()


def ready(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve_forever(*servers):
    """Serve each server on its own thread; return only on KeyboardInterrupt/SIGTERM (then exit 0)."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: die(0))
    for s in servers[1:]:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        servers[0].serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    die(0)
