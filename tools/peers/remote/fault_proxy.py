#!/usr/bin/env python3
"""Fault-injecting HTTP/1.1 reverse proxy to one upstream, for the remote-source fault tests of xpackfs.

Sits between xpackfs and a test server (moto's S3, the Hub stand-in's hub or CDN port, the Range file server)
and makes it behave like a flaky or hostile object store, deterministically (seeded). Standard library only.

    python3 tools/peers/remote/fault_proxy.py --upstream http://127.0.0.1:PORT --port 0 --seed 7 \
        [--p503 F] [--p500 F] [--pcut F] [--pstall F --stall-s S] [--preset F] \
        [--mode NAME [--pmode F]] [--max-faults N] [--skip-first N] [--fault-path REGEX] \
        [--fault-methods GET,HEAD] [--log FILE] [--parent-pid PID] [--exit-on-stdin-eof]

Ready line on stdout (then it serves until killed, its parent is gone, or stdin closes with
--exit-on-stdin-eof):  {"proxy": "http://127.0.0.1:P", "upstream": "http://127.0.0.1:PORT"}

Pass-through: method, path and query, every request header in order (Authorization, Range, If-Match,
x-amz-*, ...) and the body; `Host` is forwarded exactly as the client sent it (so an S3 SigV4 signature
made for the proxy's address still verifies upstream: sign for the proxy's host:port, which is what a
client pointed at the proxy does anyway). Hop-by-hop headers (Connection, Keep-Alive, Proxy-*, TE, Upgrade)
are dropped. Response status, headers (Location included, unchanged) and body are passed back.

Faults by rate (one draw per request from random.Random(seed), in arrival order; checked in this order):
  --preset F  close with a TCP reset (SO_LINGER 0) before answering
  --p503 F    503 SlowDown (S3's XML error body; the upstream is not asked)
  --p500 F    500 InternalError (likewise)
  --pcut F    forward, send the headers and half the body, then close (GET with a body only)
  --pstall F  forward, send the headers and half the body, stop for --stall-s seconds (default 10), then the rest
Misbehaviour (--mode NAME, for GETs carrying a single `Range: bytes=` range, each with probability --pmode,
default 1):
  full200         drop the Range upstream: 200 with the whole object
  shifted-range   ask upstream for the range shifted by --shift bytes (default 7): a 206 whose Content-Range
                  (truthfully) names the shifted range, body from the shifted offset
  lying-range     the same shifted body, but Content-Range claims the range asked (only a digest can tell)
  short-body      Content-Length as asked, half the bytes, then close
  long-body       Content-Range as asked, but Content-Length and body --shift bytes longer
  long-overrun    Content-Length as asked, --shift extra bytes written after the body, then close
  etag-flip       every other such response carries a different ETag
  redirect-loop   302 to the same URL, forever
  huge-error      500 with a 64 MiB body (--huge-mib)
  huge-headers    500 with about 4 MiB of response headers (one 1 MiB header and 3000 of 1 KiB)
  trickle         the right answer, one body byte every --trickle-ms (default 100) ms
Limits: --skip-first N (the first N requests are never faulted: e.g. let a mount through), --max-faults N
(stop faulting after N faults), --fault-path REGEX (only matching paths), --fault-methods (default GET,HEAD).

Log: one JSON line per request to --log FILE (append, flushed; a line is written just after its answer ends,
so a test that has read the last byte may have to poll a moment for the last line): {"n", "t", "method", "path", "range", "fault"
("none", "reset", "503", "500", "cut", "stall", or the mode name), "status", "upstream_status", "bytes", "ms"}.
Control (on the proxy port, never forwarded): `GET /_proxy/stats` -> {"requests", "faults": {name: n},
"config"}; `GET /_proxy/log` -> the last 1000 log entries; `POST /_proxy/config?mode=..&p503=..&max_faults=..
&skip_first=..&seed=..&reset=1` changes the settings at run time (reset=1 also zeroes the counters).
"""

import argparse
import http.client
import json
import os
import random
import re
import socket
import struct
import sys
import threading
import time
from collections import Counter, deque
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import QuietHandler, Server  # noqa: E402

HOP = {"connection", "keep-alive", "proxy-connection", "te", "upgrade", "proxy-authenticate", "proxy-authorization", "trailer"}
MODES = ["full200", "shifted-range", "lying-range", "short-body", "long-body", "long-overrun", "etag-flip",
         "redirect-loop", "huge-error", "huge-headers", "trickle"]
RANGE_RE = re.compile(r"^\s*bytes\s*=\s*(\d+)\s*-\s*(\d*)\s*$")
CHUNK = 256 * 1024


