"""hipobj:// timed on Soft-RoCE (``scripts/vm/fsspec-lane.sh --bench``, in the
VM): one 64 MiB object read by the same fsspec calls by RDMA and with
``rdma=False``, against ``hipobj-s3-server`` on rxe0 (``HIPOBJ_S3_SERVER``),
with the library ``HIPOBJ_LIBRARY`` names. Prints one line per path; the
tests of the same paths are python/tests/test_fsspec_lane.py."""

import pathlib
import random
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python" / "tests"))

from hipobj.filesystem import HipObjFileSystem  # noqa: E402
from s3_server import S3Server  # noqa: E402

MIB = 1 << 20
ACCESS, SECRET = "fsspec-bench", "fsspec-bench-secret"


def main() -> None:
    server = S3Server(ACCESS, SECRET, "--device", "rxe0", bucket="bkt", host="192.0.2.1", log=True)
    try:
        options = {"endpoint_url": server.endpoint, "key": ACCESS, "secret": SECRET, "region": "us-east-1"}
        fs = HipObjFileSystem(**options, skip_instance_cache=True)
        plain = HipObjFileSystem(**options, skip_instance_cache=True, rdma=False)
        if not (server.rdma and fs.rdma):
            sys.exit(f"fsspec-bench: no RDMA (server: {server.rdma}, filesystem: {fs.http_reason})")
        data = random.Random(3).randbytes(64 * MIB)
        fs.pipe_file("bkt/bench/timed.bin", data)
        ranges = [(i * MIB, (i + 1) * MIB) for i in range(64)]
        for name, each in (("rdma", fs), ("http", plain)):
            start = time.perf_counter()
            if each.cat_file("bkt/bench/timed.bin") != data:
                sys.exit(f"fsspec-bench: {name}: cat_file returned other bytes")
            whole = time.perf_counter() - start
            start = time.perf_counter()
            got = each.cat_ranges(["bkt/bench/timed.bin"] * 64, [a for a, _ in ranges], [b for _, b in ranges])
            spans = time.perf_counter() - start
            if b"".join(got) != data:
                sys.exit(f"fsspec-bench: {name}: cat_ranges returned other bytes")
            print(f"fsspec-bench {name}: cat_file of 64 MiB {whole:.2f} s ({64 / whole:.0f} MiB/s), "
                  f"cat_ranges of 64 x 1 MiB {spans:.2f} s ({64 / spans:.0f} MiB/s)", flush=True)
        if fs.stats.http != 0 or plain.stats.rdma != 0:
            sys.exit(f"fsspec-bench: a path crossed over: {fs.stats.as_dict()} {plain.stats.as_dict()}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
