#!/usr/bin/env python3
"""Check tools/peers/remote/hub_standin.py with the Hub's own client (huggingface_hub, PyPI), end to end.

Makes a temp repo (a small safetensors file, LFS by `--lfs-pattern '*.safetensors'` as on the Hub, config.json, a GGUF-like binary >= 2 MB, a file in a
sub-directory), starts the stand-in with a required token and a second, gated repo, then with
`HF_ENDPOINT` pointing at it, `HF_HUB_DISABLE_XET=1` and `HF_TOKEN` set:
- `HfApi().list_repo_tree(recursive=True)` (and a paginated listing): paths, sizes, git oids, lfs sha256;
- `hf_hub_download` of a regular and an LFS file, at `main` and at the commit sha (fresh caches);
- `HfFileSystem().open(...)` with a seek and a read (a ranged read through the 302 to the CDN);
- no token / a wrong token / a gated repo / a missing file / a missing revision raise the client's errors;
- a push (`POST /_control/push`): main moves, the old commit still downloads the old bytes;
- an expired presigned URL answers 403 (`POST /_control/expire`), a fresh resolve works again;
- the CDN behind tools/peers/remote/fault_proxy.py (`POST /_control/cdn-base`): reads go through the proxy;
- the stand-in's log: ranged CDN reads happened and no Authorization header ever reached the CDN.
All bytes are compared with the local files. Prints one line per check and exits non-zero on any failure.

    python3 tools/peers/remote/check_hub_standin.py [-v]
"""

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "hf_standin_check_token"
REPO = "xpackfs-test/tiny-model"
GATED = "xpackfs-test/gated-model"

failures = []


def check(name, fn):
    try:
        fn()
        print("ok    %s" % name, flush=True)
    except Exception as e:  # noqa: BLE001
        failures.append(name)
        print("FAIL  %s: %s: %s" % (name, type(e).__name__, e), flush=True)
        if "-v" in sys.argv:
            traceback.print_exc()


def expect_raises(exc_types, fn):
    try:
        fn()
    except exc_types as e:
        return e
    raise AssertionError("expected %s, nothing raised" % (exc_types,))


def make_repo(d):
    os.makedirs(os.path.join(d, "sub"))
    # A small safetensors file: 8-byte little-endian header length, JSON header, data.
    data = struct.pack("<8f", *range(8))
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [2, 4], "data_offsets": [0, len(data)]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + data)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["Tiny"], "hidden_size": 4}, f)
    # GGUF-like: magic, version 3, zero tensors/kv, then 2.5 MB of deterministic bytes.
    body = b"".join(hashlib.sha256(b"%d" % i).digest() for i in range(2_500_000 // 32))
    with open(os.path.join(d, "model-Q4_K.gguf"), "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + body)
    with open(os.path.join(d, "sub", "notes.txt"), "w") as f:
        f.write("a regular file in a sub-directory\n")


def local_bytes(d, p):
    with open(os.path.join(d, p), "rb") as f:
        return f.read()


def main():
    tmp = tempfile.mkdtemp(prefix="check-hub-standin-")
    repo_dir = os.path.join(tmp, "repo")
    gated_dir = os.path.join(tmp, "gated")
    make_repo(repo_dir)
    os.makedirs(gated_dir)
    with open(os.path.join(gated_dir, "config.json"), "w") as f:
        f.write("{}")
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "hub_standin.py"), "--port", "0", "--repo", "%s=%s" % (REPO, repo_dir),
         "--repo", "%s=%s" % (GATED, gated_dir), "--gated", GATED, "--token", TOKEN, "--page-size", "2",
         "--lfs-pattern", "*.safetensors"],
        stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
    )
    try:
        ready = json.loads(proc.stdout.readline())
        hub, cdn = ready["hub"], ready["cdn"]
        commit0 = ready["commits"][REPO]
        print("stand-in: %s (cdn %s), commit %s" % (hub, cdn, commit0), flush=True)
        os.environ.update({
            "HF_ENDPOINT": hub, "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": TOKEN, "HF_HOME": os.path.join(tmp, "hf_home"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_ETAG_TIMEOUT": "10",
        })
        os.environ.pop("HF_HUB_OFFLINE", None)
        run_checks(tmp, repo_dir, hub, cdn, commit0)
    finally:
        proc.terminate()
        proc.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % len(failures) if failures else "all checks passed", flush=True)
    return 1 if failures else 0


