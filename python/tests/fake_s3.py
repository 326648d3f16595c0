"""An S3 endpoint for the unit tests, inside a boto3 client: botocore's
``before-send`` event answers each request here instead of on the network,
after botocore has built and signed it as it would for a real server.

Every signed request's SigV4 is checked as a server checks it (the signed
headers' values as they arrived) and refused 403 SignatureDoesNotMatch
when it does not match: a header the client signed other than it sent it
(a token added twice, say) fails here as it would on the network.

Checksums as the repository's gateway treats them (``docs/protocol.md``,
*Checksums*): a PUT's or part's ``x-amz-checksum-crc64nvme`` is compared
with the bytes stored (with a token, those read by RDMA), a mismatch
answered 400 BadDigest (``x-amz-rdma-reply: 400``) with nothing stored; an
RDMA GET that asks with ``x-amz-checksum-mode: ENABLED`` gets
``x-amz-rdma-checksum-crc64nvme`` of the bytes written; a plain GET of a
whole object stored with a CRC gets it back.

Versions as S3 keeps them: an object's ETag is the MD5 of its bytes (as
S3's for a single PUT), every GET answer carries it, and a GET with
``If-Match`` another ETag is answered 412 PreconditionFailed before any
byte moves (``ignore_if_match``: a store that ignores the condition).

A HEAD answers an object's size and ETag (404 without a body when there
is none).

Requests that carry ``x-amz-rdma-token`` go to the fake library's RDMA S3
server (``hipobjFakeServe``: it connects to the library's fake NIC and
moves the bytes, as the real server does), with the fake server's object
store as the bytes of that one request; objects, parts and plain requests
are kept here. The server's behaviour (decline, fail, no final message)
is the fake library's (``hipobjFakeSetServerBehaviour``).
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import io
import re
import threading
import urllib.parse
import uuid
from typing import Callable, Dict, List, Optional, Tuple

from botocore.awsrequest import AWSResponse

import hipobj
from hipobj import _checksums

TOKEN_BYTES = 44


class _Raw(io.BytesIO):
    """A response body botocore can read and stream."""

    def stream(self, **_):
        yield self.getvalue()


class FakeS3:
    """Objects by (bucket, key), and the requests seen."""

    def __init__(self, secret: str = "SK") -> None:
        #: The secret key of the clients' access key: every signed
        #: request's SigV4 is checked with it, as a server does.
        self.secret = secret
        self.lib = hipobj.library()
        self.lib.hipobjFakeServe.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.lib.hipobjFakeServe.restype = ctypes.c_int
        self.lib.hipobjFakeSetObject.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self.lib.hipobjFakeGetObject.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.lib.hipobjFakeObjectCapacity.restype = ctypes.c_size_t
        self.objects: Dict[Tuple[str, str], bytes] = {}
        self.parts: Dict[str, Dict[int, bytes]] = {}
        self.requests: List[Tuple[str, str, bool]] = []
        #: Each request's headers, names in lower case, in order.
        self.headers: List[Dict[str, str]] = []
        #: The CRC-64/NVME an object was stored with, as sent.
        self.checksums: Dict[Tuple[str, str], str] = {}
        #: What an RDMA GET that asks for it gets as the CRC of the bytes
        #: written: "right", "wrong" (another's: a server that says it
        #: wrote what it did not) or "none" (a server that does not send
        #: it).
        self.rdma_checksum = "right"
        #: Plain GETs get the object with one byte changed (and its CRC).
        self.corrupt_plain = False
        #: Answer RDMA requests without x-amz-rdma-reply (a server that
        #: ignores the header).
        self.ignore_tokens = False
        #: (status, code): answer every request without a token with this
        #: S3 error (a wrong secret key: 403 SignatureDoesNotMatch).
        self.refuse_plain: Optional[Tuple[int, str]] = None
        #: Serve a GET whatever its If-Match says.
        self.ignore_if_match = False
        #: Called with (method, bucket, key, the request's headers) once
        #: each request is answered, before the next is: a test changes
        #: the store between two requests here.
        self.after: Optional[Callable[[str, str, str, Dict[str, str]], None]] = None
        # The fake server has one object store: one request at a time.
        self._lock = threading.Lock()

    def attach(self, client) -> None:
        client.meta.events.register("before-send.s3", self._answer, unique_id="hipobj-test-fake-s3")

    # ------------------------------------------------------------ helpers

    def _respond(self, request, status: int, headers: Dict[str, str], body: bytes = b"") -> AWSResponse:
        headers = dict(headers)
        headers.setdefault("Content-Length", str(len(body)))
        return AWSResponse(request.url, status, headers, _Raw(body))

    @staticmethod
    def _range(request, size: int) -> Optional[Tuple[int, int]]:
        spec = request.headers.get("Range")
        if spec is None:
            return None
        spec = spec.decode() if isinstance(spec, bytes) else spec
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", spec)
        assert m, spec
        first, last = int(m.group(1)), min(int(m.group(2)), size - 1)
        return first, last

    @staticmethod
    def _token_length(token: str) -> int:
        raw = bytes.fromhex(token)
        assert len(raw) == TOKEN_BYTES
        # Transport 0x02: a 40-bit little-endian length at offset 33
        # (docs/protocol.md).
        return int.from_bytes(raw[33:38], "little")

    def _serve(self, token: str, op: int) -> int:
        return self.lib.hipobjFakeServe(token.encode(), op)

    def _store(self) -> int:
        return self.lib.hipobjFakeObjectCapacity()

    def _read_store(self, n: int) -> bytes:
        out = ctypes.create_string_buffer(n)
        assert self.lib.hipobjFakeGetObject(out, n) == 0
        return out.raw

    # ------------------------------------------------------------ answers

    @staticmethod
    def etag(data: bytes) -> str:
        """The ETag of an object of `data`, quoted as S3 sends it."""
        return '"' + hashlib.md5(data).hexdigest() + '"'

    def _answer(self, request, **_):
        with self._lock:
            response = self._answer_locked(request)
            if self.after is not None:
                url = urllib.parse.urlsplit(request.url)
                bucket, _, key = urllib.parse.unquote(url.path).lstrip("/").partition("/")
                self.after(request.method, bucket, key, self.headers[-1])
            return response

    def _answer_locked(self, request):
        url = urllib.parse.urlsplit(request.url)
        path = urllib.parse.unquote(url.path).lstrip("/")
        bucket, _, key = path.partition("/")
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        token = request.headers.get("x-amz-rdma-token")
        token = token.decode() if isinstance(token, bytes) else token
        self.requests.append((request.method, key, token is not None))
        self.headers.append({k.lower(): (v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items()})
        refused = self._signature_refused(request)
        if refused is not None:
            xml = f"<Error><Code>SignatureDoesNotMatch</Code><Message>{refused}</Message></Error>".encode()
            return self._respond(request, 403, {"Content-Type": "application/xml"}, xml)
        body = request.body or b""
        if hasattr(body, "read"):
            body = body.read()
        if token is None and self.refuse_plain is not None:
            status, code = self.refuse_plain
            xml = f"<Error><Code>{code}</Code><Message>refused by the test</Message></Error>".encode()
            return self._respond(request, status, {"Content-Type": "application/xml"}, xml)
        if request.method == "POST" and "uploads" in query:
            upload = uuid.uuid4().hex
            self.parts[upload] = {}
            xml = f"<InitiateMultipartUploadResult><UploadId>{upload}</UploadId></InitiateMultipartUploadResult>"
            return self._respond(request, 200, {}, xml.encode())
        if request.method == "POST" and "uploadId" in query:
            parts = self.parts.pop(query["uploadId"][0])
            whole = b"".join(parts[n] for n in sorted(parts))
            refused = self._bad_digest(request, whole, None)
            if refused is not None:
                return refused
            self.objects[(bucket, key)] = whole
            self._remember(request, bucket, key)
            return self._respond(request, 200, {}, b"<CompleteMultipartUploadResult/>")
        if request.method == "DELETE" and "uploadId" in query:
            self.parts.pop(query["uploadId"][0], None)
            return self._respond(request, 204, {})
        if request.method == "GET":
            return self._get(request, bucket, key, token)
        if request.method == "HEAD":
            data = self.objects.get((bucket, key))
            if data is None:
                return self._respond(request, 404, {})
            return self._respond(request, 200, {"Content-Length": str(len(data)), "ETag": self.etag(data)})
        if request.method == "PUT":
            return self._put(request, bucket, key, token, body, query)
        return self._respond(request, 405, {})

    def _signature_refused(self, request) -> Optional[str]:
        """Why a request's SigV4 does not match what was sent (as a server
        checks it: the signed headers' values as they arrived, each name's
        once), or ``None`` when it does or the request is not signed."""
        auth = self._header(request, "Authorization")
        if auth is None:
            return None
        m = re.fullmatch(
            r"AWS4-HMAC-SHA256 Credential=[^/]+/(\d{8})/([^/]+)/s3/aws4_request, "
            r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})",
            auth,
        )
        if m is None:
            return f"an Authorization header this fake does not read: {auth}"
        day, region, signed, signature = m.groups()
        url = urllib.parse.urlsplit(request.url)
        quote = lambda text: urllib.parse.quote(text, safe="-_.~")  # noqa: E731
        pairs = urllib.parse.parse_qsl(url.query, keep_blank_values=True)
        query = "&".join(sorted(f"{quote(k)}={quote(v)}" for k, v in pairs))
        lines = []
        for name in signed.split(";"):
            value = url.netloc if name == "host" else self._header(request, name)
            if value is None:
                return f"the signed header {name} was not sent"
            lines.append(f"{name}:{' '.join(value.split())}\n")
        payload = self._header(request, "x-amz-content-sha256")
        canonical = "\n".join([request.method, url.path or "/", query, "".join(lines), signed, payload or ""])
        scope = f"{day}/{region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", self._header(request, "x-amz-date") or "", scope,
             hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key = ("AWS4" + self.secret).encode()
        for part in (day, region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        if hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest() != signature:
            return "the signature does not match the request as it arrived"
        return None

    @staticmethod
    def _header(request, name: str) -> Optional[str]:
        value = request.headers.get(name)
        return value.decode() if isinstance(value, bytes) else value

    def _bad_digest(self, request, data: bytes, reply: Optional[str]) -> Optional[AWSResponse]:
        """400 BadDigest (with `reply` as ``x-amz-rdma-reply``) when the
        request's CRC-64/NVME is not that of `data`."""
        sent = self._header(request, _checksums.CRC64NVME)
        if sent is None or _checksums.decode(sent) == _checksums.crc64nvme(data):
            return None
        xml = b"<Error><Code>BadDigest</Code><Message>x-amz-checksum-crc64nvme mismatch</Message></Error>"
        headers = {"Content-Type": "application/xml"}
        if reply is not None:
            headers["x-amz-rdma-reply"] = reply
        return self._respond(request, 400, headers, xml)

    def _remember(self, request, bucket: str, key: str) -> None:
        sent = self._header(request, _checksums.CRC64NVME)
        if sent is None:
            self.checksums.pop((bucket, key), None)
        else:
            self.checksums[(bucket, key)] = sent

    def _get(self, request, bucket: str, key: str, token: Optional[str]) -> AWSResponse:
        data = self.objects.get((bucket, key))
        if data is None:
            xml = b"<Error><Code>NoSuchKey</Code><Message>no such key</Message></Error>"
            return self._respond(request, 404, {"Content-Type": "application/xml"}, xml)
        etag = self.etag(data)
        wanted = self._header(request, "If-Match")
        if wanted is not None and wanted != etag and not self.ignore_if_match:
            xml = b"<Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you specified did not hold</Message></Error>"
            headers = {"Content-Type": "application/xml"}
            if token is not None and not self.ignore_tokens:
                headers["x-amz-rdma-reply"] = "412"
            return self._respond(request, 412, headers, xml)
        span = self._range(request, len(data))
        first, last = span if span is not None else (0, len(data) - 1)
        piece = data[first : last + 1]
        headers = {"ETag": etag}
        status = 200
        if span is not None:
            headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
            status = 206
        asked = (self._header(request, "x-amz-checksum-mode") or "").upper() == "ENABLED"
        plain = dict(headers)
        if asked and (bucket, key) in self.checksums and len(piece) == len(data):
            plain[_checksums.CRC64NVME] = self.checksums[(bucket, key)]
        body = piece
        if self.corrupt_plain and len(piece) > 1:
            body = piece[:1] + bytes([piece[1] ^ 1]) + piece[2:]
        if token is None or self.ignore_tokens:
            return self._respond(request, status, plain, body)
        n = min(len(piece), self._token_length(token))
        assert self.lib.hipobjFakeSetObject(piece[:n], n) == 0
        reply = self._serve(token, 1)
        headers["x-amz-rdma-reply"] = str(reply)
        if reply in (200, 206):
            headers["x-amz-rdma-reply"] = str(status)
            headers["x-amz-rdma-bytes-transferred"] = str(n)
            if asked and self.rdma_checksum != "none":
                wrote = piece[:n] if self.rdma_checksum == "right" else piece[: n - 1] + b"?"
                headers[_checksums.RDMA_CRC64NVME] = _checksums.encode(_checksums.crc64nvme(wrote))
            return self._respond(request, status, headers)
        if reply == 501:
            # Declined: the object goes in the body.
            plain["x-amz-rdma-reply"] = "501"
            return self._respond(request, status, plain, body)
        xml = b"<Error><Code>InternalError</Code><Message>RDMA failed</Message></Error>"
        return self._respond(request, 500, {"x-amz-rdma-reply": str(reply)}, xml)

    def _put(self, request, bucket: str, key: str, token: Optional[str], body: bytes, query) -> AWSResponse:
        part = None
        if "uploadId" in query:
            part = (query["uploadId"][0], int(query["partNumber"][0]))
        headers = {}
        if token is not None and not self.ignore_tokens:
            assert body == b"", "a PUT with a token has an empty body"
            n = self._token_length(token)
            reply = self._serve(token, 0)
            if reply == 501:
                xml = b"<Error><Code>NotImplemented</Code><Message>declined</Message></Error>"
                return self._respond(request, 501, {"x-amz-rdma-reply": "501"}, xml)
            if reply != 200:
                xml = b"<Error><Code>InternalError</Code><Message>RDMA failed</Message></Error>"
                return self._respond(request, 500, {"x-amz-rdma-reply": str(reply)}, xml)
            body = self._read_store(n)
            refused = self._bad_digest(request, body, "400")
            if refused is not None:
                return refused
            headers["x-amz-rdma-reply"] = "200"
            headers["x-amz-rdma-bytes-transferred"] = str(n)
        else:
            refused = self._bad_digest(request, body, None)
            if refused is not None:
                return refused
        if part is not None:
            self.parts[part[0]][part[1]] = body
            headers["ETag"] = f'"{uuid.uuid4().hex}"'
        else:
            self.objects[(bucket, key)] = body
            self._remember(request, bucket, key)
            headers["ETag"] = self.etag(body)
        return self._respond(request, 200, headers)
