"""The `Store` of `s3://bucket/prefix`, on boto3.

boto3 rather than obstore or pyarrow's S3FileSystem: it sends every S3 request this project's guarantees rest on, as
S3 defines them: `If-None-Match: *` on PutObject *and* on CompleteMultipartUpload (a create-only large object; obstore's
multipart writes take no put mode, pyarrow's file system has no conditional writes at all), `If-Match` on PutObject
and DeleteObject (a lease), and the multipart calls themselves (list an upload's parts to resume it, list and abort the
uploads a killed writer left), besides ranged GETs. Endpoint and credentials come the standard AWS way (environment,
profiles, `AWS_ENDPOINT_URL`) or an explicit endpoint; no message here carries a credential or an endpoint's userinfo
(failures are translated by pipeline.core.s3_errors).
"""
from __future__ import annotations

import base64
import email.utils
import hashlib
import logging
import math
import os
import zlib
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
from botocore.config import Config

from pipeline.core.faults import fault_point
from pipeline.core.s3_errors import PastTheEnd, ours
from pipeline.core.storage import REQUESTS_AT_ONCE, Exists, ObjectInfo, Stale, StorageError, StorageFailed

# A multipart upload's part and how many are sent at once (what an upload holds in memory at most: 64 MiB). boto3's
# own defaults are 8 MiB parts on 10 threads; bench/s3_write.py measured 32 MiB on 4 threads at 0.63x the raw upload
# rate, 8 MiB on 8 at 0.69-0.83x (bench/README.md "s3_write"). S3's smallest part is 5 MiB.
PART_BYTES = 8 << 20
UPLOAD_THREADS = 8
_MAX_PARTS = 10_000  # S3's limit

# botocore logs at INFO which credential source it found ("Found credentials in environment variables."): a line in
# every command that configures INFO logging (export, verify), saying nothing a user asked about.
logging.getLogger("botocore.credentials").setLevel(logging.WARNING)


def split_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix")."""
    parts = urlsplit(url)
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if "@" in bucket:  # credentials written into the URL: never echoed
        raise StorageError(f"s3://<credentials>@{bucket.rsplit('@', 1)[1]}/{prefix}: credentials do not go in the "
                           f"URL (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)")
    if not bucket or parts.query or parts.fragment:
        raise StorageError(f"{url!r} is not an s3://bucket/prefix URL")
    return bucket, prefix


def _part(number: int, reply: dict) -> dict:
    """A part as CompleteMultipartUpload lists it: its number, ETag and, where S3 gave one, its CRC32."""
    return {"PartNumber": number, "ETag": reply["ETag"],
            **({"ChecksumCRC32": reply["ChecksumCRC32"]} if reply.get("ChecksumCRC32") else {})}


def _retried(e: Stale) -> bool:
    """Whether the client sent the refused conditional request more than once."""
    return len(e.args) > 1 and bool(e.args[1])


def _public(endpoint: str) -> str:
    """An endpoint as a message may show it: without any user:password@."""
    parts = urlsplit(endpoint)
    return parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")).geturl() \
        if parts.hostname else endpoint


