#!/usr/bin/env python3
"""Stand-in for the Hugging Face Hub's HTTP file protocol, serving local directories as model repos.

For the `hf://` tests of xpackfs (issue 24): the Rust client talks to it exactly as to the Hub with
`HF_ENDPOINT=<hub>` and the Hub's HTTP (non-Xet) protocol. Checked against huggingface_hub's own client by
tools/peers/remote/check_hub_standin.py. Standard library only.

Start (a test does this, on loopback only):

    python3 tools/peers/remote/hub_standin.py --port 0 --repo org/model=/path/to/dir [--repo ...] \
        [--token SECRET] [--gated org/model] [--expires 3600] [--lfs-min 1024] [--lfs-pattern '*.gguf'] \
        [--cdn-host localhost] [--no-copy] [--parent-pid PID] [--exit-on-stdin-eof]

When it is ready it prints ONE line on stdout and serves until killed (SIGTERM/SIGINT, its parent gone, or
stdin closed with --exit-on-stdin-eof):

    {"hub": "http://127.0.0.1:P", "cdn": "http://localhost:Q", "commits": {"org/model": "<40 hex>"}}

Two origins: the Hub on 127.0.0.1:P, the CDN on `localhost`:Q (another host name AND port, so clients must
treat it as a foreign origin: no bearer token there).

Hub protocol (port P; with --token every route below answers 401 without `Authorization: Bearer TOKEN`):
- `GET /api/models/ORG/NAME` and `.../revision/REV`: {"id", "sha" (the commit), "siblings": [{"rfilename"}],
  "gated", "private", ...}; `?blobs=true` adds size/blobId/lfs to the siblings.
- `GET /api/models/ORG/NAME/tree/REV[/PATH]?recursive=true`: list of {"type": "file"|"directory", "path",
  "size", "oid" (git blob sha1; for LFS files the sha1 of the pointer file, as git stores it), and for LFS
  files "lfs": {"oid": sha256, "size", "pointerSize"}}. Paginated like the Hub (cursor + `Link: <...>;
  rel="next"`) at --page-size entries (default 1000).
- `POST /api/models/ORG/NAME/paths-info/REV` (form `paths=a&paths=b` or JSON {"paths": [...]}): the entries.
- `GET|HEAD /ORG/NAME/resolve/REV/PATH`: regular files answer 200 with the bytes (Range honoured),
  `ETag: "<git sha1>"`, `X-Repo-Commit`; LFS files answer 302 to a presigned CDN URL with `X-Repo-Commit`,
  `X-Linked-Etag: "<sha256>"`, `X-Linked-Size` (those two on the 302 only). REV is a branch ("main") or a
  full commit sha (older commits keep resolving to their bytes after a push).
- Errors as the Hub sends them (header `X-Error-Code`, `X-Error-Message`, JSON body {"error": ...}):
  unknown repo: 401 `RepoNotFound` without an Authorization header, 404 with one; unknown revision: 404
  `RevisionNotFound`; unknown file: 404 `EntryNotFound` (with X-Repo-Commit); missing token (when --token):
  401 `RepoNotFound` "Invalid username or password."; wrong token: 401 "Invalid credentials in Authorization
  header"; gated repo (--gated): resolve and paths-info answer 401 `GatedRepo` "... Please log in." without
  an Authorization header and 403 `GatedRepo` "Access to model ORG/NAME is restricted and you are not in the
  authorized list. Visit .../ORG/NAME to ask for access." with one (model info and the tree stay readable,
  as on the Hub, where a gated repo's file list is public).
- LFS vs regular: a file is LFS when its size is >= --lfs-min (default 1024) or its name matches an
  --lfs-pattern; so small `*.json` files are regular git files.
- Commit sha: deterministic, sha1 over the parent commit and the (path, git oid) list.

CDN (port Q): `GET|HEAD /repos/xx/yy/<sha256>?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Date=...&X-Amz-Expires=N
&X-Amz-SignedHeaders=host&X-Amz-Signature=<hmac>`: checks the HMAC (403 `SignatureDoesNotMatch`) and the
expiry (403 `AccessDenied` "Request has expired"), honours `Range: bytes=a-b` (206 + Content-Range, 416 when
unsatisfiable), If-Match (412), HEAD; its ETag is the content's md5 (as S3's), not the sha256. An
`Authorization` header reaching the CDN is counted (`authorization_seen_on_cdn`) and answered 400 as S3 does
for a presigned URL that also carries one (`--cdn-allow-auth` to serve it anyway, still counted).

Control endpoints (on the hub port, no token needed):
- `GET /_control/log`: {"requests": {kind: n}, "status": {code: n}, "authorization_seen_on_cdn": n,
  "bytes_served": {"hub": n, "cdn": n}, "recent": [last 500 requests]}; `POST /_control/reset-log`.
- `POST /_control/push?repo=ORG/NAME`: re-read the repo's directory, make a new commit (always a new sha,
  even with the same bytes); `main` moves, the old sha still resolves to the old bytes (each commit's files
  are copied into a content-addressed temp store, unless --no-copy). Answers {"repo", "sha", "previous"}.
- `POST /_control/expire`: every presigned URL issued so far answers 403 expired from now on.
- `POST /_control/cdn-base?url=http://127.0.0.1:R`: advertise another CDN base in the 302s (a fault proxy
  in front of the CDN); `POST /_control/gate?repo=ORG/NAME&gated=1|0`; `GET /_control/repos`.
"""

