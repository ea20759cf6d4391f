#!/usr/bin/env python3
"""Self-check of tools/peers/remote/fault_proxy.py (and the Range file server of servers.py) with raw HTTP.

Starts `servers.py http` on a temp file and the proxy in front of it, then for each fault and mode checks
what a client sees (status, headers, body length, connection cut/reset, stall and trickle timing) and that
the proxy's log and /_proxy/stats record it; also a pass-through check that headers (Host, Authorization,
If-Match, x-amz-*) reach the upstream unchanged and that the seeded faults repeat. Exits non-zero on failure.

    python3 tools/peers/remote/check_fault_proxy.py
"""

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
failures = []


def check(name, fn):
    try:
        fn()
        print("ok    %s" % name, flush=True)
    except Exception as e:  # noqa: BLE001
        failures.append(name)
        print("FAIL  %s: %s: %s" % (name, type(e).__name__, e), flush=True)


def start(args):
    p = subprocess.Popen([sys.executable] + args, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    return p, json.loads(p.stdout.readline())


def main():
    tmp = tempfile.mkdtemp(prefix="check-fault-proxy-")
    data = os.urandom(1 << 20)
    with open(os.path.join(tmp, "obj.bin"), "wb") as f:
        f.write(data)
    procs = []
    try:
        hp, h = start([os.path.join(HERE, "servers.py"), "http", "--port", "0", "--root", tmp])
        procs.append(hp)
        log = os.path.join(tmp, "proxy.jsonl")
        pp, p = start([os.path.join(HERE, "fault_proxy.py"), "--upstream", h["http"], "--port", "0", "--seed", "3",
                       "--log", log, "--stall-s", "1.5"])
        procs.append(pp)
        run(p["proxy"], data, log)
    finally:
        for pr in procs:
            pr.terminate()
            pr.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % len(failures) if failures else "all checks passed", flush=True)
    return 1 if failures else 0


