"""An S3 request's failure as this project's errors (pipeline.core.storage), in one line naming the URL and never a
credential: what the store's callers act on (a stale version, a missing object, a location that cannot be used, a
request that failed mid-job) rather than botocore's codes."""
from __future__ import annotations

import errno

import botocore.exceptions

from pipeline.core.storage import Stale, StorageError, StorageFailed

_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "InvalidToken",
                "InvalidClientTokenId", "AuthorizationHeaderMalformed"}


class PastTheEnd(Exception):
    """A ranged GET that starts at or past the object's end (416)."""


def ours(e: Exception, *, op: str, where: str, key: str | None, bucket: str, endpoint: str,
         conditional: bool) -> Exception:
    """The error to raise for botocore's `e` from the request `op` on `where` (`conditional`: it named a version)."""
    if isinstance(e, botocore.exceptions.ClientError):
        return _client_error(e, op=op, where=where, key=key, bucket=bucket, endpoint=endpoint, conditional=conditional)
    if isinstance(e, botocore.exceptions.NoCredentialsError):
        return StorageError(f"{where}: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                            f"AWS_PROFILE)")
    if isinstance(e, botocore.exceptions.EndpointConnectionError):
        return StorageError(f"{where}: {endpoint} does not answer (connection refused or no route)")
    return StorageFailed(f"{where}: {op} failed: {type(e).__name__}")


def _client_error(e: botocore.exceptions.ClientError, *, op: str, where: str, key: str | None, bucket: str,
                  endpoint: str, conditional: bool) -> Exception:
    code = e.response.get("Error", {}).get("Code", "")
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    retried = e.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) > 0
    if code in ("PreconditionFailed", "412", "ConditionalRequestConflict") or status in (409, 412):
        # retried: the first try may have succeeded, its reply lost (then the object is this write's); 409: a
        # conflicting conditional write was in flight, which this one did not win
        return Stale(key, retried)
    if conditional and code in ("NoSuchKey", "404"):  # AWS: no version to match, the object is gone
        return Stale(key, retried)
    if code == "NoSuchBucket":
        return StorageError(f"{where}: the bucket {bucket!r} does not exist at {endpoint}")
    if code == "InvalidRange" or status == 416:
        return PastTheEnd()
    if code in _CREDENTIALS or status == 403:
        return StorageError(f"{where}: {endpoint} refused the credentials ({code or status})")
    if code in ("NoSuchKey", "NoSuchUpload", "404") or status == 404:
        return FileNotFoundError(errno.ENOENT, "no such object", where)
    return StorageFailed(f"{where}: {op} failed: {code or status}")