import argparse
import base64
import calendar
import fnmatch
import hashlib
import hmac
import json
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from email.utils import formatdate
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import QuietHandler, Server, V6Server, send_file_range  # noqa: E402

LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n"


def git_blob_sha1(data_len, chunks):
    h = hashlib.sha1(b"blob %d\0" % data_len)
    for c in chunks:
        h.update(c)
    return h.hexdigest()


class Blob:
    """One file's content: where it is on disk and its digests."""

    __slots__ = ("disk", "size", "sha256", "git_sha1", "md5", "mtime")

    def __init__(self, disk, size, sha256, git_sha1, md5, mtime):
        self.disk, self.size, self.sha256, self.git_sha1, self.md5, self.mtime = disk, size, sha256, git_sha1, md5, mtime


class Entry:
    __slots__ = ("path", "blob", "lfs", "oid", "pointer_size")

    def __init__(self, path, blob, lfs):
        self.path, self.blob, self.lfs = path, blob, lfs
        if lfs:
            ptr = (LFS_POINTER % (blob.sha256, blob.size)).encode()
            self.oid = git_blob_sha1(len(ptr), [ptr])
            self.pointer_size = len(ptr)
        else:
            self.oid = blob.git_sha1
            self.pointer_size = None

    def tree_json(self):
        d = {"type": "file", "oid": self.oid, "size": self.blob.size, "path": self.path}
        if self.lfs:
            d["lfs"] = {"oid": self.blob.sha256, "size": self.blob.size, "pointerSize": self.pointer_size}
        return d


class Commit:
    def __init__(self, sha, files, parent, when):
        self.sha, self.files, self.parent, self.when = sha, files, parent, when  # files: path -> Entry
        dirs = set()
        for p in files:
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        self.dirs = dirs
        self.sorted_paths = sorted(list(files) + list(dirs))

    def dir_oid(self, d):
        pre = d + "/"
        h = hashlib.sha1()
        for p in self.sorted_paths:
            if p.startswith(pre):
                h.update(p.encode() + b"\0" + (self.files[p].oid.encode() if p in self.files else b"tree") + b"\n")
        return h.hexdigest()

    def entry_json(self, p):
        if p in self.files:
            return self.files[p].tree_json()
        return {"type": "directory", "oid": self.dir_oid(p), "size": 0, "path": p}

    def listing(self, path, recursive):
        """Tree entries under `path` ('' = root); None when path is neither a directory nor a file."""
        if path and path in self.files:
            return [self.entry_json(path)]
        if path and path not in self.dirs:
            return None
        pre = path + "/" if path else ""
        out = []
        for p in self.sorted_paths:
            if not p.startswith(pre) or p == path:
                continue
            rest = p[len(pre):]
            if not recursive and "/" in rest:
                continue
            out.append(self.entry_json(p))
        # The Hub lists directories before files at each level; keep a stable order: dirs first, then files.
        out.sort(key=lambda e: (e["type"] != "directory", e["path"]))
        return out


