#!/usr/bin/env python3
"""Start the object-store and HTTP servers of the remote-source tests (issue 24) on loopback, load them with
files, and print where they are: one JSON line on stdout, then serve until killed. Also usable as a library
(`start_moto`, `upload`, `RangeHandler`).

Subcommands (each also takes --parent-pid PID and --exit-on-stdin-eof; all bind 127.0.0.1 only):

  s3     moto's S3 server, in this process (moto.server.ThreadedMotoServer, the same app as
         `python3 -m moto.server -p PORT`), a bucket, and uploads through the S3 API (boto3):
           python3 tools/peers/remote/servers.py s3 --port 0 --bucket models --upload DIR_OR_FILE[=PREFIX] ...
               [--multipart-threshold BYTES (default 8 MiB)] [--part-size BYTES (default 5 MiB, moto's minimum)]
               [--checksum-sha256] [--versioning] [--auth] [--public]
         prints {"s3": "http://127.0.0.1:P", "endpoint": same, "bucket", "region": "us-east-1",
                 "access_key_id", "secret_access_key", "objects": {key: {"size", "etag", "multipart",
                 "version_id"?, "checksum_sha256"?}}}
         Files at least --multipart-threshold big go up as a multipart upload (ETag `"<md5 of part md5s>-N"`),
         the others with one PutObject (ETag `"<md5>"`). --checksum-sha256 asks for SHA256 checksums on the single-part
         uploads (they then carry a full-object `x-amz-checksum-sha256`: HEAD/GET with `x-amz-checksum-mode:
         ENABLED`); multipart uploads go without one (see `upload`: moto's composite checksum looks like a
         full-object one). --versioning turns bucket
         versioning on (objects get a version id). Without --auth moto accepts any credentials (the printed
         ones are "testing"); with --auth moto checks SigV4 signatures and keys: the printed keys belong to an
         IAM user allowed everything, and any other key is refused (403 InvalidAccessKeyId / SignatureDoesNot
         Match): the bad-credentials tests. Unsigned requests are refused (403) unless --public (a bucket
         policy allowing anonymous GetObject and ListBucket: the `no_sign_request` tests).
         moto GETs honour Range (206, 416) and If-Match (412); it copies the whole object per GET, so it is for
         correctness, not speed.

  s3-put replace or add one object in a running s3 server (the object-overwritten-while-mounted test):
           python3 tools/peers/remote/servers.py s3-put --endpoint URL --bucket B --key K --file F
               [--access-key-id ID --secret-access-key S] [--multipart-threshold ..] [--part-size ..]
         prints {"key", "size", "etag", "version_id"?}

  http   a static file server that honours Range (Python's http.server does not):
           python3 tools/peers/remote/servers.py http --port 0 --root DIR
         prints {"http": "http://127.0.0.1:P", "root": DIR}
         GET/HEAD /<relative path>: 200, or 206 + Content-Range for one `bytes=` range, 416 (with
         `Content-Range: bytes */size`) when unsatisfiable; `ETag: "<mtime ns hex>-<size hex>"` (changes when the
         file is replaced), Last-Modified, Accept-Ranges; If-Match (412), If-None-Match (304), If-Range.
         Files are opened per request, so replacing a file under the root replaces the object.
         --tls DIR: the same over HTTPS; a test CA and a certificate for 127.0.0.1 signed by it are made
         in DIR (openssl), and the ready line says {"http": "https://127.0.0.1:P", "ca": DIR/ca.pem}.

  azurite / gcs / gcs-put   see the notes at the end of this docstring (what starts here and how to load it).

Notes on the emulators (tried on this machine, 2 cores; the `azurite` and `gcs` subcommands do all of it):
- Azurite 3.35.0 (npm `azurite`, `npm install -g azurite`: 374 packages, about 45 s; tools/deps.sh installs
  it): starts in about 1 s with
    azurite-blob --blobHost 127.0.0.1 --blobPort P --location DIR --skipApiVersionCheck --loose --silent \
        --disableTelemetry
  (without --disableTelemetry it tries to reach its telemetry host and logs a DNS error). Endpoint
  http://127.0.0.1:P/devstoreaccount1, the well-known development account `devstoreaccount1` and key
  `Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==` (SharedKey
  signing, or the connection string printed). Loaded here with the Azure SDK (`azure-storage-blob`). Seen:
  ranged GETs (x-ms-range / Range) answer 206; If-Match with a wrong ETag answers 412; ETags look like
  `"0x8DC..."`. `servers.py azurite --port 0 --upload DIR[=PREFIX]` prints {"azure": endpoint, "account",
  "key", "container", "connection_string", "objects": {name: {"size", "etag"}}}.
- gcp-storage-emulator 2026.7.19 (PyPI, the newest, with google-cloud-storage to upload): what `gcp-storage-emulator
  start --host 127.0.0.1 --port P --in-memory` runs, started here in this process (`create_server`) so that
  what it lacks can be added first (`patch_gcs_emulator`, below); clients find it by
  `STORAGE_EMULATOR_HOST=http://127.0.0.1:P` (google-cloud-storage with AnonymousCredentials). Seen on the
  emulator alone: media GETs (`/download/storage/v1/b/B/o/OBJ?alt=media`, `/storage/v1/b/B/o/OBJ?alt=media`,
  and the XML-style `/B/OBJ`) honour Range (206 + Content-Range) but answer HTTP/1.0 without an ETag or
  Last-Modified, and IGNORE both `ifGenerationMatch` and If-Match (206 with the bytes); listing
  `/storage/v1/b/B/o?prefix=` works; object_store's GCS client (XML API) cannot read from it: HEAD /B/KEY answers
  501 (no do_HEAD), the XML listing GET /B?list-type=2 answers 501, and its GETs lack the ETag and Last-Modified
  that object_store requires. With the additions (the comment above `patch_gcs_emulator` lists them; README,
  "Remote sources"), object_store reads and lists it, and If-Match answers 412 after an overwrite.
  `servers.py gcs --port 0 --upload DIR[=PREFIX]` prints {"gcs": endpoint, "bucket", "objects": {name: {"size",
  "etag" (the JSON API's), "xml_etag" (what HEAD/GET/list send), "generation", "md5", "crc32c"}}}.
  `servers.py gcs-put --endpoint URL --bucket B --key K --file F` replaces one object (new generation and, for
  other bytes, a new ETag) and prints {"key", "size", "etag", "xml_etag", ...}.
- moto 5.2.1 (S3): answers `Connection: close` (no keep-alive) and echoes the upload's
  `x-amz-content-sha256` on GETs of single-part objects (not an S3 response header: do not take it as a
  digest); SigV4 signatures made for a fault_proxy.py address verify through the proxy (checked with --auth).
"""

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from email.utils import formatdate
from urllib.parse import unquote, urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import QuietHandler, Server, send_file_range  # noqa: E402

