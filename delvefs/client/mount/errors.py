"""The client's errors, and every decision that turns someone else's failure into an errno.

Two exceptions carry an errno: :class:`StoreError` (S3 and the cache directory: raised by
``delvefs.client.mount.s3async``, ``delvefs.client.mount.cache.datacache`` and ``delvefs.client.mount.cache.journal``) and :class:`FsError` (what a
file system operation answers; ``delvefs.client.mount.fuse_adapter``'s guard is the only place
that turns it into a FUSE reply). The table of what becomes which errno:

==============================================  ==========  ===========================
failure                                         errno       decided by
==============================================  ==========  ===========================
S3 NoSuchKey, NoSuchVersion, NotFound, 404      ENOENT      ``errno_of_s3_code``
S3 412, PreconditionFailed                      EAGAIN      ``errno_of_s3_code``: the
  (the object changed under a pinned GET)                   ``Changed`` condition
S3 InvalidTag, InvalidTagKey, InvalidTagValue,  EINVAL      ``errno_of_s3_code``
  BadRequest
S3 403, AccessDenied                            EACCES      ``errno_of_s3_code``
any other S3 failure                            EIO         ``errno_of_s3_code``,
                                                            ``store_error``
S3 unreachable (refused, reset, timed out, 5xx, none: the   ``reads.Reads._revalidate``
  throttled) when an open asks whether a        cached      (``stale_if_error``; off:
  cached copy is current                        copy        EIO)
a download's cache file: disk full (ENOSPC,     the same    ``store_error``
  EDQUOT, EFBIG)
a cache file (data, journal) refused: OSError   its errno,  ``cache_file_error``,
                                                else EIO    ``cache_failure``,
                                                            ``errno_of_oserror``
a block an open file needs could not be         EIO         ``read_failed``
  fetched (S3 failed, or its version is gone:
  412, 404; the cache disk refused)
the handler still scans the bucket: a view      EAGAIN      ``handler_failure``
  never listed after ``DELVEFS_SCAN_WAIT``,
  ``user.delvefs.sync`` at once
the handler unreachable, not answering in       EIO         ``handler_failure``
  time, or any other refusal: a view never
  listed, ``user.delvefs.sync``
any handler failure, other operations on a      none: its   ``listings.Listings.fresh``
  view listed before                            last        (stale)
                                                listing
a write to a read-only view                     EROFS       ``read_only``
an unsupported operation (links, special        EPERM       ``refused`` (one log line)
  files)
==============================================  ==========  ===========================

A :class:`StoreError` reaches the caller of an operation through ``store_failure``: the
same errno, and one log line naming the object. Answers that are the definition of an
operation (ENOENT for a missing name, ENOTDIR, EISDIR, ENOTEMPTY, EEXIST, EBADF, EXDEV,
EINVAL for a name no key maps to, ENODATA, EOPNOTSUPP, EACCES at the mount's root, EPERM
for a directory in a flat view or a read-only attribute) are raised where the operation
is, as ``FsError(errno.X)``.

This module is at the bottom of the client: it imports nothing of the cache or the core
(a cache entry is named by what a message needs of it, :class:`CachedFile`). It also has
:class:`StopGet`, the one exception of the store's GET that is no failure.
"""
from __future__ import annotations

import errno
import logging
import os
import sys
from typing import TYPE_CHECKING, Protocol

from delvefs.shared import s3

if TYPE_CHECKING:
    from ..handler.api import HandlerError

log = logging.getLogger(__name__)


class StoreError(Exception):
    """A failure of S3 or of the cache directory, with its errno. ``unreachable``: S3 could
    not be asked (no connection, a reset or a timeout, a 5xx or throttling answer), as
    opposed to an answer about the object (404, 412, 403, ...)."""

    def __init__(self, err: int, message: str, *, unreachable: bool = False):
        super().__init__(message)
        self.errno = err
        self.unreachable = unreachable


class Changed(StoreError):
    """The object no longer has the ETag the download asked for (HTTP 412)."""

    def __init__(self, message: str):
        super().__init__(errno.EAGAIN, message)


class Superseded(StoreError):
    """A background upload gave way: the file was opened for writing or changed while its
    parts went (what they carried is not what the file will be); the parts are aborted and
    the file's last close queues it again."""

    def __init__(self, message: str):
        super().__init__(errno.EAGAIN, message)


class StopGet(Exception):
    """Raised by a ``get_range`` writer to end the GET: nobody wants its bytes any more."""


class CachedFile(Protocol):
    """What the messages below name of a cache entry (``cacheentry.CacheEntry``)."""
    bucket: str
    key: str
    path: str


class FsError(Exception):
    """The answer of a file system operation: an errno (and a message for the log)."""

    def __init__(self, err: int, message: str = "", *, logged: bool = False):
        super().__init__(message or os.strerror(err))
        self.errno = err
        self.logged = logged  # the core has written its log line already


# ------------------------------------------------------------------------ S3

_PRECONDITION_CODES = frozenset({"412", "PreconditionFailed"})
_INVALID_TAG_CODES = frozenset({"InvalidTag", "InvalidTagKey", "InvalidTagValue", "BadRequest"})
_DENIED_CODES = frozenset({"403", "AccessDenied"})
# the cache directory has no room (or the process a file size limit): said as such
_CACHE_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def errno_of_s3_code(code: str | None, status: int | None = None) -> int:
    """The errno of an S3 error answer: its ``code`` (the XML error's Code, or the HTTP
    status as text for an answer without a body, as botocore and ``s3.LeanClient`` give
    it) and, when the caller has it, the HTTP ``status``. EAGAIN is the ``Changed``
    condition (412: the object is not the version asked for)."""
    if code in s3.MISSING_CODES or status == 404:
        return errno.ENOENT
    if code in _PRECONDITION_CODES or status == 412:
        return errno.EAGAIN
    if code in _INVALID_TAG_CODES:
        return errno.EINVAL
    if code in _DENIED_CODES or status == 403:
        return errno.EACCES
    return errno.EIO


