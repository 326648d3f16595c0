"""The lane's Garage cluster, checked over plain S3 (scripts/vm/garage-check.sh).

Runs inside scripts/vm/garage-guest.sh, which exported the cluster's
endpoint, region, bucket and key. Each step prints one line: what it did,
how long it took, and the nodes' resident memory where that matters.

  1. PUT and GET a small object; a PUT whose CRC32 or CRC64NVME does not
     match its body is refused (InvalidDigest): Garage checks the checksums
     clients send; the right CRC64NVME is answered back.
  2. A multipart upload (three parts, the last one short), read back whole.
  3. BIG_MIB (default 3072) MiB in one PUT, streamed from a generator (never
     held in memory, never on disk), then GET and compared as it arrives.
  4. Node 2 killed: PUT, multipart and GET still succeed through nodes 0
     and 1 (quorum two of three), and what was written before is read back.
  5. Node 1 killed too: a PUT is refused (no quorum), the control that
     shows step 4 depended on two nodes answering.
  6. Nodes 1 and 2 started again: they rejoin, and a GET through node 2
     succeeds.

Exits non-zero with the failing step's S3 error otherwise.
"""

import base64
import os
import random
import subprocess
import sys
import time
import zlib

import boto3
import botocore.config
import botocore.exceptions

MIB = 1 << 20
GUEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "garage-guest.sh")


class Pattern:
    """A seekable, read-only stream of `size` bytes that are the same on every
    read at the same offset, made one MiB block at a time from a random
    base block rotated and stamped with the block's number, so that no two
    blocks are alike (Garage deduplicates equal blocks) and none compresses."""

    def __init__(self, size, seed=1):
        self.size = size
        self.pos = 0
        self.base = random.Random(seed).randbytes(MIB)
        self.cached = (-1, b"")

    def block(self, k):
        if self.cached[0] != k:
            r = (k * 7919) % MIB
            b = self.base[r:] + self.base[:r]
            self.cached = (k, k.to_bytes(8, "little") + b[8:])
        return self.cached[1]

    def __len__(self):
        return self.size

    def read(self, n=-1):
        if n is None or n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        out = []
        while n > 0:
            k, off = divmod(self.pos, MIB)
            piece = self.block(k)[off : off + n]
            out.append(piece)
            self.pos += len(piece)
            n -= len(piece)
        return b"".join(out)

    def seek(self, offset, whence=0):
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, min(self.size, base + offset))
        return self.pos

    def tell(self):
        return self.pos

    def seekable(self):
        return True

    def readable(self):
        return True


def crc64nvme(data):
    """CRC-64/NVME (reflected polynomial 0x9a6c9329ac4bc9b5, initial value and
    final XOR all ones), bit by bit: botocore computes it only with awscrt,
    which the venv does not have, and the check needs it of 1000 bytes."""
    crc = (1 << 64) - 1
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x9A6C9329AC4BC9B5 if crc & 1 else crc >> 1
    return crc ^ ((1 << 64) - 1)


def client(endpoint):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=os.environ["HIPOBJ_GARAGE_REGION"],
        config=botocore.config.Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 2, "mode": "standard"},
            connect_timeout=10,
            read_timeout=600,
        ),
    )


def rss():
    out = subprocess.run(["bash", GUEST, "rss"], check=True, capture_output=True, text=True).stdout
    nodes = [line.split() for line in out.splitlines()]
    mib = [int(kib) / 1024 for _, kib in nodes]
    return f"RSS {sum(mib):.0f} MiB ({', '.join(f'{n} {m:.0f}' for (n, _), m in zip(nodes, mib))})"


def step(name, fn, mib=None):
    start = time.monotonic()
    try:
        detail = fn()
    except botocore.exceptions.ClientError as e:
        err = e.response.get("Error", {})
        sys.exit(f"garage-check: {name}: S3 {err.get('Code')} ({e.response['ResponseMetadata'].get('HTTPStatusCode')}): {err.get('Message')}")
    except (botocore.exceptions.BotoCoreError, AssertionError) as e:
        sys.exit(f"garage-check: {name}: {type(e).__name__}: {e}")
    seconds = time.monotonic() - start
    rate = f" ({mib / seconds:.1f} MiB/s)" if mib else ""
    print(f"garage-check: {name}: ok in {seconds:.1f} s{rate}{'; ' + detail if detail else ''}", flush=True)


def put_get(s3, bucket, key, body):
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    got = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert got == body, f"{key}: read {len(got)} bytes that differ from the {len(body)} written"


def multipart(s3, bucket, key, part_sizes, seed):
    data = Pattern(sum(part_sizes), seed).read()
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts, off = [], 0
    for number, size in enumerate(part_sizes, 1):
        etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=data[off : off + size])["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
        off += size
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})
    got = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert got == data, f"{key}: the multipart object read back differs from its parts"