MIB = 1 << 20
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, timeout=60.0, proc=None):
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise SystemExit("server exited with %s before listening" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("nothing listens on 127.0.0.1:%d after %.0f s" % (port, timeout))


def walk_files(spec):
    """DIR_OR_FILE[=PREFIX] -> [(local path, key)]."""
    path, _, prefix = spec.partition("=")
    path = os.path.abspath(path)
    if os.path.isfile(path):
        return [(path, prefix or os.path.basename(path))]
    out = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for nm in sorted(names):
            full = os.path.join(root, nm)
            rel = os.path.relpath(full, path).replace(os.sep, "/")
            out.append((full, (prefix.rstrip("/") + "/" + rel) if prefix else rel))
    return out


# ---- S3 (moto) --------------------------------------------------------------------------------------------
def s3_client(endpoint, key_id="testing", secret="testing", region="us-east-1"):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret,
                        region_name=region, config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2},
                                                          request_checksum_calculation="when_required",
                                                          response_checksum_validation="when_required"))


def upload(s3, bucket, local, key, multipart_threshold=8 * MIB, part_size=5 * MIB, checksum_sha256=False):
    """Upload one file, single-part or multipart by size; returns the object's description."""
    size = os.path.getsize(local)
    # SHA256 on single-part uploads only: a multipart SHA256 checksum is a composite (checksum of the part
    # checksums), and moto states it without the "-N" suffix and without x-amz-checksum-type, so it would pass
    # for a full-object sha256. (S3 has FULL_OBJECT multipart checksums for the CRCs only.)
    extra = {"ChecksumAlgorithm": "SHA256"} if checksum_sha256 and size < multipart_threshold else {}
    if size < multipart_threshold:
        with open(local, "rb") as f:
            r = s3.put_object(Bucket=bucket, Key=key, Body=f.read(), **extra)
        multipart = False
    else:
        mp = s3.create_multipart_upload(Bucket=bucket, Key=key, **extra)
        parts = []
        with open(local, "rb") as f:
            i = 1
            while True:
                buf = f.read(part_size)
                if not buf and i > 1:
                    break
                pr = s3.upload_part(Bucket=bucket, Key=key, UploadId=mp["UploadId"], PartNumber=i, Body=buf, **extra)
                part = {"PartNumber": i, "ETag": pr["ETag"]}
                if checksum_sha256 and "ChecksumSHA256" in pr:
                    part["ChecksumSHA256"] = pr["ChecksumSHA256"]
                parts.append(part)
                i += 1
                if len(buf) < part_size:
                    break
        r = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=mp["UploadId"],
                                         MultipartUpload={"Parts": parts})
        multipart = True
    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    out = {"size": head["ContentLength"], "etag": head["ETag"], "multipart": multipart}
    if head.get("VersionId") and head["VersionId"] != "null":
        out["version_id"] = head["VersionId"]
    if head.get("ChecksumSHA256"):
        out["checksum_sha256"] = head["ChecksumSHA256"]
    del r
    return out