class Repo:
    def __init__(self, name, src):
        self.name, self.src = name, src
        self.commits = {}  # sha -> Commit
        self.head = None  # Commit
        self.gated = False


class Hub:
    def __init__(self, args):
        self.args = args
        self.lock = threading.RLock()
        self.repos = {}
        self.blobs = {}  # sha256 -> Blob (content-addressed; the CDN serves from here)
        self.secret = secrets.token_bytes(32)
        self.generation = 0  # bumped by /_control/expire: URLs signed in an older generation are expired
        self.store = None if args.no_copy else tempfile.mkdtemp(prefix="hub-standin-")
        if self.store:
            _common.on_exit(lambda: shutil.rmtree(self.store, ignore_errors=True))
        self.cdn_base = None
        self.hub_base = None
        self.stats_lock = threading.Lock()
        self.counts = Counter()
        self.status = Counter()
        self.bytes_hub = 0
        self.bytes_cdn = 0
        self.auth_on_cdn = 0
        self.recent = deque(maxlen=500)

    # ---- repos -------------------------------------------------------------------------------------------
    def is_lfs(self, path, size):
        if size >= self.args.lfs_min:
            return True
        base = path.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatch(base, pat) or fnmatch.fnmatch(path, pat) for pat in self.args.lfs_pattern)

    def ingest(self, src_path):
        """Hash (and unless --no-copy, copy into the content-addressed store) one file: a Blob."""
        st = os.stat(src_path)
        size = st.st_size
        s256, s1, m5 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size), hashlib.md5()
        tmp = None
        out = None
        if self.store:
            fd, tmp = tempfile.mkstemp(dir=self.store, prefix=".in-")
            out = os.fdopen(fd, "wb")
        n = 0
        with open(src_path, "rb") as f:
            while True:
                buf = f.read(1 << 20)
                if not buf:
                    break
                n += len(buf)
                s256.update(buf)
                s1.update(buf)
                m5.update(buf)
                if out:
                    out.write(buf)
        if n != size:  # changed while read: take what was read
            s1 = hashlib.sha1(b"blob %d\0" % n)
            with open(tmp or src_path, "rb") as f:
                for buf in iter(lambda: f.read(1 << 20), b""):
                    s1.update(buf)
            size = n
        sha256 = s256.hexdigest()
        with self.lock:
            if sha256 in self.blobs:
                if out:
                    out.close()
                    os.unlink(tmp)
                return self.blobs[sha256]
            disk = src_path
            if out:
                out.close()
                disk = os.path.join(self.store, sha256)
                os.replace(tmp, disk)
            b = Blob(disk, size, sha256, s1.hexdigest(), m5.hexdigest(), st.st_mtime)
            self.blobs[sha256] = b
            return b

    def snapshot(self, repo):
        files = {}
        for root, dirs, names in os.walk(repo.src):
            dirs[:] = sorted(d for d in dirs if d != ".git")
            for nm in sorted(names):
                full = os.path.join(root, nm)
                if not os.path.isfile(full):
                    continue
                rel = os.path.relpath(full, repo.src).replace(os.sep, "/")
                blob = self.ingest(full)
                files[rel] = Entry(rel, blob, self.is_lfs(rel, blob.size))
        parent = repo.head.sha if repo.head else ""
        h = hashlib.sha1(("parent %s\n" % parent).encode())
        for p in sorted(files):
            h.update(("%s %s\n" % (files[p].oid, p)).encode())
        c = Commit(h.hexdigest(), files, repo.head, time.time())
        with self.lock:
            repo.commits[c.sha] = c
            repo.head = c
        return c

    def add_repo(self, name, src):
        r = Repo(name, os.path.abspath(src))
        self.repos[name] = r
        self.snapshot(r)

    def commit_for(self, repo, rev):
        rev = unquote(rev)
        with self.lock:
            if rev in ("main", "refs/heads/main"):
                return repo.head
            return repo.commits.get(rev)

    # ---- presigned URLs ----------------------------------------------------------------------------------
    def sign(self, path, date, expires, gen):
        msg = ("%s\n%s\n%s\n%s" % (path, date, expires, gen)).encode()
        return hmac.new(self.secret, msg, hashlib.sha256).hexdigest()

    def presign(self, blob, filename):
        path = "/repos/%s/%s/%s" % (blob.sha256[:2], blob.sha256[2:4], blob.sha256)
        date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        expires = str(self.args.expires)
        gen = str(self.generation)
        q = [
            ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
            ("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD"),
            ("X-Amz-Credential", "STANDIN/%s/us-east-1/s3/aws4_request" % date[:8]),
            ("X-Amz-Date", date),
            ("X-Amz-Expires", expires),
            ("X-Amz-Signature", self.sign(path, date, expires, gen)),
            ("X-Amz-SignedHeaders", "host"),
            ("X-Standin-Gen", gen),
            ("response-content-disposition", 'inline; filename="%s";' % filename),
            ("x-id", "GetObject"),
        ]
        return self.cdn_base + path + "?" + urlencode(q, quote_via=quote)

    # ---- stats -------------------------------------------------------------------------------------------
    def note(self, origin, h, kind, status, nbytes, auth):
        with self.stats_lock:
            self.counts[kind] += 1
            self.status[str(status)] += 1
            if origin == "cdn":
                self.bytes_cdn += nbytes
            else:
                self.bytes_hub += nbytes
            self.recent.append(
                {"t": round(time.time(), 3), "origin": origin, "method": h.command, "path": h.path[:300], "kind": kind,
                 "status": status, "range": h.headers.get("Range"), "bytes": nbytes, "authorization": auth}
            )

    def log_json(self):
        with self.stats_lock:
            return {
                "requests": dict(self.counts),
                "status": dict(self.status),
                "authorization_seen_on_cdn": self.auth_on_cdn,
                "bytes_served": {"hub": self.bytes_hub, "cdn": self.bytes_cdn},
                "recent": list(self.recent),
            }

    def reset_log(self):
        with self.stats_lock:
            self.counts.clear()
            self.status.clear()
            self.bytes_hub = self.bytes_cdn = self.auth_on_cdn = 0
            self.recent.clear()