class Closed(Exception):
    """The client went away (or we closed it on purpose): stop this request."""


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.rng = random.Random(args.seed)
        self.n = 0
        self.faults = Counter()
        self.nfaults = 0
        self.flip = 0
        self.recent = deque(maxlen=1000)
        self.logf = open(args.log, "a", buffering=1) if args.log else None
        up = urlsplit(args.upstream)
        if up.scheme != "http" or not up.hostname:
            raise SystemExit("--upstream must be http://HOST:PORT")
        self.up_host, self.up_port = up.hostname, up.port or 80
        self.path_re = re.compile(args.fault_path) if args.fault_path else None

    def config(self):
        a = self.args
        return {k: getattr(a, k) for k in ("seed", "p503", "p500", "pcut", "pstall", "stall_s", "preset", "mode", "pmode",
                                           "shift", "max_faults", "skip_first", "fault_path", "fault_methods",
                                           "trickle_ms", "huge_mib")}

    def decide(self, method, path, ranged, bodyless):
        """(request number, fault name or None), drawing the seeded numbers for every request."""
        a = self.args
        with self.lock:
            n = self.n
            self.n += 1
            r = self.rng.random()
            r2 = self.rng.random()
            ok = (n >= a.skip_first and (a.max_faults is None or self.nfaults < a.max_faults)
                  and method in a.fault_methods.split(",") and (self.path_re is None or self.path_re.search(path)))
            fault = None
            if ok:
                acc = 0.0
                for name, p in (("reset", a.preset), ("503", a.p503), ("500", a.p500), ("cut", a.pcut), ("stall", a.pstall)):
                    acc += p
                    if r < acc:
                        fault = name
                        break
                if fault in ("cut", "stall") and bodyless:
                    fault = None
                if fault is None and a.mode and ranged and method == "GET" and r2 < a.pmode:
                    if a.mode == "etag-flip":
                        self.flip += 1
                        fault = a.mode if self.flip % 2 == 0 else None
                    else:
                        fault = a.mode
            if fault:
                self.nfaults += 1
                self.faults[fault] += 1
            return n, fault

    def log(self, entry):
        line = json.dumps(entry)
        with self.lock:
            self.recent.append(entry)
            if self.logf:
                self.logf.write(line + "\n")


S3_ERR = '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message><RequestId>fault-proxy</RequestId></Error>'