def control(hub, what, method="GET"):
    req = urllib.request.Request(hub + "/_control/" + what, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def run_checks(tmp, repo_dir, hub, cdn, commit0):
    import huggingface_hub
    from huggingface_hub import HfApi, HfFileSystem, hf_hub_download
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    print("huggingface_hub %s" % huggingface_hub.__version__, flush=True)
    api = HfApi(endpoint=hub, token=TOKEN)
    files = ["config.json", "model-Q4_K.gguf", "model.safetensors", "sub/notes.txt"]
    ncache = [0]

    def fresh_cache():
        ncache[0] += 1
        return os.path.join(tmp, "cache%d" % ncache[0])

    def tree():
        entries = list(api.list_repo_tree(REPO, recursive=True))  # page size 2: follows the Link header
        got = {e.path: e for e in entries}
        assert set(got) == set(files) | {"sub"}, sorted(got)
        for p in files:
            b = local_bytes(repo_dir, p)
            e = got[p]
            assert e.size == len(b), (p, e.size, len(b))
            big = len(b) >= 1024 or p.endswith(".safetensors")  # --lfs-pattern, as the Hub's .gitattributes
            assert (e.lfs is not None) == big, (p, e.lfs)
            if big:
                assert e.lfs.sha256 == hashlib.sha256(b).hexdigest(), p
                assert e.blob_id != e.lfs.sha256
            else:
                assert e.blob_id == hashlib.sha1(b"blob %d\0" % len(b) + b).hexdigest(), p
        top = {e.path for e in api.list_repo_tree(REPO)}
        assert top == {"config.json", "model-Q4_K.gguf", "model.safetensors", "sub"}, top
        sub = [e.path for e in api.list_repo_tree(REPO, path_in_repo="sub")]
        assert sub == ["sub/notes.txt"], sub

    def info():
        mi = api.model_info(REPO)
        assert mi.sha == commit0, mi.sha
        assert sorted(s.rfilename for s in mi.siblings) == files
        mi = api.model_info(REPO, revision=commit0, files_metadata=True)
        sizes = {s.rfilename: s.size for s in mi.siblings}
        assert sizes["model-Q4_K.gguf"] == os.path.getsize(os.path.join(repo_dir, "model-Q4_K.gguf"))
        assert api.file_exists(REPO, "sub/notes.txt") and not api.file_exists(REPO, "nope.bin")

    def download(name, rev):
        def f():
            p = hf_hub_download(REPO, name, revision=rev, cache_dir=fresh_cache())
            with open(p, "rb") as fh:
                assert fh.read() == local_bytes(repo_dir, name), "bytes differ"
        return f

    def fs_range():
        fs = HfFileSystem(endpoint=hub, token=TOKEN)
        want = local_bytes(repo_dir, "model-Q4_K.gguf")
        with fs.open("%s/model-Q4_K.gguf" % REPO, "rb", block_size=64 * 1024) as f:
            f.seek(1_234_567)
            got = f.read(10_000)
            assert got == want[1_234_567:1_244_567], "range bytes differ"
            f.seek(0)
            assert f.read(4) == b"GGUF"
        with fs.open("%s@%s/model.safetensors" % (REPO, commit0), "rb") as f:
            f.seek(8)
            assert f.read(5) == local_bytes(repo_dir, "model.safetensors")[8:13]
        assert fs.cat_file("%s/config.json" % REPO) == local_bytes(repo_dir, "config.json")
        assert fs.info("%s/model-Q4_K.gguf" % REPO)["size"] == len(want)
        log = control(hub, "log")
        assert log["requests"].get("cdn.get.range", 0) >= 1, log["requests"]

    def no_token():
        e = expect_raises(RepositoryNotFoundError, lambda: hf_hub_download(REPO, "config.json", token=False,
                                                                           cache_dir=fresh_cache()))
        assert e.response.status_code == 401
        api_anon = HfApi(endpoint=hub, token=False)
        expect_raises(RepositoryNotFoundError, lambda: list(api_anon.list_repo_tree(REPO)))

    def wrong_token():
        e = expect_raises(HfHubHTTPError, lambda: hf_hub_download(REPO, "config.json", token="hf_wrong",
                                                                  cache_dir=fresh_cache()))
        assert e.response.status_code == 401, e.response.status_code

    def gated():
        e = expect_raises(GatedRepoError, lambda: hf_hub_download(GATED, "config.json", cache_dir=fresh_cache()))
        assert e.response.status_code == 403 and e.response.headers["X-Error-Code"] == "GatedRepo"
        assert "ask for access" in str(e), str(e)

    def missing():
        expect_raises(EntryNotFoundError, lambda: hf_hub_download(REPO, "nope.bin", cache_dir=fresh_cache()))
        expect_raises(RevisionNotFoundError, lambda: hf_hub_download(REPO, "config.json", revision="f" * 40,
                                                                     cache_dir=fresh_cache()))
        expect_raises(RepositoryNotFoundError, lambda: hf_hub_download("xpackfs-test/absent", "config.json",
                                                                       cache_dir=fresh_cache()))

    def push():
        old_cfg = local_bytes(repo_dir, "config.json")
        old_gguf = local_bytes(repo_dir, "model-Q4_K.gguf")
        with open(os.path.join(repo_dir, "config.json"), "w") as f:
            json.dump({"architectures": ["Tiny"], "hidden_size": 8}, f)
        with open(os.path.join(repo_dir, "model-Q4_K.gguf"), "r+b") as f:  # overwritten in place
            f.seek(1_000_000)
            f.write(b"\xff" * 4096)
        r = control(hub, "push?repo=" + REPO, "POST")
        assert r["previous"] == commit0 and r["sha"] != commit0, r
        assert api.model_info(REPO).sha == r["sha"]
        for name, old in (("config.json", old_cfg), ("model-Q4_K.gguf", old_gguf)):
            p = hf_hub_download(REPO, name, revision=commit0, cache_dir=fresh_cache())
            assert open(p, "rb").read() == old, "old commit gives new bytes: " + name
            p = hf_hub_download(REPO, name, cache_dir=fresh_cache())
            assert open(p, "rb").read() == local_bytes(repo_dir, name), "main gives old bytes: " + name
        fs = HfFileSystem(endpoint=hub, token=TOKEN)
        with fs.open("%s@%s/model-Q4_K.gguf" % (REPO, commit0), "rb") as f:
            f.seek(1_000_000)
            assert f.read(4096) == old_gguf[1_000_000:1_004_096]

    def expiry():
        req = urllib.request.Request(hub + "/%s/resolve/main/model-Q4_K.gguf" % REPO, method="HEAD",
                                     headers={"Authorization": "Bearer " + TOKEN})

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *a, **k):
                return None

        opener = urllib.request.build_opener(NoRedirect)
        try:
            opener.open(req, timeout=10)
            raise AssertionError("no 302")
        except urllib.error.HTTPError as e:
            assert e.code == 302 and e.headers["X-Linked-Size"], e.code
            loc = e.headers["Location"]
        with urllib.request.urlopen(urllib.request.Request(loc, headers={"Range": "bytes=0-3"}), timeout=10) as r:
            assert r.status == 206 and r.read() == b"GGUF"
        control(hub, "expire", "POST")
        try:
            urllib.request.urlopen(urllib.request.Request(loc, headers={"Range": "bytes=0-3"}), timeout=10)
            raise AssertionError("expired URL still served")
        except urllib.error.HTTPError as e:
            assert e.code == 403, e.code
        # resolving again gives a fresh URL: the client's path works again
        p = hf_hub_download(REPO, "model-Q4_K.gguf", cache_dir=fresh_cache())
        assert open(p, "rb").read() == local_bytes(repo_dir, "model-Q4_K.gguf")

    def cdn_behind_proxy():
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fault_proxy.py"), "--upstream", cdn, "--port", "0",
                                 "--log", os.path.join(tmp, "cdn-proxy.jsonl")], stdout=subprocess.PIPE, text=True)
        try:
            proxy = json.loads(proc.stdout.readline())["proxy"]
            control(hub, "cdn-base?url=" + proxy, "POST")
            fs = HfFileSystem(endpoint=hub, token=TOKEN, skip_instance_cache=True)
            with fs.open("%s/model-Q4_K.gguf" % REPO, "rb", block_size=32 * 1024) as f:
                f.seek(2_000_000)
                assert f.read(1000) == local_bytes(repo_dir, "model-Q4_K.gguf")[2_000_000:2_001_000]
            for name in ("model.safetensors", "model-Q4_K.gguf"):
                p = hf_hub_download(REPO, name, cache_dir=fresh_cache())
                assert open(p, "rb").read() == local_bytes(repo_dir, name), name
            for _ in range(40):  # an entry is written just after its answer ends: give the last one a moment
                seen = [json.loads(x) for x in open(os.path.join(tmp, "cdn-proxy.jsonl"))]
                if len(seen) >= 3:
                    break
                time.sleep(0.05)
            assert len(seen) >= 3 and all(e["path"].startswith("/repos/") and e["status"] in (200, 206) for e in seen), seen
        finally:
            control(hub, "cdn-base?url=" + cdn, "POST")
            proc.terminate()
            proc.wait(5)

    def no_auth_on_cdn():
        log = control(hub, "log")
        assert log["authorization_seen_on_cdn"] == 0, log["authorization_seen_on_cdn"]
        assert log["requests"].get("cdn.get", 0) + log["requests"].get("cdn.get.range", 0) >= 4, log["requests"]
        assert log["requests"].get("resolve.redirect", 0) >= 4, log["requests"]

    check("list_repo_tree recursive, paginated, per-directory", tree)
    check("model_info (main, commit sha, files_metadata), file_exists", info)
    check("hf_hub_download regular file at main", download("config.json", "main"))
    check("hf_hub_download regular file at commit sha", download("config.json", commit0))
    check("hf_hub_download small safetensors, LFS by --lfs-pattern, at main", download("model.safetensors", "main"))
    check("hf_hub_download LFS GGUF at main", download("model-Q4_K.gguf", "main"))
    check("hf_hub_download LFS GGUF at commit sha", download("model-Q4_K.gguf", commit0))
    check("hf_hub_download file in a sub-directory", download("sub/notes.txt", None))
    check("HfFileSystem open/seek/read (ranged through the CDN), cat, info", fs_range)
    check("no token -> 401 RepositoryNotFoundError", no_token)
    check("wrong token -> 401", wrong_token)
    check("gated repo -> 403 GatedRepoError", gated)
    check("missing file / revision / repo -> the client's errors", missing)
    check("push: main moves, the old commit keeps its bytes", push)
    check("expired presigned URL -> 403, resolve again works", expiry)
    check("CDN behind fault_proxy.py (POST /_control/cdn-base): ranged read and download through it", cdn_behind_proxy)
    check("no Authorization header reached the CDN", no_auth_on_cdn)


if __name__ == "__main__":
    sys.exit(main())
