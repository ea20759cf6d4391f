#!/usr/bin/env python3
"""Self-check of tools/peers/remote/servers.py: start each server the way a test does and check what it serves.

- s3 (moto, --auth --versioning --checksum-sha256): single-part ETag `"<md5>"`, multipart `"...-N"`, the
  printed sizes, a ranged GET (206 + Content-Range, the right bytes), If-Match 412, a wrong key and a wrong
  secret refused, SigV4 through fault_proxy.py (with injected 503s, boto3 retrying) still verifying, s3-put
  replacing an object (new ETag and version id), unsigned requests refused; then s3 --public: unsigned GET.
- http: 200/206/416, ETag and Last-Modified, If-Match 412.
- azurite and gcs when their programs are installed (skipped otherwise): uploads and one ranged read; for gcs
  also what servers.py adds to the emulator (HEAD, ETag/Last-Modified, If-Match 412, the XML listing) and gcs-put.
Exits non-zero on any failure.

    python3 tools/peers/remote/check_servers.py
"""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import servers  # noqa: E402

failures = []


def check(name, fn):
    try:
        r = fn()
        print("%s  %s" % ("skip " if r == "skip" else "ok   ", name), flush=True)
    except Exception as e:  # noqa: BLE001
        failures.append(name)
        print("FAIL  %s: %s: %s" % (name, type(e).__name__, e), flush=True)


