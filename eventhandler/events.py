"""Parsing MinIO bucket notifications (pure; no I/O). The hot path of the consumer.

What MinIO (the pinned server) emits, checked by experiment (see tests/unit/test_handler_events.py):

- one AMQP message per event, ``content_type=application/json``, headers
  ``minio-bucket`` and ``minio-event``; body ``{"EventName", "Key", "Records": [record]}``.
- event names: ``s3:ObjectCreated:Put|Post|Copy|CompleteMultipartUpload``,
  ``s3:ObjectCreated:PutTagging`` and ``s3:ObjectCreated:DeleteTagging`` (tagging events are
  *ObjectCreated*, not ObjectRemoved), ``s3:ObjectRemoved:Delete|DeleteMarkerCreated|NoOP``.
- ``s3.object.key`` is URL-encoded with ``+`` for space (``a b+c.txt`` -> ``a+b%2Bc.txt``).
  A key is UTF-8 (S3's rule): one whose escapes decode to other bytes is an invalid event.
  Every other key is taken as it is, a NUL byte too (AWS S3 allows it; the mounts decide
  what to show).
- ``s3.object.sequencer`` is 16 hex digits: the object's ModTime in ns for creates (and for
  tagging events: the *same* sequencer as the version they tag), the event time in ns for
  removes. Sequencers of one key are compared as integers (equal to comparing zero-padded hex).
- creates carry ``size``, ``eTag``, ``userMetadata`` (``X-Amz-Meta-*`` keys plus
  ``content-type``); removes carry only key and sequencer. No event carries tags.
"""
from __future__ import annotations

import re
from datetime import datetime
from urllib.parse import unquote_plus

import orjson

# kinds
CREATE = 0   # a new object version: put, post, copy, multipart
TAGGING = 1  # tags of an existing version changed (same sequencer as that version)
REMOVE = 2   # the key no longer exists (delete, delete marker, no-op delete)

_META_PREFIX = "x-amz-meta-"
_HEX = re.compile(r"[0-9A-Fa-f]{1,16}").fullmatch
_SEQ_NS_MIN, _SEQ_NS_MAX = 10**18, 4 * 10**18  # sequencers that are plausible epoch ns


class InvalidEvent(ValueError):
    """A message that is not a usable MinIO notification (dead-lettered)."""


class Event:
    """One applied S3 change. ``seq`` is the sequencer as an int."""

    __slots__ = ("kind", "bucket", "key", "seq", "size", "etag", "mtime", "metadata", "name")

    def __init__(self, kind, bucket, key, seq, size=0, etag="", mtime=0.0, metadata=None, name=""):
        self.kind = kind
        self.bucket = bucket
        self.key = key
        self.seq = seq
        self.size = size
        self.etag = etag
        self.mtime = mtime
        self.metadata = metadata if metadata is not None else {}
        self.name = name

    def __repr__(self) -> str:
        return (f"Event({self.name!r}, {self.bucket!r}, {self.key!r}, seq={self.seq:X}, "
                f"size={self.size})")


def event_kind(name: str) -> int:
    """The kind of an S3 event name, or raise InvalidEvent."""
    if name.startswith("s3:ObjectCreated:"):
        if name.endswith("Tagging"):
            return TAGGING
        return CREATE
    if name.startswith("s3:ObjectRemoved:"):
        if name.endswith("Tagging"):  # AWS spelling of tag removal, should it ever arrive
            return TAGGING
        return REMOVE
    raise InvalidEvent(f"unsupported event name {name!r}")


def parse_sequencer(text) -> int:
    if type(text) is not str or not 0 < len(text) <= 16 or not text.isalnum() or "x" in text or "X" in text:
        # 16 hex digits (MinIO) = 64 bits, what the store's msgpack records hold
        raise InvalidEvent(f"bad sequencer {text!r}")
    try:
        return int(text, 16)
    except ValueError:
        raise InvalidEvent(f"bad sequencer {text!r}") from None


def seq_newer(a: int, b: int | None) -> bool:
    """True when sequencer ``a`` is later than ``b`` (None: nothing known)."""
    return b is None or a > b


def seq_hex(seq: int) -> str:
    return f"{seq:016X}"


def _metadata(user_metadata) -> dict[str, str]:
    if not user_metadata or (len(user_metadata) == 1 and "content-type" in user_metadata):
        return {}
    out = {}
    for k, v in user_metadata.items():
        lk = k.lower()
        if lk.startswith(_META_PREFIX):
            out[lk[11:]] = v
    return out