def hub_error(h, status, code, message, headers=()):
    hd = [("X-Error-Message", message)] + list(headers)
    if code:
        hd.insert(0, ("X-Error-Code", code))
    h.send_json(status, {"error": message}, hd)
    return status


class HubHandler(QuietHandler):
    hub = None  # set on the class

    def do_HEAD(self):
        self.route()

    def do_GET(self):
        self.route()

    def do_POST(self):
        self.route()

    def auth(self):
        """'ok', 'missing' or 'invalid' against --token ('ok' when no token is required)."""
        got = self.headers.get("Authorization")
        tok = self.hub.args.token
        if tok is None:
            return "ok"
        if got is None:
            return "missing"
        return "ok" if got == "Bearer " + tok else "invalid"

    def route(self):
        hub = self.hub
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p != ""]
        query = parse_qs(url.query)
        body = self.drain_body() if self.command == "POST" else b""
        kind, status, nbytes = "hub.other", 0, 0
        try:
            if parts[:1] == ["_control"]:
                kind = "control"
                status, nbytes = self.control(parts[1:], query)
                return
            a = self.auth()
            if a != "ok":
                kind = "hub.unauthorized"
                if a == "missing":
                    status = hub_error(self, 401, "RepoNotFound", "Invalid username or password.")
                else:
                    status = hub_error(self, 401, None, "Invalid credentials in Authorization header")
                return
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                kind, status, nbytes = self.api(parts[2:], query, body)
            elif len(parts) >= 5 and parts[2] == "resolve":
                kind, status, nbytes = self.resolve(parts)
            else:
                status = hub_error(self, 404, None, "Sorry, we can't find the page you are looking for.")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            status = status or 499
        finally:
            if kind != "control" or parts[1:2] != ["log"]:
                hub.note("hub", self, kind, status, nbytes, self.headers.get("Authorization") is not None)

    def find(self, org, name, rev):
        """(repo, commit, error-status) for ORG/NAME at REV; sends the error answer itself."""
        repo = self.hub.repos.get(org + "/" + name)
        if repo is None:
            if self.headers.get("Authorization") is None:
                return None, None, hub_error(self, 401, "RepoNotFound", "Repository not found")
            return None, None, hub_error(self, 404, "RepoNotFound", "Repository not found")
        if rev is None:
            return repo, repo.head, 0
        c = self.hub.commit_for(repo, rev)
        if c is None:
            return repo, None, hub_error(self, 404, "RevisionNotFound", "Invalid rev id: %s" % unquote(rev))
        return repo, c, 0

    def gated_error(self, repo):
        if self.headers.get("Authorization") is None:
            msg = ("Access to model %s is restricted. You must have access to it and be authenticated to access it. "
                   "Please log in." % repo.name)
            return hub_error(self, 401, "GatedRepo", msg)
        msg = ("Access to model %s is restricted and you are not in the authorized list. Visit %s/%s to ask for access."
               % (repo.name, self.hub.hub_base, repo.name))
        return hub_error(self, 403, "GatedRepo", msg)

    def info_json(self, repo, c, blobs):
        sib = []
        for p in sorted(c.files):
            e = c.files[p]
            d = {"rfilename": p}
            if blobs:
                d["size"] = e.blob.size
                d["blobId"] = e.oid
                if e.lfs:
                    d["lfs"] = {"sha256": e.blob.sha256, "size": e.blob.size, "pointerSize": e.pointer_size}
            sib.append(d)
        when = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(c.when))
        org = repo.name.split("/")[0]
        return {
            "_id": hashlib.sha1(repo.name.encode()).hexdigest()[:24],
            "id": repo.name, "modelId": repo.name, "author": org, "sha": c.sha,
            "lastModified": when, "createdAt": when, "private": self.hub.args.token is not None,
            "gated": "manual" if repo.gated else False, "disabled": False,
            "downloads": 0, "likes": 0, "tags": [], "library_name": None, "siblings": sib,
        }

    def api(self, rest, query, body):
        org, name = rest[0], rest[1]
        tail = rest[2:]
        if not tail or tail[0] == "revision":
            rev = tail[1] if len(tail) >= 2 else None
            repo, c, err = self.find(org, name, rev)
            if err:
                return "api.info", err, 0
            blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
            n = self.send_json(200, self.info_json(repo, c, blobs))
            return "api.info", 200, n
        if tail[0] == "tree" and len(tail) >= 2:
            repo, c, err = self.find(org, name, tail[1])
            if err:
                return "api.tree", err, 0
            path = unquote("/".join(tail[2:])).strip("/")
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            items = c.listing(path, recursive)
            if items is None:
                return "api.tree", hub_error(self, 404, "EntryNotFound", "%s does not exist on \"%s\"" % (path, c.sha),
                                             [("X-Repo-Commit", c.sha)]), 0
            try:
                start = int(base64.urlsafe_b64decode(query["cursor"][0].encode()).decode()) if "cursor" in query else 0
            except Exception:
                return "api.tree", hub_error(self, 400, None, "Invalid cursor"), 0
            size = self.hub.args.page_size
            page = items[start:start + size]
            headers = [("X-Repo-Commit", c.sha)]
            if start + size < len(items):
                q = {k: v[0] for k, v in query.items() if k != "cursor"}
                q["cursor"] = base64.urlsafe_b64encode(str(start + size).encode()).decode()
                nxt = "%s%s?%s" % (self.hub.hub_base, urlsplit(self.path).path, urlencode(q))
                headers.append(("Link", '<%s>; rel="next"' % nxt))
            n = self.send_json(200, page, headers)
            return "api.tree", 200, n
        if tail[0] == "paths-info" and len(tail) >= 2 and self.command == "POST":
            repo, c, err = self.find(org, name, tail[1])
            if err:
                return "api.paths_info", err, 0
            if repo.gated:
                return "api.paths_info", self.gated_error(repo), 0
            ctype = self.headers.get("Content-Type", "")
            if "json" in ctype:
                paths = json.loads(body or b"{}").get("paths", [])
            else:
                paths = parse_qs(body.decode()).get("paths", [])
            out = []
            for p in paths:
                p = p.strip("/")
                if p in c.files or p in c.dirs:
                    out.append(c.entry_json(p))
            n = self.send_json(200, out, [("X-Repo-Commit", c.sha)])
            return "api.paths_info", 200, n
        return "api.other", hub_error(self, 404, None, "Not Found"), 0

    def resolve(self, parts):
        org, name, rev = parts[0], parts[1], parts[3]
        path = unquote("/".join(parts[4:]))
        repo, c, err = self.find(org, name, rev)
        if err:
            return "resolve.error", err, 0
        if repo.gated:
            return "resolve.gated", self.gated_error(repo), 0
        e = c.files.get(path)
        if e is None:
            return "resolve.error", hub_error(self, 404, "EntryNotFound", "Entry not found", [("X-Repo-Commit", c.sha)]), 0
        if e.lfs:
            loc = self.hub.presign(e.blob, path.rsplit("/", 1)[-1])
            body = ("Found. Redirecting to %s" % loc).encode()
            self.send_response(302)
            self.send_header("Location", loc)
            self.send_header("X-Repo-Commit", c.sha)
            self.send_header("X-Linked-Etag", '"%s"' % e.blob.sha256)
            self.send_header("X-Linked-Size", str(e.blob.size))
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            return "resolve.redirect", 302, 0
        etag = '"%s"' % e.oid
        n = send_file_range(self, e.blob.disk, e.blob.size, headers=[("X-Repo-Commit", c.sha)], etag=etag,
                            last_modified=formatdate(c.when, usegmt=True))
        return "resolve.file" + (".range" if self.headers.get("Range") else ""), self.last_status, n

    def control(self, parts, query):
        hub = self.hub
        what = parts[0] if parts else ""
        q = {k: v[0] for k, v in query.items()}
        if what == "log":
            return 200, self.send_json(200, hub.log_json())
        if what == "reset-log" and self.command == "POST":
            hub.reset_log()
            return 200, self.send_json(200, {"ok": True})
        if what == "repos":
            with hub.lock:
                out = {n: {"sha": r.head.sha, "commits": list(r.commits), "gated": r.gated, "dir": r.src}
                       for n, r in hub.repos.items()}
            return 200, self.send_json(200, out)
        if what == "push" and self.command == "POST":
            r = hub.repos.get(q.get("repo", ""))
            if r is None:
                return 404, self.send_json(404, {"error": "no such repo %r" % q.get("repo")})
            prev = r.head.sha
            c = hub.snapshot(r)
            return 200, self.send_json(200, {"repo": r.name, "sha": c.sha, "previous": prev})
        if what == "expire" and self.command == "POST":
            with hub.lock:
                hub.generation += 1
            return 200, self.send_json(200, {"generation": hub.generation})
        if what == "cdn-base" and self.command == "POST":
            hub.cdn_base = q.get("url", hub.cdn_base).rstrip("/")
            return 200, self.send_json(200, {"cdn": hub.cdn_base})
        if what == "gate" and self.command == "POST":
            r = hub.repos.get(q.get("repo", ""))
            if r is None:
                return 404, self.send_json(404, {"error": "no such repo %r" % q.get("repo")})
            r.gated = q.get("gated", "1") not in ("0", "false")
            return 200, self.send_json(200, {"repo": r.name, "gated": r.gated})
        return 404, self.send_json(404, {"error": "unknown control %r" % what})