def start_moto(port=0, auth=False):
    """moto's server on 127.0.0.1 in this process; returns (server, endpoint, (key id, secret))."""
    if auth:
        # moto checks credentials after this many unauthenticated actions: the IAM set-up below.
        os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    from moto.server import ThreadedMotoServer

    if not os.environ.get("XPACKFS_SERVER_VERBOSE"):
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    host, p = srv.get_host_and_port()
    endpoint = "http://127.0.0.1:%d" % p
    creds = ("testing", "testing")
    if auth:
        import boto3

        iam = boto3.client("iam", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                           region_name="us-east-1")
        iam.create_user(UserName="xpackfs-test")  # 1
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="xpackfs-test", PolicyName="all", PolicyDocument=json.dumps(policy))  # 2
        k = iam.create_access_key(UserName="xpackfs-test")["AccessKey"]  # 3
        creds = (k["AccessKeyId"], k["SecretAccessKey"])
    return srv, endpoint, creds


def cmd_s3(args):
    srv, endpoint, (kid, secret) = start_moto(args.port, args.auth)
    s3 = s3_client(endpoint, kid, secret)
    s3.create_bucket(Bucket=args.bucket)
    if args.public:  # anonymous (unsigned) reads allowed: the no_sign_request tests
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*",
                                                          "Action": ["s3:GetObject", "s3:ListBucket"],
                                                          "Resource": ["arn:aws:s3:::%s" % args.bucket,
                                                                       "arn:aws:s3:::%s/*" % args.bucket]}]}
        s3.put_bucket_policy(Bucket=args.bucket, Policy=json.dumps(policy))
    if args.versioning:
        s3.put_bucket_versioning(Bucket=args.bucket, VersioningConfiguration={"Status": "Enabled"})
    objects = {}
    for spec in args.upload:
        for local, key in walk_files(spec):
            objects[key] = upload(s3, args.bucket, local, key, args.multipart_threshold, args.part_size,
                                  args.checksum_sha256)
    _common.apply_lifetime_args(args)
    _common.ready({"s3": endpoint, "endpoint": endpoint, "bucket": args.bucket, "region": "us-east-1",
                   "access_key_id": kid, "secret_access_key": secret, "objects": objects})
    wait_forever()