def run(proxy, data, logpath):
    host, port = proxy[len("http://"):].split(":")
    port = int(port)

    def config(**kw):
        q = "&".join("%s=%s" % (k, v) for k, v in kw.items())
        req = urllib.request.Request(proxy + "/_proxy/config?" + q, data=b"", method="POST")
        return json.loads(urllib.request.urlopen(req, timeout=10).read())

    def stats():
        return json.loads(urllib.request.urlopen(proxy + "/_proxy/stats", timeout=10).read())

    def get(rng=None, headers=None, timeout=10, method="GET"):
        c = http.client.HTTPConnection(host, port, timeout=timeout)
        hd = dict(headers or {})
        if rng:
            hd["Range"] = "bytes=%d-%d" % rng
        c.request(method, "/obj.bin", headers=hd)
        r = c.getresponse()
        return c, r

    def read_all(r):
        out = b""
        try:
            while True:
                b = r.read(65536)
                if not b:
                    break
                out += b
        except http.client.IncompleteRead as e:
            out += e.partial
            return out, "incomplete"
        except (ConnectionError, socket.timeout) as e:
            return out, type(e).__name__
        return out, None

    off = 1000

    def clean():
        config(reset=1, mode="none", p503=0, p500=0, pcut=0, pstall=0, preset=0, max_faults="none", skip_first=0)

    def passthrough():
        clean()
        c, r = get((off, off + 99), {"Authorization": "AWS4-HMAC-SHA256 Credential=x", "x-amz-date": "20260101T000000Z"})
        assert r.status == 206 and r.getheader("Content-Range") == "bytes %d-%d/%d" % (off, off + 99, len(data))
        assert r.read() == data[off:off + 100]
        et = r.getheader("ETag")
        c.request("GET", "/obj.bin", headers={"Range": "bytes=0-9", "If-Match": '"nope"'})
        r = c.getresponse()
        assert r.status == 412, r.status
        r.read()
        c.request("GET", "/obj.bin", headers={"Range": "bytes=0-9", "If-Match": et})  # keep-alive through the proxy
        r = c.getresponse()
        assert r.status == 206 and r.read() == data[:10]
        c, r = get(method="HEAD")
        assert r.status == 200 and int(r.getheader("Content-Length")) == len(data)
        c, r = get()
        assert r.read() == data

    def rates():
        clean()
        config(p503=0.2, p500=0.2, pcut=0.2, preset=0.2, seed=11, reset=1)
        seen = set()
        for i in range(40):
            try:
                c, r = get((0, 200_000))
                body, err = read_all(r)
                if r.status == 503:
                    assert b"SlowDown" in body
                    seen.add("503")
                elif r.status == 500:
                    seen.add("500")
                elif err or len(body) < 200_001:
                    seen.add("cut")
                else:
                    assert body == data[:200_001]
            except (ConnectionError, http.client.RemoteDisconnected):
                seen.add("reset")
        s = stats()
        assert seen == {"503", "500", "cut", "reset"}, seen
        assert set(s["faults"]) == {"503", "500", "cut", "reset"}, s["faults"]
        def last40():  # log lines are written when a request ends: order them by request number
            return [e["fault"] for e in sorted([json.loads(x) for x in open(logpath)][-40:], key=lambda e: e["n"])]
        first = last40()
        config(seed=11, reset=1)
        for i in range(40):
            try:
                c, r = get((0, 200_000))
                read_all(r)
            except (ConnectionError, http.client.RemoteDisconnected):
                pass
        second = last40()
        assert first == second, "same seed, different faults"

    def limits():
        clean()
        config(p503=1, skip_first=2, max_faults=3, reset=1)
        codes = []
        for i in range(7):
            c, r = get((0, 9))
            r.read()
            codes.append(r.status)
        assert codes == [206, 206, 503, 503, 503, 206, 206], codes

    def stall():
        clean()
        config(pstall=1, max_faults=1, reset=1)
        c, r = get((0, 99_999))
        t0 = time.time()
        body = r.read()
        assert body == data[:100_000] and time.time() - t0 >= 1.4
        c, r = get((0, 99_999), timeout=0.5)
        t0 = time.time()
        assert r.read() == data[:100_000]  # max-faults reached: no stall

    def mode(name, fn):
        def f():
            clean()
            config(mode=name, reset=1)
            fn()
            assert stats()["faults"].get(name, 0) >= 1, stats()["faults"]
        return f

    def full200():
        c, r = get((off, off + 99))
        assert r.status == 200 and r.read() == data

    def shifted():
        c, r = get((off, off + 99))
        assert r.status == 206 and r.getheader("Content-Range").startswith("bytes %d-%d/" % (off + 7, off + 106))
        assert r.read() == data[off + 7:off + 107]

    def lying():
        c, r = get((off, off + 99))
        assert r.status == 206 and r.getheader("Content-Range").startswith("bytes %d-%d/" % (off, off + 99))
        assert r.read() == data[off + 7:off + 107]

    def short():
        c, r = get((off, off + 9999))
        assert int(r.getheader("Content-Length")) == 10000
        body, err = read_all(r)  # http.client's read(amt) returns short without an error: count the bytes
        assert len(body) == 5000 and body == data[off:off + 5000], (err, len(body))

    def long_():
        c, r = get((off, off + 99))
        assert r.getheader("Content-Range").startswith("bytes %d-%d/" % (off, off + 99))
        assert int(r.getheader("Content-Length")) == 107
        assert r.read() == data[off:off + 107]

    def overrun():
        s = socket.create_connection((host, port), 10)
        s.sendall(b"GET /obj.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\n\r\n")
        buf = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            buf += b
        head, _, body = buf.partition(b"\r\n\r\n")
        assert b"Content-Length: 10" in head and len(body) == 17 and body[:10] == data[:10], (head, len(body))

    def flip():
        tags = []
        for i in range(4):
            c, r = get((0, 9))
            r.read()
            tags.append(r.getheader("ETag"))
        assert tags[0] == tags[2] and tags[1] == tags[3] and tags[0] != tags[1], tags

    def loop():
        c, r = get((0, 9))
        assert r.status == 302 and r.getheader("Location") == "http://%s:%d/obj.bin" % (host, port)
        r.read()

    def huge():
        c, r = get((0, 9))
        assert r.status == 500 and int(r.getheader("Content-Length")) == 64 << 20
        n = 0
        while True:
            b = r.read(1 << 20)
            if not b:
                break
            n += len(b)
        assert n == 64 << 20

    def huge_headers():
        s = socket.create_connection((host, port), 10)
        s.sendall(b"GET /obj.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\n\r\n")
        buf = b""
        while b"\r\n\r\n" not in buf[-8:]:
            b = s.recv(1 << 20)
            if not b:
                break
            buf += b
        assert buf.startswith(b"HTTP/1.1 500") and len(buf) > 4_000_000, len(buf)

    def trickle():
        c, r = get((0, 99), timeout=10)
        t0 = time.time()
        b = r.read(5)
        assert b == data[:5] and time.time() - t0 >= 0.35, time.time() - t0
        c.close()

    check("pass-through: Range, If-Match 412, keep-alive, HEAD, whole GET", passthrough)
    check("rates: 503, 500, cut, reset all seen; same seed -> same faults", rates)
    check("--skip-first / --max-faults", limits)
    check("stall: body pauses --stall-s, then completes", stall)
    for name, fn in (("full200", full200), ("shifted-range", shifted), ("lying-range", lying), ("short-body", short),
                     ("long-body", long_), ("long-overrun", overrun), ("etag-flip", flip), ("redirect-loop", loop),
                     ("huge-error", huge), ("huge-headers", huge_headers), ("trickle", trickle)):
        check("mode " + name, mode(name, fn))
    entries = [json.loads(x) for x in open(logpath)]
    check("JSON-lines log has every request with its fault",
          lambda: (len(entries) > 80 and {"n", "fault", "status", "bytes", "method", "path"} <= set(entries[0])) or
          (_ for _ in ()).throw(AssertionError(len(entries))))


if __name__ == "__main__":
    sys.exit(main())