class S3Store:
    def __init__(self, url: str, *, endpoint: str | None = None) -> None:
        self.bucket, self.prefix = split_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self._root = f"{self.prefix}/" if self.prefix else ""  # every key of this store starts with it
        endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.endpoint = _public(endpoint) if endpoint else "the AWS endpoint"
        self.endpoint_url = _public(endpoint) if endpoint else None  # what another process opens (no userinfo)
        try:
            self.client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint or None,
                config=Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=10, read_timeout=120,
                              max_pool_connections=UPLOAD_THREADS + REQUESTS_AT_ONCE))
        except botocore.exceptions.BotoCoreError as e:  # a profile that does not exist
            raise StorageError(f"{self.url}: {type(e).__name__}: {e}") from None
        except ValueError:  # botocore's "Invalid endpoint: <the URL as given>" would show its userinfo
            raise StorageError(f"{self.url}: the endpoint {self.endpoint} is not a valid URL") from None
        self._bucket_seen = False

    def _key(self, key: str) -> str:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"{key!r} is not a key under {self.url}")
        return self._root + key

    def _rel(self, full: str) -> str:
        return full[len(self._root):]

    def _call(self, op: str, key: str | None = None, **kw):
        """One S3 request; its failure as this project's errors, in one line naming the URL (never a credential)."""
        where = f"{self.url}/{key}" if key else self.url
        try:
            return getattr(self.client, op)(Bucket=self.bucket, **kw)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as e:
            raise ours(e, op=op, where=where, key=key, bucket=self.bucket, endpoint=self.endpoint,
                       conditional="IfMatch" in kw) from None

    def check(self) -> None:
        """Before a job starts: the bucket exists and these credentials may list it (StorageError naming why)."""
        try:
            self._call("list_objects_v2", Prefix=self._root, MaxKeys=1)
        except StorageFailed as e:
            raise StorageError(str(e)) from None

    @staticmethod
    def _age(response: dict) -> float:
        """Seconds since the object's LastModified by the server's own clock (its Date header): no host's clock
        skew makes a live lease look stale."""
        date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        now = email.utils.parsedate_to_datetime(date) if date else datetime.now(timezone.utc)  # a server without one
        modified = response.get("LastModified")
        return max(0.0, (now - modified).total_seconds()) if modified else 0.0

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if end is not None and end <= start:
            return b""
        span = f"bytes={start}-{'' if end is None else end - 1}"
        try:
            body = self._call("get_object", key, Key=self._key(key),
                              **({"Range": span} if start or end else {}))["Body"]
        except PastTheEnd:  # a range starting at or past the end: no bytes, as a file read there gives
            return b""
        with body:
            return body.read()

    def head(self, key: str) -> ObjectInfo | None:
        try:
            r = self._call("head_object", key, Key=self._key(key))
        except FileNotFoundError:
            if not self._bucket_seen:  # a HEAD's 404 has no body: no such key, or no such bucket
                self.check()
                self._bucket_seen = True
            return None
        return ObjectInfo(key=key, size=r["ContentLength"], etag=r["ETag"], age=self._age(r))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        found = []
        token: dict = {}
        while True:
            page = self._call("list_objects_v2", Prefix=self._root + prefix, **token)
            for o in page.get("Contents", []):
                found.append(ObjectInfo(key=self._rel(o["Key"]), size=o["Size"], etag=o["ETag"],
                                        age=self._age({**page, "LastModified": o["LastModified"]})))
            if not page.get("IsTruncated"):
                return found
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def put(self, key: str, data: bytes, *, create: bool = False, match: str | None = None) -> str:
        cond = {"IfNoneMatch": "*"} if create else {"IfMatch": match} if match is not None else {}
        name = key.rsplit("/", 1)[-1]
        fault_point("write", name)
        try:
            etag = self._call("put_object", key, Key=self._key(key), Body=data, **cond)["ETag"]
        except Stale as e:
            etag = f'"{hashlib.md5(data).hexdigest()}"'
            if not _retried(e) or self._holds(key, etag) is None:
                raise (Exists(key) if create else Stale(key)) from None
        fault_point("rename", name)
        return etag

    def _holds(self, key: str, etag: str) -> ObjectInfo | None:
        """The object when it is the version `etag`: a conditional request the client retried after its first try
        succeeded (its reply lost) is refused because of that first write, which then is this write's."""
        info = self.head(key)
        return info if info is not None and info.etag == etag else None

    def delete(self, key: str, *, match: str | None = None) -> None:
        self._call("delete_object", key, Key=self._key(key), **({"IfMatch": match} if match is not None else {}))

    def upload(self, key: str, path: Path) -> ObjectInfo:
        """A local file as a new object (Exists if the key is there), multipart past one part; an upload of this key
        cut short (kill -9) is resumed, its parts that match the file's bytes kept."""
        size = Path(path).stat().st_size
        part = max(PART_BYTES, math.ceil(size / _MAX_PARTS))
        if size <= part:
            self.put(key, Path(path).read_bytes(), create=True)
        else:
            self._multipart(key, Path(path), size, part)
        info = self.head(key)
        if info is None or info.size != size:  # a verified upload: the object the store holds has the file's size
            raise StorageFailed(f"{self.url}/{key}: uploaded {size} bytes, the store holds "
                                f"{'nothing' if info is None else info.size}")
        return info

    def _multipart(self, key: str, path: Path, size: int, part: int) -> None:
        full, name = self._key(key), key.rsplit("/", 1)[-1]
        upload_id, kept = self._resumable(key, path, part)
        count = math.ceil(size / part)

        def send(n: int) -> dict:
            if n in kept:
                return kept[n]
            with open(path, "rb") as f:
                f.seek((n - 1) * part)
                data = f.read(part)
            r = self._call("upload_part", key, Key=full, UploadId=upload_id, PartNumber=n, Body=data,
                           ChecksumAlgorithm="CRC32")
            fault_point("part", name)
            return _part(n, r)

        with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
            futures = [pool.submit(send, n) for n in range(1, count + 1)]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f.exception() for f in done if f.exception() is not None), None)
            if failed is not None:  # the parts not yet sent are not sent: the upload resumes from the sent ones
                pool.shutdown(cancel_futures=True)
                raise failed
            parts = [f.result() for f in futures]
        fault_point("write", name)
        digests = b"".join(bytes.fromhex(p["ETag"].strip('"')) for p in parts)
        composite = f'"{hashlib.md5(digests).hexdigest()}-{len(parts)}"'  # the ETag S3 gives the completed object
        try:
            self._call("complete_multipart_upload", key, Key=full, UploadId=upload_id, IfNoneMatch="*",
                       MultipartUpload={"Parts": parts})
        except Stale as e:
            if not _retried(e) or self._holds(key, composite) is None:
                self._abort(key, full, upload_id)
                raise Exists(key) from None
        except FileNotFoundError:  # NoSuchUpload: a retry after the completion itself succeeded, its reply lost
            if self._holds(key, composite) is None:
                raise
        fault_point("rename", name)

    def _resumable(self, key: str, path: Path, part: int) -> tuple[str, dict[int, dict]]:
        """The upload to continue for `key` and its parts whose bytes equal the file's (by MD5, the part's ETag), or a
        new upload; other unfinished uploads of the key are aborted."""
        full = self._key(key)
        uploads = sorted((u for u in self._uploads(full) if u["Key"] == full), key=lambda u: u["Initiated"])
        for stale in uploads[:-1]:
            self._abort(key, full, stale["UploadId"])
        if not uploads:
            # CRC32 per part, declared at creation and listed at completion, as boto3's own managed upload does: S3
            # checks every part's bytes on arrival
            return self._call("create_multipart_upload", key, Key=full, ChecksumAlgorithm="CRC32")["UploadId"], {}
        upload_id, kept = uploads[-1]["UploadId"], {}
        marker: dict = {}
        with open(path, "rb") as f:
            while True:
                page = self._call("list_parts", key, Key=full, UploadId=upload_id, **marker)
                for p in page.get("Parts", []):
                    f.seek((p["PartNumber"] - 1) * part)
                    data = f.read(part)
                    if len(data) == p["Size"] and f'"{hashlib.md5(data).hexdigest()}"' == p["ETag"]:
                        # the part's CRC32 from its bytes: not every server lists it (SeaweedFS does not)
                        crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
                        kept[p["PartNumber"]] = _part(p["PartNumber"], {"ChecksumCRC32": crc, **p})
                if not page.get("IsTruncated"):
                    return upload_id, kept
                marker = {"PartNumberMarker": page["NextPartNumberMarker"]}

    def _abort(self, key: str, full: str, upload_id: str) -> None:
        try:
            self._call("abort_multipart_upload", key, Key=full, UploadId=upload_id)
        except FileNotFoundError:  # NoSuchUpload: completed or aborted meanwhile
            pass

    def _uploads(self, prefix: str) -> list[dict]:
        found, marker = [], {}
        while True:
            page = self._call("list_multipart_uploads", Prefix=prefix, **marker)
            found += page.get("Uploads", [])
            if not page.get("IsTruncated"):
                return found
            marker = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}

    def unfinished(self, prefix: str = "") -> list[str]:
        """The keys of multipart uploads begun and never completed or aborted under `prefix`."""
        return sorted(self._rel(u["Key"]) for u in self._uploads(self._root + prefix))

    def abort_unfinished(self, prefix: str = "") -> list[str]:
        left = self._uploads(self._root + prefix)
        for u in left:
            self._abort(self._rel(u["Key"]), u["Key"], u["UploadId"])
        return sorted(self._rel(u["Key"]) for u in left)