def s3_error(h, status, code, message):
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message></Error>'
            % (code, message)).encode()
    return h.send_bytes(status, body, "application/xml")


class CdnHandler(QuietHandler):
    hub = None

    def do_HEAD(self):
        self.serve()

    def do_GET(self):
        self.serve()

    def serve(self):
        hub = self.hub
        auth = self.headers.get("Authorization")
        kind, status, nbytes = "cdn.get", 0, 0
        try:
            if auth is not None:
                with hub.stats_lock:
                    hub.auth_on_cdn += 1
                sys.stderr.write("hub_standin: Authorization header reached the CDN: %s %s\n" % (self.command, self.path[:120]))
                if not hub.args.cdn_allow_auth:
                    kind, status = "cdn.authorization", 400
                    s3_error(self, 400, "InvalidArgument",
                             "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, Signature "
                             "query string parameter or the Authorization header should be specified")
                    return
            url = urlsplit(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            parts = url.path.split("/")
            blob = hub.blobs.get(parts[-1]) if url.path.startswith("/repos/") and len(parts) == 5 else None
            date, expires, sig = q.get("X-Amz-Date"), q.get("X-Amz-Expires"), q.get("X-Amz-Signature")
            gen = q.get("X-Standin-Gen", "")
            if blob is None:
                kind, status = "cdn.not_found", 404
                s3_error(self, 404, "NoSuchKey", "The specified key does not exist.")
                return
            if not (date and expires and sig) or not hmac.compare_digest(sig, hub.sign(url.path, date, expires, gen)):
                kind, status = "cdn.bad_signature", 403
                s3_error(self, 403, "SignatureDoesNotMatch",
                         "The request signature we calculated does not match the signature you provided.")
                return
            try:
                t0 = calendar.timegm(time.strptime(date, "%Y%m%dT%H%M%SZ"))
                life = int(expires)
            except ValueError:
                kind, status = "cdn.bad_signature", 403
                s3_error(self, 403, "AuthorizationQueryParametersError", "X-Amz-Date or X-Amz-Expires is malformed")
                return
            if time.time() > t0 + life or int(gen or 0) < hub.generation:
                kind, status = "cdn.expired", 403
                s3_error(self, 403, "AccessDenied", "Request has expired")
                return
            disp = q.get("response-content-disposition")
            headers = [("Content-Disposition", disp)] if disp else []
            kind = "cdn." + self.command.lower() + (".range" if self.headers.get("Range") else "")
            nbytes = send_file_range(self, blob.disk, blob.size, headers=headers, etag='"%s"' % blob.md5,
                                     last_modified=formatdate(blob.mtime, usegmt=True))
            status = self.last_status
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            status = status or 499
        finally:
            hub.note("cdn", self, kind, status, nbytes, auth is not None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0, help="hub port (0: pick one)")
    ap.add_argument("--cdn-port", type=int, default=0, help="CDN port (0: pick one)")
    ap.add_argument("--cdn-host", default="localhost", help="host name the 302s name for the CDN (default localhost)")
    ap.add_argument("--repo", action="append", default=[], metavar="ORG/NAME=DIR", help="serve DIR as repo ORG/NAME")
    ap.add_argument("--token", default=None, help="require Authorization: Bearer TOKEN on the hub")
    ap.add_argument("--gated", action="append", default=[], metavar="ORG/NAME")
    ap.add_argument("--expires", type=int, default=3600, help="presigned URL lifetime in seconds (default 3600)")
    ap.add_argument("--lfs-min", type=int, default=1024, help="files of at least this size are LFS (default 1024)")
    ap.add_argument("--lfs-pattern", action="append", default=[], help="also LFS: names matching this glob")
    ap.add_argument("--page-size", type=int, default=1000, help="tree API entries per page (default 1000)")
    ap.add_argument("--no-copy", action="store_true",
                    help="serve files from the repo dirs in place (faster start; old commits then see new bytes)")
    ap.add_argument("--cdn-allow-auth", action="store_true", help="serve CDN requests carrying Authorization (still counted)")
    _common.add_lifetime_args(ap)
    args = ap.parse_args()

    hub = Hub(args)
    for spec in args.repo:
        name, sep, d = spec.partition("=")
        if not sep or name.count("/") != 1 or not os.path.isdir(d):
            ap.error("--repo wants ORG/NAME=DIR with an existing DIR: %r" % spec)
        hub.add_repo(name, d)
    for g in args.gated:
        if g not in hub.repos:
            ap.error("--gated %s: no such --repo" % g)
        hub.repos[g].gated = True

    HubHandler.hub = hub
    CdnHandler.hub = hub
    hub_srv = Server(("127.0.0.1", args.port), HubHandler)
    cdn_srv = Server(("127.0.0.1", args.cdn_port), CdnHandler)
    cdn_port = cdn_srv.server_address[1]
    servers = [hub_srv, cdn_srv]
    if args.cdn_host == "localhost":  # `localhost` may resolve to ::1 first: answer there too when we can
        try:
            servers.append(V6Server(("::1", cdn_port), CdnHandler))
        except OSError:
            pass
    hub.hub_base = "http://127.0.0.1:%d" % hub_srv.server_address[1]
    hub.cdn_base = "http://%s:%d" % (args.cdn_host, cdn_port)
    _common.apply_lifetime_args(args)
    _common.ready({"hub": hub.hub_base, "cdn": hub.cdn_base, "commits": {n: r.head.sha for n, r in hub.repos.items()}})
    _common.serve_forever(*servers)


if __name__ == "__main__":
    main()