class ProxyHandler(QuietHandler):
    st = None

    def __getattr__(self, name):
        if name.startswith("do_"):
            return self.handle_any
        raise AttributeError(name)

    # ---- plumbing -----------------------------------------------------------------------------------------
    def w(self, data):
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError, OSError) as e:
            raise Closed() from e

    def head_block(self, status, reason, headers):
        lines = ["HTTP/1.1 %d %s\r\n" % (status, reason)] + ["%s: %s\r\n" % (k, v) for k, v in headers] + ["\r\n"]
        self.w("".join(lines).encode("latin-1"))
        self.last_status = status

    def hard_close(self, reset=False):
        self.close_connection = True
        try:
            self.wfile.flush()
        except OSError:
            pass
        try:
            if reset:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.connection.close()

    def read_body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:  # forward the framing as it came
            raw = bytearray()
            while True:
                line = self.rfile.readline(65537)
                raw += line
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while True:
                        t = self.rfile.readline(65537)
                        raw += t
                        if t in (b"\r\n", b"\n", b""):
                            return bytes(raw)
                raw += self.rfile.read(size + 2)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    # ---- the request --------------------------------------------------------------------------------------
    def handle_any(self):
        st = self.st
        if self.path.startswith("/_proxy/"):
            return self.control()
        t0 = time.time()
        body = self.read_body()
        rng_hdr = self.headers.get("Range")
        m = RANGE_RE.match(rng_hdr) if rng_hdr else None
        n, fault = st.decide(self.command, urlsplit(self.path).path, m is not None, self.command == "HEAD")
        entry = {"n": n, "t": round(t0, 3), "method": self.command, "path": self.path[:300], "range": rng_hdr,
                 "fault": fault or "none", "status": None, "upstream_status": None, "bytes": 0}
        self.sent = 0
        try:
            self.serve(fault, m, body, entry)
        except Closed:
            self.close_connection = True
        except (ConnectionError, socket.timeout, http.client.HTTPException, OSError) as e:
            entry["error"] = "%s: %s" % (type(e).__name__, e)
            try:
                self.simple(502, "BadGateway", "upstream: %s" % e)
            except Closed:
                pass
            self.close_connection = True
        finally:
            entry["status"] = self.last_status or None
            entry["bytes"] = self.sent
            entry["ms"] = int((time.time() - t0) * 1000)
            st.log(entry)

    def simple(self, status, code, message, extra=()):
        body = (S3_ERR % (code, message)).encode()
        reason = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Slow Down"}.get(status, "Error")
        hdrs = [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))] + list(extra)
        self.head_block(status, reason, hdrs)
        if self.command != "HEAD":
            self.w(body)
            self.sent += len(body)

    def upstream(self, body, range_override=None, drop_range=False):
        st = self.st
        conn = http.client.HTTPConnection(st.up_host, st.up_port, timeout=st.args.upstream_timeout)
        conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for k, v in self.headers.items():
            kl = k.lower()
            if kl in HOP:
                continue
            if kl == "range" and (drop_range or range_override):
                if drop_range:
                    continue
                v = range_override
            conn.putheader(k, v)
        conn.endheaders(body if body else None)
        resp = conn.getresponse()
        return conn, resp

    def serve(self, fault, m, body, entry):
        a = self.st.args
        if fault == "reset":
            self.hard_close(reset=True)
            return
        if fault == "503":
            return self.simple(503, "SlowDown", "Please reduce your request rate.")
        if fault == "500":
            return self.simple(500, "InternalError", "We encountered an internal error. Please try again.")
        if fault == "redirect-loop":
            host = self.headers.get("Host") or "127.0.0.1:%d" % self.server.server_address[1]
            self.head_block(302, "Found", [("Location", "http://%s%s" % (host, self.path)), ("Content-Length", "0")])
            return
        if fault == "huge-error":
            total = a.huge_mib << 20
            self.head_block(500, "Internal Server Error", [("Content-Type", "text/plain"), ("Content-Length", str(total))])
            blk = b"E" * (1 << 20)
            for _ in range(a.huge_mib):
                self.w(blk)
                self.sent += len(blk)
            return
        if fault == "huge-headers":
            hdrs = [("Content-Type", "text/plain"), ("Content-Length", "0"), ("X-Huge", "h" * (1 << 20))]
            hdrs += [("X-Junk-%d" % i, "j" * 1024) for i in range(3000)]
            self.head_block(500, "Internal Server Error", hdrs)
            return

        first = last = None
        if m:
            first = int(m.group(1))
            last = int(m.group(2)) if m.group(2) else None
        override, drop = None, False
        if fault == "full200":
            drop = True
        elif fault in ("shifted-range", "lying-range"):
            override = "bytes=%d-%s" % (first + a.shift, "" if last is None else last + a.shift)
        elif fault == "long-body" and last is not None:
            override = "bytes=%d-%d" % (first, last + a.shift)
        conn, resp = self.upstream(body, override, drop)
        try:
            entry["upstream_status"] = resp.status
            self.relay(resp, fault, first, last, entry)
        finally:
            conn.close()

    def relay(self, resp, fault, first, last, entry):
        a = self.st.args
        headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP and k.lower() != "transfer-encoding"]
        clen = resp.getheader("Content-Length")
        chunked = clen is None and self.command != "HEAD" and resp.status not in (204, 304) and resp.status >= 200
        if fault == "lying-range" and resp.status == 206:
            cr = resp.getheader("Content-Range", "")
            mm = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", cr)
            if mm:
                ln = int(mm.group(2)) - int(mm.group(1)) + 1
                headers = [(k, v) if k.lower() != "content-range" else (k, "bytes %d-%d/%s" % (first, first + ln - 1, mm.group(3)))
                           for k, v in headers]
        elif fault == "long-body" and resp.status == 206 and last is not None:
            cr = resp.getheader("Content-Range", "")
            mm = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", cr)
            if mm:
                headers = [(k, v) if k.lower() != "content-range" else (k, "bytes %d-%d/%s" % (first, min(last, int(mm.group(2))), mm.group(3)))
                           for k, v in headers]
        elif fault == "etag-flip":
            headers = [(k, v) if k.lower() != "etag" else (k, '"flipped-%s"' % v.strip('"')[:32]) for k, v in headers]
        if chunked:
            headers.append(("Transfer-Encoding", "chunked"))
        self.head_block(resp.status, resp.reason, headers)
        if self.command == "HEAD" or resp.status in (204, 304):
            return
        total = int(clen) if clen is not None else None
        if fault in ("cut", "short-body") and total:
            self.copy(resp, total // 2)
            self.hard_close()
            return
        if fault == "stall" and total:
            self.copy(resp, total // 2)
            self.wfile.flush()
            time.sleep(a.stall_s)
            self.copy(resp, None)
            return
        if fault == "trickle":
            while True:
                b = resp.read(1)
                if not b:
                    return
                self.w(b)
                self.wfile.flush()
                self.sent += 1
                time.sleep(a.trickle_ms / 1000.0)
        if fault == "long-overrun" and total is not None:
            self.copy(resp, None)
            self.w(b"X" * a.shift)
            self.sent += a.shift
            self.hard_close()
            return
        if chunked:
            while True:
                b = resp.read1(CHUNK) if hasattr(resp, "read1") else resp.read(CHUNK)
                if not b:
                    self.w(b"0\r\n\r\n")
                    return
                self.w(b"%x\r\n" % len(b) + b + b"\r\n")
                self.sent += len(b)
        self.copy(resp, None)
        if total is not None and self.sent != total:  # upstream broke off: so must we
            self.hard_close()

    def copy(self, resp, limit):
        left = limit
        while left is None or left > 0:
            b = resp.read(CHUNK if left is None else min(CHUNK, left))
            if not b:
                return
            self.w(b)
            self.sent += len(b)
            if left is not None:
                left -= len(b)

    # ---- control ------------------------------------------------------------------------------------------
    def control(self):
        st = self.st
        self.drain_body()
        url = urlsplit(self.path)
        what = url.path[len("/_proxy/"):]
        if what == "stats":
            with st.lock:
                out = {"requests": st.n, "faults": dict(st.faults), "config": st.config()}
            return self.send_json(200, out)
        if what == "log":
            with st.lock:
                out = list(st.recent)
            return self.send_json(200, out)
        if what == "config" and self.command == "POST":
            q = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            a = st.args
            try:
                with st.lock:
                    for k, conv in (("p503", float), ("p500", float), ("pcut", float), ("pstall", float), ("preset", float),
                                    ("stall_s", float), ("pmode", float), ("shift", int), ("skip_first", int),
                                    ("trickle_ms", float), ("huge_mib", int)):
                        if k in q:
                            setattr(a, k, conv(q[k]))
                    if "mode" in q:
                        if q["mode"] not in MODES + ["", "none"]:
                            raise ValueError("unknown mode %r" % q["mode"])
                        a.mode = q["mode"] if q["mode"] not in ("", "none") else None
                    if "max_faults" in q:
                        a.max_faults = int(q["max_faults"]) if q["max_faults"] not in ("", "none") else None
                    if "fault_path" in q:
                        a.fault_path = q["fault_path"] or None
                        st.path_re = re.compile(a.fault_path) if a.fault_path else None
                    if "fault_methods" in q:
                        a.fault_methods = q["fault_methods"]
                    if "seed" in q:
                        a.seed = int(q["seed"])
                        st.rng = random.Random(a.seed)
                    if q.get("reset") in ("1", "true"):
                        st.n = st.nfaults = st.flip = 0
                        st.faults.clear()
                        st.recent.clear()
            except ValueError as e:
                return self.send_json(400, {"error": str(e)})
            return self.send_json(200, st.config())
        return self.send_json(404, {"error": "unknown control %r" % what})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--upstream", required=True, help="http://HOST:PORT")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    for k in ("p503", "p500", "pcut", "pstall", "preset"):
        ap.add_argument("--" + k, type=float, default=0.0)
    ap.add_argument("--stall-s", type=float, default=10.0)
    ap.add_argument("--mode", choices=MODES, default=None)
    ap.add_argument("--pmode", type=float, default=1.0)
    ap.add_argument("--shift", type=int, default=7, help="bytes for shifted-range / lying-range / long-body / long-overrun")
    ap.add_argument("--trickle-ms", type=float, default=100.0)
    ap.add_argument("--huge-mib", type=int, default=64)
    ap.add_argument("--max-faults", type=int, default=None)
    ap.add_argument("--skip-first", type=int, default=0)
    ap.add_argument("--fault-path", default=None, help="regex: fault only requests whose path matches")
    ap.add_argument("--fault-methods", default="GET,HEAD")
    ap.add_argument("--upstream-timeout", type=float, default=120.0)
    ap.add_argument("--log", default=None, help="JSON lines, one per request")
    _common.add_lifetime_args(ap)
    args = ap.parse_args()
    st = State(args)
    ProxyHandler.st = st
    srv = Server(("127.0.0.1", args.port), ProxyHandler)
    _common.apply_lifetime_args(args)
    _common.ready({"proxy": "http://127.0.0.1:%d" % srv.server_address[1], "upstream": args.upstream})
    _common.serve_forever(srv)


if __name__ == "__main__":
    main()