def cmd_s3_put(args):
    s3 = s3_client(args.endpoint, args.access_key_id, args.secret_access_key)
    d = upload(s3, args.bucket, args.file, args.key, args.multipart_threshold, args.part_size, args.checksum_sha256)
    d["key"] = args.key
    print(json.dumps(d), flush=True)


def wait_forever():
    import signal

    signal.signal(signal.SIGTERM, lambda *_: _common.die(0))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        _common.die(0)


# ---- static HTTP with Range ---------------------------------------------------------------------------------
class RangeHandler(QuietHandler):
    root = "."

    def do_GET(self):
        self.serve()

    def do_HEAD(self):
        self.serve()

    def serve(self):
        rel = unquote(urlsplit(self.path).path).lstrip("/")
        full = os.path.realpath(os.path.join(self.root, rel))
        root = os.path.realpath(self.root)
        if not (full == root or full.startswith(root + os.sep)) or not os.path.isfile(full):
            self.send_bytes(404, b"not found\n", "text/plain")
            return
        try:
            st = os.stat(full)
            etag = '"%x-%x"' % (st.st_mtime_ns, st.st_size)
            send_file_range(self, full, st.st_size, etag=etag, last_modified=formatdate(st.st_mtime, usegmt=True))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def make_tls_files(d):
    """A test CA and a certificate for 127.0.0.1 signed by it (openssl), written to directory d:
    ca.pem (what a client trusts), leaf.pem and leaf.key (what the server presents)."""
    os.makedirs(d, exist_ok=True)
    p = lambda n: os.path.join(d, n)  # noqa: E731
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", p("ca.key"), "-out", p("ca.pem"), "-days", "2", "-subj", "/CN=xpackfs test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    run("req", *ec, "-keyout", p("leaf.key"), "-out", p("leaf.csr"), "-subj", "/CN=127.0.0.1")
    with open(p("leaf.ext"), "w") as f:
        f.write("basicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", p("leaf.csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"), "-CAcreateserial",
        "-out", p("leaf.pem"), "-days", "2", "-extfile", p("leaf.ext"))
    return p("ca.pem"), p("leaf.pem"), p("leaf.key")


def cmd_http(args):
    RangeHandler.root = os.path.abspath(args.root)
    srv = Server(("127.0.0.1", args.port), RangeHandler)
    scheme, extra = "http", {}
    if args.tls:
        import ssl

        ca, cert, key = make_tls_files(args.tls)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        scheme, extra = "https", {"ca": ca}
    _common.apply_lifetime_args(args)
    _common.ready({"http": "%s://127.0.0.1:%d" % (scheme, srv.server_address[1]), "root": RangeHandler.root, **extra})
    _common.serve_forever(srv)


# ---- Azurite ------------------------------------------------------------------------------------------------
def azurite_conn_str(endpoint):
    return ("DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;BlobEndpoint=%s;"
            % (AZURITE_ACCOUNT, AZURITE_KEY, endpoint))


def child(cmd, **kw):
    """Start a server child in its own process group; killed with this process."""
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True, **kw)

    def kill():
        try:
            os.killpg(p.pid, 15)
            p.wait(3)
        except Exception:
            try:
                os.killpg(p.pid, 9)
            except Exception:
                pass

    _common.on_exit(kill)
    return p