def get_compare(s3, bucket, key, pattern):
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    pattern.seek(0)
    n = 0
    while True:
        chunk = body.read(4 * MIB)
        if not chunk:
            break
        want = pattern.read(len(chunk))
        assert chunk == want, f"{key}: bytes differ in the 4 MiB from offset {n}"
        n += len(chunk)
    assert n == len(pattern), f"{key}: read {n} bytes of {len(pattern)}"


def main():
    big_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 3072
    bucket = os.environ["HIPOBJ_GARAGE_BUCKET"]
    endpoints = os.environ["HIPOBJ_GARAGE_ENDPOINTS"].split()
    s3 = client(endpoints[0])
    print(f"garage-check: cluster up, {rss()}", flush=True)

    small = os.urandom(100_000)
    step("PUT and GET 100 kB", lambda: put_get(s3, bucket, "small", small))

    def bad_digest():
        wrong = base64.b64encode((zlib.crc32(small) ^ 1).to_bytes(4, "big")).decode()
        try:
            s3.put_object(Bucket=bucket, Key="bad", Body=small, ChecksumCRC32=wrong)
        except botocore.exceptions.ClientError as e:
            code = e.response["Error"]["Code"]
            # Garage's word for it; AWS says BadDigest.
            assert code in ("InvalidDigest", "BadDigest"), f"a wrong CRC32 was refused with {code}, not as a bad digest"
            return f"refused with {code}"
        raise AssertionError("a PUT with a wrong CRC32 was accepted")

    step("PUT with a wrong CRC32", bad_digest)

    def crc64nvme_checked():
        body = small[:1000]
        right = base64.b64encode(crc64nvme(body).to_bytes(8, "big")).decode()
        wrong = base64.b64encode((crc64nvme(body) ^ 1).to_bytes(8, "big")).decode()
        try:
            s3.put_object(Bucket=bucket, Key="crc64", Body=body, ChecksumCRC64NVME=wrong)
            raise AssertionError("a PUT with a wrong CRC64NVME was accepted")
        except botocore.exceptions.ClientError as e:
            code = e.response["Error"]["Code"]
            assert code in ("InvalidDigest", "BadDigest"), f"a wrong CRC64NVME was refused with {code}, not as a bad digest"
        stored = s3.put_object(Bucket=bucket, Key="crc64", Body=body, ChecksumCRC64NVME=right).get("ChecksumCRC64NVME")
        assert stored == right, f"the right CRC64NVME {right} was answered with {stored}"
        return f"a wrong one refused with {code}, the right one answered back"

    step("PUT with a CRC64NVME", crc64nvme_checked)
    step("multipart (5 + 5 + 1 MiB)", lambda: multipart(s3, bucket, "multi", [5 * MIB, 5 * MIB, MIB], 2))

    big = Pattern(big_mib * MIB, 3)

    def put_big():
        big.seek(0)
        s3.put_object(Bucket=bucket, Key="big", Body=big)
        return rss()

    def get_big():
        get_compare(s3, bucket, "big", big)
        return rss()

    step(f"PUT {big_mib} MiB streamed", put_big, big_mib)
    step(f"GET {big_mib} MiB streamed, compared", get_big, big_mib)

    subprocess.run(["bash", GUEST, "kill-node", "2"], check=True)
    for i, endpoint in enumerate(endpoints[:2]):
        c = client(endpoint)
        step(f"node 2 down: PUT and GET through node {i}", lambda c=c, i=i: put_get(c, bucket, f"degraded{i}", os.urandom(200_000)))
    step("node 2 down: multipart", lambda: multipart(s3, bucket, "multi-degraded", [5 * MIB, MIB], 4))

    def read_back():
        assert s3.get_object(Bucket=bucket, Key="small")["Body"].read() == small, "small: differs"
        get_compare(s3, bucket, "multi", Pattern(11 * MIB, 2))

    step("node 2 down: GET what was written before", read_back)

    def no_quorum():
        try:
            s3.put_object(Bucket=bucket, Key="no-quorum", Body=b"x")
        except botocore.exceptions.ClientError as e:
            return f"refused with {e.response['Error']['Code']} ({e.response['ResponseMetadata'].get('HTTPStatusCode')})"
        raise AssertionError("a PUT with one node of three up was accepted")

    # The control: with a second node down a write has no quorum, so the
    # steps above did depend on two nodes answering.
    subprocess.run(["bash", GUEST, "kill-node", "1"], check=True)
    step("nodes 1 and 2 down: PUT refused", no_quorum)
    subprocess.run(["bash", GUEST, "start-node", "1"], check=True)
    subprocess.run(["bash", GUEST, "start-node", "2"], check=True)
    c2 = client(endpoints[2])

    def through_node2():
        deadline = time.monotonic() + 120
        while True:
            try:
                got = c2.get_object(Bucket=bucket, Key="degraded0")["Body"].read()
                assert len(got) == 200_000
                return rss()
            except (botocore.exceptions.ClientError, botocore.exceptions.EndpointConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    step("nodes 1 and 2 back: GET through node 2", through_node2)
    print("garage-check: all steps passed", flush=True)


if __name__ == "__main__":
    main()