def start(args):
    p = subprocess.Popen([sys.executable] + args, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line:
        raise RuntimeError("%s exited with %s before its ready line" % (args[:2], p.wait()))
    return p, json.loads(line)


def main():
    tmp = tempfile.mkdtemp(prefix="check-servers-")
    d = os.path.join(tmp, "ckpt")
    os.makedirs(os.path.join(d, "sub"))
    big = os.urandom(11 << 20)  # 11 MiB: multipart in 5 MiB parts -> "-3"
    with open(os.path.join(d, "big.gguf"), "wb") as f:
        f.write(big)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"hidden_size": 8}')
    with open(os.path.join(d, "sub", "small.bin"), "wb") as f:
        f.write(os.urandom(5000))
    procs = []

    def s3():
        p, o = start([os.path.join(HERE, "servers.py"), "s3", "--port", "0", "--bucket", "models", "--upload",
                      d + "=ckpt", "--auth", "--versioning", "--checksum-sha256"])
        procs.append(p)
        objs = o["objects"]
        assert objs["ckpt/big.gguf"]["etag"].endswith('-3"') and objs["ckpt/big.gguf"]["multipart"], objs
        assert objs["ckpt/big.gguf"]["size"] == len(big)
        cfg = objs["ckpt/config.json"]
        assert cfg["etag"] == '"%s"' % hashlib.md5(b'{"hidden_size": 8}').hexdigest(), cfg
        assert cfg["checksum_sha256"] == base64.b64encode(hashlib.sha256(b'{"hidden_size": 8}').digest()).decode()
        assert "checksum_sha256" not in objs["ckpt/big.gguf"] and cfg.get("version_id")
        c = servers.s3_client(o["endpoint"], o["access_key_id"], o["secret_access_key"])
        r = c.get_object(Bucket="models", Key="ckpt/big.gguf", Range="bytes=6000000-6000099")
        assert r["ContentRange"] == "bytes 6000000-6000099/%d" % len(big) and r["Body"].read() == big[6000000:6000100]
        try:
            c.get_object(Bucket="models", Key="ckpt/big.gguf", Range="bytes=0-9", IfMatch='"0"')
            raise AssertionError("If-Match ignored")
        except c.exceptions.ClientError as e:
            assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        for kid, sec in (("AKIAWRONGWRONGWRONG0", "x"), (o["access_key_id"], "wrong")):
            try:
                servers.s3_client(o["endpoint"], kid, sec).head_object(Bucket="models", Key="ckpt/config.json")
                raise AssertionError("bad credentials accepted")
            except servers_client_error() as e:
                assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        try:
            urllib.request.urlopen(o["endpoint"] + "/models/ckpt/config.json", timeout=10)
            raise AssertionError("unsigned GET accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 403
        pp, px = start([os.path.join(HERE, "fault_proxy.py"), "--upstream", o["endpoint"], "--port", "0", "--seed", "5",
                        "--p503", "0.3", "--log", os.path.join(tmp, "s3proxy.jsonl")])
        procs.append(pp)
        import boto3
        from botocore.config import Config

        cp = boto3.client("s3", endpoint_url=px["proxy"], aws_access_key_id=o["access_key_id"],
                          aws_secret_access_key=o["secret_access_key"], region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 10, "mode": "standard"}))
        for i in range(8):
            a = i * 1_000_000
            r = cp.get_object(Bucket="models", Key="ckpt/big.gguf", Range="bytes=%d-%d" % (a, a + 65535))
            assert r["Body"].read() == big[a:a + 65536]
        faults = [json.loads(x)["fault"] for x in open(os.path.join(tmp, "s3proxy.jsonl"))]
        assert "503" in faults, faults
        new = os.path.join(tmp, "new.json")
        with open(new, "w") as f:
            f.write('{"hidden_size": 16}')
        out = subprocess.run([sys.executable, os.path.join(HERE, "servers.py"), "s3-put", "--endpoint", o["endpoint"],
                              "--bucket", "models", "--key", "ckpt/config.json", "--file", new, "--access-key-id",
                              o["access_key_id"], "--secret-access-key", o["secret_access_key"]],
                             capture_output=True, text=True, check=True).stdout
        put = json.loads(out)
        assert put["etag"] != cfg["etag"] and put["version_id"] != cfg["version_id"], put
        try:
            c.get_object(Bucket="models", Key="ckpt/config.json", Range="bytes=0-3", IfMatch=cfg["etag"])
            raise AssertionError("old ETag still matches after the overwrite")
        except c.exceptions.ClientError as e:
            assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        r = c.get_object(Bucket="models", Key="ckpt/config.json", VersionId=cfg["version_id"])
        assert r["Body"].read() == b'{"hidden_size": 8}'

    def servers_client_error():
        import botocore.exceptions

        return botocore.exceptions.ClientError

    def s3_public():
        p, o = start([os.path.join(HERE, "servers.py"), "s3", "--port", "0", "--upload",
                      os.path.join(d, "config.json") + "=pub/config.json", "--public"])
        procs.append(p)
        req = urllib.request.Request(o["endpoint"] + "/models/pub/config.json", headers={"Range": "bytes=1-6"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 206 and r.read() == b'"hidde'

    def http():
        p, o = start([os.path.join(HERE, "servers.py"), "http", "--port", "0", "--root", d])
        procs.append(p)
        u = o["http"] + "/big.gguf"
        with urllib.request.urlopen(urllib.request.Request(u, headers={"Range": "bytes=-10"}), timeout=10) as r:
            assert r.status == 206 and r.read() == big[-10:] and r.headers["ETag"] and r.headers["Last-Modified"]
            etag = r.headers["ETag"]
        for hd, code in (({"Range": "bytes=%d-" % len(big)}, 416), ({"Range": "bytes=0-1", "If-Match": '"x"'}, 412)):
            try:
                urllib.request.urlopen(urllib.request.Request(u, headers=hd), timeout=10)
                raise AssertionError("expected %d" % code)
            except urllib.error.HTTPError as e:
                assert e.code == code, e.code
        with urllib.request.urlopen(urllib.request.Request(u, headers={"If-Match": etag}), timeout=10) as r:
            assert r.status == 200 and r.read() == big

    def azurite():
        if not shutil.which("azurite-blob"):
            return "skip"
        p, o = start([os.path.join(HERE, "servers.py"), "azurite", "--port", "0", "--upload", d + "=ckpt"])
        procs.append(p)
        from azure.storage.blob import BlobServiceClient

        b = BlobServiceClient.from_connection_string(o["connection_string"]).get_blob_client("models", "ckpt/big.gguf")
        assert b.download_blob(offset=5_000_000, length=100).readall() == big[5_000_000:5_000_100]
        assert o["objects"]["ckpt/big.gguf"]["size"] == len(big)

    def gcs():
        try:
            import gcp_storage_emulator  # noqa: F401
        except ImportError:
            return "skip"
        p, o = start([os.path.join(HERE, "servers.py"), "gcs", "--port", "0", "--upload", d + "=ckpt"])
        procs.append(p)
        req = urllib.request.Request(o["gcs"] + "/download/storage/v1/b/models/o/ckpt%2Fbig.gguf?alt=media",
                                     headers={"Range": "bytes=100-199"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 206 and r.read() == big[100:200]
        # What servers.py adds for object_store's XML-API client: HEAD, ETag/Last-Modified, If-Match, listing.
        u = o["gcs"] + "/models/ckpt%2Fbig%2Egguf"
        etag = '"%s"' % hashlib.md5(big).hexdigest()
        assert o["objects"]["ckpt/big.gguf"]["xml_etag"] == etag, o["objects"]["ckpt/big.gguf"]
        with urllib.request.urlopen(urllib.request.Request(u, method="HEAD"), timeout=10) as r:
            assert r.status == 200 and r.read() == b"", r.status
            assert r.headers["Content-Length"] == str(len(big)) and r.headers["ETag"] == etag, dict(r.headers)
            assert r.headers["Last-Modified"].endswith(" GMT"), dict(r.headers)
        with urllib.request.urlopen(urllib.request.Request(u, headers={"Range": "bytes=5000000-5000099",
                                                                       "If-Match": etag}), timeout=10) as r:
            assert r.status == 206 and r.read() == big[5_000_000:5_000_100]
            assert r.headers["ETag"] == etag and r.headers["Last-Modified"]
            assert r.headers["Content-Range"] == "bytes 5000000-5000099/%d" % len(big)
        for hd, code, url in (({"If-Match": '"x"', "Range": "bytes=0-1"}, 412, u),
                              ({}, 404, o["gcs"] + "/models/nothing")):
            for method in ("GET", "HEAD"):
                try:
                    urllib.request.urlopen(urllib.request.Request(url, headers=hd, method=method), timeout=10)
                    raise AssertionError("%s: expected %d" % (method, code))
                except urllib.error.HTTPError as e:
                    assert e.code == code, (method, e.code)
        with urllib.request.urlopen(o["gcs"] + "/models?list-type=2&delimiter=%2F&prefix=ckpt%2F", timeout=10) as r:
            x = r.read().decode()
            assert "<Key>ckpt/big.gguf</Key>" in x and "<Key>ckpt/config.json</Key>" in x, x
            assert "<Prefix>ckpt/sub/</Prefix>" in x and "ckpt/sub/small.bin" not in x, x
            assert "<ETag>%s</ETag><Size>%d</Size>" % (etag, len(big)) in x, x
        # gcs-put: a new object under the key; the old ETag's If-Match now gets 412.
        new = os.path.join(tmp, "new.bin")
        with open(new, "wb") as f:
            f.write(b"replaced" * 100)
        put = subprocess.run([sys.executable, os.path.join(HERE, "servers.py"), "gcs-put", "--endpoint", o["gcs"],
                              "--bucket", "models", "--key", "ckpt/big.gguf", "--file", new],
                             capture_output=True, text=True, check=True)
        assert json.loads(put.stdout)["size"] == 800, put.stdout
        try:
            urllib.request.urlopen(urllib.request.Request(u, headers={"If-Match": etag}), timeout=10)
            raise AssertionError("If-Match of the replaced object's ETag was served")
        except urllib.error.HTTPError as e:
            assert e.code == 412, e.code
        with urllib.request.urlopen(u, timeout=10) as r:
            assert r.read() == b"replaced" * 100 and r.headers["ETag"] == json.loads(put.stdout)["xml_etag"]

    try:
        check("s3: single/multipart ETags, range, If-Match, bad keys, SigV4 through the fault proxy, overwrite", s3)
        check("s3 --public: unsigned ranged GET", s3_public)
        check("http: suffix range, 416, If-Match, ETag, Last-Modified", http)
        check("azurite: upload and ranged read (skipped when not installed)", azurite)
        check("gcs: upload, ranged read, the added HEAD/ETag/If-Match/listing, gcs-put (skipped if not installed)", gcs)
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % len(failures) if failures else "all checks passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