def cmd_azurite(args):
    exe = shutil.which("azurite-blob")
    if not exe:
        raise SystemExit("azurite-blob not found: npm install -g azurite")
    port = args.port or free_port()
    loc = args.location or tempfile.mkdtemp(prefix="azurite-")
    if not args.location:
        _common.on_exit(lambda: shutil.rmtree(loc, ignore_errors=True))
    p = child([exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", loc, "--skipApiVersionCheck",
               "--loose", "--silent", "--disableTelemetry"])
    try:
        wait_port(port, 60, p)
        endpoint = "http://127.0.0.1:%d/%s" % (port, AZURITE_ACCOUNT)
        from azure.storage.blob import BlobServiceClient

        svc = BlobServiceClient.from_connection_string(azurite_conn_str(endpoint))
        cont = svc.create_container(args.container)
        objects = {}
        for spec in args.upload:
            for local, key in walk_files(spec):
                with open(local, "rb") as f:
                    cont.upload_blob(key, f, overwrite=True, max_concurrency=1)
                props = cont.get_blob_client(key).get_blob_properties()
                objects[key] = {"size": props.size, "etag": props.etag}
    except BaseException:
        import traceback

        traceback.print_exc()
        _common.die(1)
    _common.apply_lifetime_args(args)
    _common.ready({"azure": endpoint, "account": AZURITE_ACCOUNT, "key": AZURITE_KEY, "container": args.container,
                   "connection_string": azurite_conn_str(endpoint), "objects": objects})
    wait_forever()


# ---- gcp-storage-emulator -----------------------------------------------------------------------------------
# What the emulator lacks and the test adds. object_store 0.14's GCS client speaks GCS's XML API
# (`{base}/BUCKET/PERCENT-ENCODED-KEY`) and makes three kinds of request; gcp-storage-emulator 2026.7.19 (the
# newest on PyPI) serves none of them as object_store needs. `patch_gcs_emulator` adds, on the emulator's own
# router (`server.HANDLERS`, `RequestHandler`) and from its own stored object metadata (`storage`), only this:
#   1. HEAD /BUCKET/KEY (object_store's `head`: the size and ETag xpackfs pins at mount): the emulator's
#      request handler has no do_HEAD (501). Added: the emulator's own XML-path GET, sent without the body.
#   2. ETag and Last-Modified on GET /BUCKET/KEY (ranged and whole): the emulator sends neither, and
#      object_store requires both on every GET and HEAD. Added: `ETag: "<hex MD5>"` (what GCS's XML API sends
#      for a non-composite object; from the stored md5Hash) and Last-Modified (from the stored `updated`).
#   3. If-Match on GET/HEAD /BUCKET/KEY (xpackfs makes every read conditional on the pinned ETag): the
#      emulator ignores it. Added: 412 PreconditionFailed when no listed ETag (or `*`) matches.
#   4. GET /BUCKET?list-type=2&prefix=&delimiter= (object_store's listing, ListObjectsV2 style): no route
#      (501). Added: a ListBucketResult of the emulator's own listing (`storage.get_file_list`), Key, Size,
#      LastModified, ETag per object, CommonPrefixes, in one page (no continuation token; max-keys not
#      applied; start-after applied).
# Left as the emulator has it: HTTP/1.0, one request at a time, no `x-goog-generation` header (so xpackfs
# pins the ETag only, and its reads carry no `?generation=`), `?generation=` and `x-goog-if-generation-match`
# ignored on reads, the JSON API's media GETs (`/download/storage/v1/...`, `?alt=media`) unchanged.
def _gcs_xml_etag(obj):
    return '"%s"' % base64.b64decode(obj["md5Hash"]).hex()