def store_error(exc: BaseException, what: str) -> StoreError:
    """The StoreError of the S3 call ``what`` that failed with ``exc``: by its S3 error
    code (botocore's ClientError, the lean client's S3Error), else a full cache disk by
    its errno, else EIO."""
    code = s3.error_code(exc)
    if code == "InvalidRange":
        # a range of the version asked for (pinned to its ETag) that it does not have:
        # the size this mount knew of it is wrong, as after a change it has not seen
        return Changed(f"{what}: the object's size is another than this mount knew ({exc})")
    err = errno_of_s3_code(code)
    if err == errno.ENOENT:
        return StoreError(err, f"{what}: no such object")
    if err == errno.EAGAIN:
        return Changed(f"{what}: object changed during download")
    if err == errno.EINVAL:
        return StoreError(err, f"{what}: {code}")
    if err == errno.EACCES:
        return StoreError(err, f"{what}: access denied")
    if isinstance(exc, OSError) and exc.errno in _CACHE_FULL:
        return StoreError(exc.errno, f"{what}: no room in the cache directory: {exc.strerror}")
    return StoreError(errno.EIO, f"{what}: {type(exc).__name__}: {exc}",
                      unreachable=s3_unreachable(exc))


# a system call's errno that says the store's host cannot be reached
_UNREACHABLE_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED,
                                 errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH,
                                 errno.EHOSTDOWN, errno.ENETDOWN, errno.EPIPE})


def s3_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (of an S3 call) says S3 could not be asked — no connection, a reset,
    a timeout, a name that does not resolve, a 5xx or throttling answer — rather than
    answering about the object."""
    import http.client
    import socket
    status = getattr(exc, "status", None)  # s3.S3Error (the lean client's)
    response = getattr(exc, "response", None)  # botocore's ClientError
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", status)
    if isinstance(status, int):
        return status >= 500 or status == 429 or s3.error_code(exc) in _THROTTLED_CODES
    if isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror, http.client.HTTPException)):
        return True
    if isinstance(exc, OSError) and exc.errno in _UNREACHABLE_ERRNOS:
        return True
    exceptions = sys.modules.get("botocore.exceptions")  # its connection errors and timeouts
    return exceptions is not None and isinstance(
        exc, (exceptions.ConnectionError, exceptions.HTTPClientError))


_THROTTLED_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                              "RequestTimeoutException"})


# ---------------------------------------------------------- the cache directory

def errno_of_oserror(exc: OSError) -> int:
    """The errno of a failed system call (EIO when it names none)."""
    return exc.errno or errno.EIO


def cache_file_error(exc: OSError, what: str) -> StoreError:
    """The StoreError of a cache file (data or journal) the cache directory refused."""
    err = errno_of_oserror(exc)
    return StoreError(err, f"{what}: {os.strerror(err)}")


def cache_failure(exc: OSError, what: str, entry: CachedFile) -> FsError:
    """An operation's failure on an entry's cache file: one log line naming the object
    and the file, and the errno for the caller."""
    err = errno_of_oserror(exc)
    log.warning("%s %s/%s (cache file %s): %s", what, entry.bucket, entry.key, entry.path,
                os.strerror(err))
    return FsError(err, f"{what} {entry.bucket}/{entry.key}: {os.strerror(err)}", logged=True)


# ------------------------------------------------------------- operations

def store_failure(exc: StoreError, what: str, bucket: str, key: str) -> FsError:
    """An operation's failure on an object: one log line naming it (none for a missing
    object: an ordinary answer), and the StoreError's errno for the caller."""
    if exc.errno != errno.ENOENT:
        log.warning("%s %s/%s: %s", what, bucket, key, exc)
    return FsError(exc.errno, f"{what} {bucket}/{key}: {exc}", logged=True)


def read_failed(exc: StoreError, entry: CachedFile) -> FsError:
    """A read of an open file lacks bytes the cache could not fetch (S3 failed, the version
    it reads is gone or changed, the cache disk refused): one log line naming the object,
    and EIO — never bytes of another version."""
    log.warning("reading %s/%s: %s", entry.bucket, entry.key, exc)
    return FsError(errno.EIO, f"reading {entry.bucket}/{entry.key}: {exc}", logged=True)


def handler_failure(exc: HandlerError, what: str) -> FsError:
    """The handler could not give ``what`` (a view's listing or changes): EAGAIN when its
    first scan of the bucket outlasted the scan wait (try again later), else EIO. An
    operation answers it only for a view never listed (a listed one is served its last
    listing); the views log the outage, once."""
    return FsError(errno.EAGAIN if exc.code == "scanning" else errno.EIO, f"{what}: {exc}",
                   logged=True)


def read_only(view_name: str) -> FsError:
    return FsError(errno.EROFS, f"view {view_name} is read-only")


def refused(what: str) -> FsError:
    """An operation DelveFS does not offer (hard links, symlinks, special files)."""
    log.info("%s refused: DelveFS views hold plain files only (EPERM)", what)
    return FsError(errno.EPERM, f"{what}: not supported", logged=True)
