"""The tests' ``hipobj-s3-server`` (the binary ``HIPOBJ_S3_SERVER`` names):
one bucket in a fresh directory, its endpoint, whether it serves RDMA, its
metrics and what it stored. The suites that talk to a real server (fsspec,
PyTorch, the lane's) and the lane's fsspec benchmark share it."""

import os
import pathlib
import re
import subprocess
import tempfile
import urllib.request


class S3Server:
    """``hipobj-s3-server`` serving `bucket` from a fresh directory (under
    `parent`, else the system's temporary one), listening on `host`, with
    `extra` arguments (``--no-rdma``, ``--device rxe0``). With `metrics`
    it serves Prometheus metrics too; with `log` its standard error goes to
    ``server.log`` in its directory instead of the test's output."""

    def __init__(self, access: str, secret: str, *extra: str, bucket: str = "bucket", host: str = "127.0.0.1",
                 metrics: bool = False, log: bool = False, parent: "str | None" = None) -> None:
        binary = os.environ.get("HIPOBJ_S3_SERVER")
        if not binary or not os.access(binary, os.X_OK):
            raise RuntimeError(
                "HIPOBJ_S3_SERVER names no hipobj-s3-server binary (the suite's script builds it: "
                "cargo build --features s3-server --bin hipobj-s3-server)")
        self.access, self.secret = access, secret
        self.dir = tempfile.mkdtemp(prefix="hipobj-server-", dir=parent)
        self.bucket = bucket
        self.root = os.path.join(self.dir, "store")
        secret_file = pathlib.Path(self.dir, "secret")
        secret_file.write_text(secret + "\n")
        secret_file.chmod(0o600)
        args = [binary, "--root", self.root, "--listen", f"{host}:0", "--access-key", access,
                "--secret-key-file", str(secret_file), "--bucket", bucket, *extra]
        if metrics:
            args += ["--metrics-listen", f"{host}:0"]
        self.log = open(pathlib.Path(self.dir, "server.log"), "w+") if log else None
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        first = self.proc.stdout.readline()
        m = re.search(r"listening on (http://\S+) \(rdma: ([^)]*)\)", first)
        if not m:
            self.stop()
            raise RuntimeError(f"hipobj-s3-server's first line: {first!r}")
        self.endpoint, self.rdma = m.group(1), not m.group(2).startswith("off")
        self.metrics_url = None
        if metrics:
            second = self.proc.stdout.readline()
            found = re.search(r"metrics on (http://\S+)", second)
            if not found:
                self.stop()
                raise RuntimeError(f"hipobj-s3-server's second line: {second!r}")
            self.metrics_url = found.group(1)

    def client(self, **config: object) -> object:
        """A boto3 S3 client of this server with its credentials, one
        attempt a request; `config`: more of botocore's ``Config``."""
        import boto3  # noqa: PLC0415 - not every suite has it
        from botocore.config import Config  # noqa: PLC0415

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.access, aws_secret_access_key=self.secret,
                            config=Config(retries={"max_attempts": 1}, **config))

    def path(self, key: str) -> pathlib.Path:
        """Where the local backend keeps `key` of the bucket."""
        return pathlib.Path(self.root, self.bucket, key)

    def stored(self, key: str) -> bytes:
        """The bytes the server stored under `key`."""
        return self.path(key).read_bytes()

    def moved(self, path: str, op: str = "GetObject") -> float:
        """``hipobj_s3_bytes_total`` of `op` by `path` (``rdma``, ``http``):
        the payload bytes the server sent (a GET's) or took (a PUT's)."""
        if self.metrics_url is None:
            raise RuntimeError("this server was started without metrics (S3Server(..., metrics=True))")
        text = urllib.request.urlopen(self.metrics_url, timeout=30).read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("hipobj_s3_bytes_total{") and f'op="{op}"' in line and f'path="{path}"' in line
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        if self.log is not None:
            self.log.close()