def _mtime(seq: int, record: dict) -> float:
    if _SEQ_NS_MIN <= seq <= _SEQ_NS_MAX:
        return seq / 1e9
    when = record.get("eventTime")
    if isinstance(when, str):
        try:
            return datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise InvalidEvent("no usable modification time (sequencer or eventTime)")


_KINDS: dict[str, int] = {}


def parse_record(record) -> Event:
    """One entry of ``Records`` -> Event (raises InvalidEvent)."""
    try:
        name = record["eventName"]
        s3 = record["s3"]
        bucket = s3["bucket"]["name"]
        obj = s3["object"]
        raw_key = obj["key"]
        seq_text = obj["sequencer"]
    except (KeyError, TypeError) as exc:
        raise InvalidEvent(f"missing field {exc}") from None
    if type(bucket) is not str or type(raw_key) is not str or type(name) is not str:
        raise InvalidEvent("bucket, key and eventName must be strings")
    seq = parse_sequencer(seq_text)
    kind = _KINDS.get(name)
    if kind is None:
        kind = event_kind(name)
        if len(_KINDS) < 64:
            _KINDS[name] = kind
    if "%" in raw_key or "+" in raw_key:
        try:  # S3 keys are UTF-8: an escape that is not names no key (never a replaced one)
            key = unquote_plus(raw_key, errors="strict")
        except UnicodeDecodeError:
            raise InvalidEvent(f"key {raw_key[:200]!r} is not percent-encoded UTF-8") from None
    else:
        key = raw_key
    if kind == REMOVE:
        return Event(REMOVE, bucket, key, seq, name=name)
    size = obj.get("size", 0)
    if type(size) is not int or size < 0:
        raise InvalidEvent(f"bad size {size!r}")
    etag = obj.get("eTag") or ""
    if type(etag) is not str:
        raise InvalidEvent("bad eTag")
    if etag.startswith('"'):
        etag = etag.strip('"')
    mtime = seq / 1e9 if _SEQ_NS_MIN <= seq <= _SEQ_NS_MAX else _mtime(seq, record)
    return Event(kind, bucket, key, seq, size, etag, mtime, _metadata(obj.get("userMetadata")), name)


def parse_message(body: bytes) -> list[Event]:
    """An AMQP message body -> its events (raises InvalidEvent)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidEvent(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidEvent("not a JSON object")
    records = doc.get("Records")
    if not isinstance(records, list) or not records:
        raise InvalidEvent("no Records")
    return [parse_record(r) for r in records]


def message_bucket(headers) -> str | None:
    """The bucket named by MinIO's ``minio-bucket`` header (lets us drop without decoding)."""
    if headers:
        b = headers.get("minio-bucket")
        if isinstance(b, bytes):
            return b.decode("utf-8", "replace")
        return b
    return None


def make_record(name: str, bucket: str, key: str, seq: int, size: int = 0, etag: str = "",
                metadata: dict | None = None) -> dict:
    """A MinIO-format record (for tests and benchmarks that publish crafted events)."""
    from urllib.parse import quote_plus

    obj = {"key": quote_plus(key, safe="/"), "sequencer": seq_hex(seq)}
    if not name.startswith("s3:ObjectRemoved:"):
        um = {f"X-Amz-Meta-{k.title()}": v for k, v in (metadata or {}).items()}
        um["content-type"] = "binary/octet-stream"
        obj.update({"size": size, "eTag": etag, "contentType": "binary/octet-stream",
                    "userMetadata": um})
    when = datetime.utcfromtimestamp(seq / 1e9).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return {
        "eventVersion": "2.0", "eventSource": "minio:s3", "awsRegion": "", "eventTime": when,
        "eventName": name, "userIdentity": {"principalId": "delvefs-admin"},
        "requestParameters": {"principalId": "delvefs-admin", "region": "",
                              "sourceIPAddress": "127.0.0.1"},
        "responseElements": {"x-amz-request-id": "18E9F9424FF5EB99"},
        "s3": {"s3SchemaVersion": "1.0", "configurationId": "Config",
               "bucket": {"name": bucket, "ownerIdentity": {"principalId": "delvefs-admin"},
                          "arn": f"arn:aws:s3:::{bucket}"},
               "object": obj},
        "source": {"host": "127.0.0.1", "port": "", "userAgent": "delvefs-test"},
    }


def make_message(name: str, bucket: str, key: str, seq: int, **kw) -> tuple[bytes, dict]:
    """(body, headers) of a crafted MinIO-format AMQP message."""
    body = orjson.dumps({"EventName": name, "Key": f"{bucket}/{key}",
                         "Records": [make_record(name, bucket, key, seq, **kw)]})
    return body, {"minio-bucket": bucket, "minio-event": name}
