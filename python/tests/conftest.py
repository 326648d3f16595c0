"""The unit tests (``test_fake.py``) run on the fake libhipobj
(``scripts/install.sh --fake``, or ``cargo build --profile fake -p
hipobj-fake``, which writes ``target/fake/libhipobj_fake.so``): a fake RoCE NIC, a fake GPU and an RDMA S3 server in this
process. ``HIPOBJ_LIBRARY`` names it; ``scripts/python-test.sh`` builds it
and sets it. The lane's tests (``test_lane.py``) run with the real library
in the Soft-RoCE VM instead (``HIPOBJ_PYTHON_LANE=1``, set by the lane),
and fail anywhere else; each suite is run by its own path."""

import ctypes
import os
import pathlib

import pytest

LANE = os.environ.get("HIPOBJ_PYTHON_LANE") == "1"
REPO = pathlib.Path(__file__).resolve().parents[2]

if not LANE:
    os.environ.setdefault("HIPOBJ_LIBRARY", str(REPO / "target" / "fake" / "libhipobj_fake.so"))
    # A server that never sends its final message costs this much.
    os.environ.setdefault("HIPOBJ_COMPLETION_TIMEOUT_MS", "300")

import boto3  # noqa: E402
from botocore.config import Config  # noqa: E402

import hipobj  # noqa: E402


@pytest.fixture
def fake():
    """The fake library's controls, reset after each test."""
    if LANE:
        pytest.fail("the fake library's tests run outside the lane")
    lib = hipobj.library()
    lib.hipobjFakeSetServerBehaviour.argtypes = [ctypes.c_int]
    lib.hipobjFakeFailCall.argtypes = [ctypes.c_char_p, ctypes.c_uint]
    lib.hipobjFakeDeviceAlloc.argtypes = [ctypes.c_size_t]
    lib.hipobjFakeDeviceAlloc.restype = ctypes.c_void_p
    lib.hipobjFakeDeviceFree.argtypes = [ctypes.c_void_p]
    lib.hipobjFakeDeviceWrite.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    lib.hipobjFakeDeviceRead.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    lib.hipobjFakeLiveObjects.argtypes = [ctypes.c_char_p]
    lib.hipobjFakeLiveObjects.restype = ctypes.c_long
    yield lib
    lib.hipobjFakeSetServerBehaviour(0)
    lib.hipobjFakeClearFaults()
    hipobj.set_copier(None)


@pytest.fixture
def s3(fake):
    """A boto3 client whose S3 is tests/fake_s3.py."""
    from fake_s3 import FakeS3

    client = boto3.client(
        "s3",
        endpoint_url="http://s3.test:9000",
        region_name="us-east-1",
        aws_access_key_id="AK",
        aws_secret_access_key="SK",
        config=Config(retries={"max_attempts": 1}),
    )
    store = FakeS3()
    store.attach(client)
    client.fake = store
    return client


@pytest.fixture
def session(fake):
    with hipobj.Session(gpu=0) as s:
        yield s