def _gcs_last_modified(obj, http=True):
    from datetime import datetime, timezone

    t = datetime.strptime(obj["updated"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    return formatdate(t.timestamp(), usegmt=True) if http else obj["updated"]


def patch_gcs_emulator():
    """Add to gcp-storage-emulator what object_store's GCS client needs (see the comment above); idempotent."""
    import re
    from http import HTTPStatus
    from xml.sax.saxutils import escape

    from gcp_storage_emulator import server as gsrv
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects as gobj

    if getattr(gsrv, "_xpackfs_patched", False):
        return
    gsrv._xpackfs_patched = True
    xml_object = r"^/(?P<bucket_name>[-.\w]+)/(?P<object_id>.*[^/]+)$"

    def xml_error(res, status, code):
        res.status = status
        res.write_file(("<?xml version='1.0' encoding='UTF-8'?><Error><Code>%s</Code></Error>" % code).encode(),
                       content_type="application/xml; charset=UTF-8")

    def xml_get(req, res, storage, *args, **kwargs):  # 2 and 3, around the emulator's own download
        try:
            obj = storage.get_file_obj(req.params["bucket_name"], req.params["object_id"])
        except NotFound:
            return xml_error(res, HTTPStatus.NOT_FOUND, "NoSuchKey")
        etag = _gcs_xml_etag(obj)
        want = req.get_header("If-Match")
        if want is not None and "*" not in want and etag not in [t.strip() for t in want.split(",")]:
            return xml_error(res, HTTPStatus.PRECONDITION_FAILED, "PreconditionFailed")
        gobj.download(req, res, storage)
        if res.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            res["ETag"] = etag
            res["Last-Modified"] = _gcs_last_modified(obj)

    def xml_list(req, res, storage, *args, **kwargs):  # 4
        q = {k: v[0] for k, v in req.query.items()}
        try:
            files, prefixes = storage.get_file_list(req.params["bucket_name"], q.get("prefix"), q.get("delimiter"))
        except NotFound:
            return xml_error(res, HTTPStatus.NOT_FOUND, "NoSuchBucket")
        after = q.get("start-after", "")
        files = [o for o in files if o["name"] > after]
        prefixes = [p for p in prefixes if p > after]
        out = ["<?xml version='1.0' encoding='UTF-8'?>",
               '<ListBucketResult xmlns="http://doc.s3.amazonaws.com/2006-03-01">',
               "<Name>%s</Name><Prefix>%s</Prefix><KeyCount>%d</KeyCount><IsTruncated>false</IsTruncated>"
               % (escape(req.params["bucket_name"]), escape(q.get("prefix", "")), len(files) + len(prefixes))]
        for o in files:
            out.append("<Contents><Key>%s</Key><Generation>%s</Generation><LastModified>%s</LastModified>"
                       "<ETag>%s</ETag><Size>%s</Size></Contents>"
                       % (escape(o["name"]), o["generation"], _gcs_last_modified(o, http=False),
                          escape(_gcs_xml_etag(o)), o["size"]))
        for p in prefixes:
            out.append("<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>" % escape(p))
        out.append("</ListBucketResult>")
        res.write_file("".join(out).encode(), content_type="application/xml; charset=UTF-8")

    handlers = []
    for regex, methods in gsrv.HANDLERS:
        if regex == xml_object:
            methods = dict(methods, GET=xml_get)
        handlers.append((regex, methods))
    if not any(r == xml_object for r, _ in handlers):
        raise SystemExit("gcp-storage-emulator: no XML object route where 2026.7.19 has it; update servers.py")
    handlers.append((r"^/(?P<bucket_name>[-.\w]+)$", {"GET": xml_list}))  # after the /b and /wipe routes
    gsrv.HANDLERS = tuple(handlers)
    route = re.compile(xml_object)

    class HeadResponse(gsrv.Response):
        def close(self):  # the GET's status and headers; Content-Length that of the body not sent
            body = self._content.encode() if isinstance(self._content, str) else self._content
            self._handler.send_response(self.status.value, self.status.phrase)
            for k, v in self._headers.items():
                self._handler.send_header(k, v)
            self._handler.send_header("Content-Length", str(len(body)))
            self._handler.end_headers()

    def do_HEAD(handler):  # 1
        req, res = gsrv.Request(handler, "HEAD"), HeadResponse(handler)
        m = route.fullmatch(req.path)
        if m:
            req.set_match(m)
            xml_get(req, res, handler.storage)
        else:
            res.status = HTTPStatus.NOT_IMPLEMENTED
        res.close()

    gsrv.RequestHandler.do_HEAD = do_HEAD


def gcs_client(endpoint):
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(credentials=AnonymousCredentials(), project="xpackfs-test")


def gcs_upload(bucket, local, key):
    blob = bucket.blob(key)
    blob.upload_from_filename(local)
    blob.reload()
    return {"size": blob.size, "etag": blob.etag, "generation": blob.generation, "md5": blob.md5_hash,
            "crc32c": blob.crc32c, "xml_etag": _gcs_xml_etag({"md5Hash": blob.md5_hash})}


def cmd_gcs(args):
    import logging

    if not os.environ.get("XPACKFS_SERVER_VERBOSE"):
        logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)
    try:
        patch_gcs_emulator()
        from gcp_storage_emulator.server import create_server

        # The emulator in this process (what `gcp-storage-emulator start --host H --port P --in-memory` runs).
        emu = create_server("127.0.0.1", args.port, in_memory=True)
        emu.start()
        _common.on_exit(emu.stop)
        endpoint = "http://127.0.0.1:%d" % emu._api._httpd.server_address[1]
        bucket = gcs_client(endpoint).create_bucket(args.bucket)
        objects = {}
        for spec in args.upload:
            for local, key in walk_files(spec):
                objects[key] = gcs_upload(bucket, local, key)
    except BaseException:
        import traceback

        traceback.print_exc()
        _common.die(1)
    _common.apply_lifetime_args(args)
    _common.ready({"gcs": endpoint, "bucket": args.bucket, "objects": objects})
    wait_forever()


def cmd_gcs_put(args):
    d = gcs_upload(gcs_client(args.endpoint).bucket(args.bucket), args.file, args.key)
    d["key"] = args.key
    print(json.dumps(d), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("s3", help="moto S3 server + bucket + uploads")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--bucket", default="models")
    s.add_argument("--upload", action="append", default=[], metavar="PATH[=PREFIX]")
    s.add_argument("--multipart-threshold", type=int, default=8 * MIB)
    s.add_argument("--part-size", type=int, default=5 * MIB)
    s.add_argument("--checksum-sha256", action="store_true")
    s.add_argument("--versioning", action="store_true")
    s.add_argument("--auth", action="store_true", help="moto checks signatures and keys (bad-credentials tests)")
    s.add_argument("--public", action="store_true", help="a bucket policy lets anonymous requests GET and list")
    _common.add_lifetime_args(s)

    s = sub.add_parser("s3-put", help="upload/replace one object in a running S3 server")
    s.add_argument("--endpoint", required=True)
    s.add_argument("--bucket", required=True)
    s.add_argument("--key", required=True)
    s.add_argument("--file", required=True)
    s.add_argument("--access-key-id", default="testing")
    s.add_argument("--secret-access-key", default="testing")
    s.add_argument("--multipart-threshold", type=int, default=8 * MIB)
    s.add_argument("--part-size", type=int, default=5 * MIB)
    s.add_argument("--checksum-sha256", action="store_true")

    s = sub.add_parser("http", help="static files with Range, ETag, Last-Modified")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--root", required=True)
    s.add_argument("--tls", metavar="DIR", help="serve HTTPS with a test CA and certificate made in DIR (ca.pem)")
    _common.add_lifetime_args(s)

    s = sub.add_parser("azurite", help="Azurite blob service + container + uploads (needs npm azurite, azure-storage-blob)")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--container", default="models")
    s.add_argument("--location", default=None, help="Azurite's data dir (default: a temp dir, removed at exit)")
    s.add_argument("--upload", action="append", default=[], metavar="PATH[=PREFIX]")
    _common.add_lifetime_args(s)

    s = sub.add_parser("gcs", help="gcp-storage-emulator + bucket + uploads (needs gcp-storage-emulator, google-cloud-storage)")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--bucket", default="models")
    s.add_argument("--upload", action="append", default=[], metavar="PATH[=PREFIX]")
    _common.add_lifetime_args(s)

    s = sub.add_parser("gcs-put", help="upload/replace one object in a running gcs server")
    s.add_argument("--endpoint", required=True)
    s.add_argument("--bucket", required=True)
    s.add_argument("--key", required=True)
    s.add_argument("--file", required=True)

    args = ap.parse_args()
    {"s3": cmd_s3, "s3-put": cmd_s3_put, "http": cmd_http, "azurite": cmd_azurite, "gcs": cmd_gcs,
     "gcs-put": cmd_gcs_put}[args.cmd](args)


if __name__ == "__main__":
    main()
