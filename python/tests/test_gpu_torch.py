"""On a GPU machine (``scripts/gpu/torch.sh``): PyTorch's distributed
checkpoints through ``hipobj.dcp`` into CUDA tensors, byte for byte against
DCP's own ``FileSystemWriter``/``FileSystemReader`` and ``torch.save``; a
checkpoint sharded over two ranks (DTensor, gloo) read back resharded; the
S3 connector's names (``S3Checkpoint``, ``S3MapDataset``,
``S3IterableDataset`` through a DataLoader with workers, ``S3StorageWriter``
and ``S3StorageReader``). Against ``hipobj-s3-server`` (``HIPOBJ_S3_SERVER``,
local backend) with the release libhipobj (``HIPOBJ_LIBRARY``): the machine
has no RDMA device, so the library does not initialize and every transfer
is the plain-HTTP fallback, landed in GPU memory by the CUDA driver's
copies; each test says so from ``Session.stats``. With
``HIPOBJ_TORCH_DEVICE=cpu`` the same tests run on a host's CPU (host
tensors instead of CUDA ones), wherever PyTorch is installed."""

import io
import os
import socket

import boto3
import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

import hipobj
from hipobj.dcp import HipObjStorageReader, HipObjStorageWriter
from hipobj import s3torchconnector as s3tc
from s3_server import S3Server
from hipobj.s3torchconnector.dcp import S3StorageReader, S3StorageWriter

MIB = 1 << 20
ACCESS, SECRET = "torch-gpu", "torch-gpu-secret"

#: Where the tensors live: "cuda" (the GPU machine), or "cpu".
DEVICE = os.environ.get("HIPOBJ_TORCH_DEVICE", "cuda")
if DEVICE not in ("cuda", "cpu") or (DEVICE == "cuda" and not torch.cuda.is_available()):
    raise RuntimeError(f"test_gpu_torch.py: no {DEVICE!r} device (scripts/gpu/torch.sh on a GPU machine, "
                       "or HIPOBJ_TORCH_DEVICE=cpu)")
if not os.environ.get("HIPOBJ_S3_SERVER"):
    raise RuntimeError("test_gpu_torch.py: HIPOBJ_S3_SERVER names no server (scripts/gpu/torch.sh sets it)")


@pytest.fixture(scope="module")
def server():
    s = S3Server(ACCESS, SECRET, "--no-rdma", parent="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = ACCESS, SECRET
    yield s
    s.stop()


def make_client(server):
    return server.client(max_pool_connections=64)


@pytest.fixture
def client(server):
    return make_client(server)


@pytest.fixture
def session():
    with hipobj.Session() as s:
        print("session:", s.available, s.reason)
        yield s
        print("session stats:", s.stats)


def same(a, b):
    if isinstance(a, torch.Tensor):
        a, b = a.detach().cpu(), b.detach().cpu()
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8)) if a.numel() else True
    return a == b


def model_state(seed, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    state = {
        "embed.weight": torch.randn(4096, 1024, generator=g),                     # 16 MiB: sent straight
        "attn.qkv": torch.randn(1536, 512, generator=g).to(torch.bfloat16),
        "attn.out": torch.randn(512, 512, generator=g).to(torch.float16).t(),   # not contiguous
        "ids": torch.randint(-(2**40), 2**40, (3000,), generator=g, dtype=torch.int64),
        "mask": torch.rand(77, generator=g) > 0.5,
        "scale": torch.tensor(3.25),                                              # 0-d
        "empty": torch.zeros(0, 8),
        "fp8": torch.randn(64, generator=g).to(torch.float8_e4m3fn),
    }
    state = {k: v.to(device) for k, v in state.items()}
    state["step"] = 1234
    state["note"] = "tiny model"
    return state


def blank_like(state):
    """Zeros of each tensor's shape, dtype, device and strides; other
    values of their type, empty."""
    return {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else type(v)()) for k, v in state.items()}


def test_a_state_dict_saves_and_loads_into_device_tensors_as_dcps_filesystem_and_torch_save_do(server, client, session, tmp_path):
    original = model_state(1)
    writer = HipObjStorageWriter("s3://bucket/ckpt/one", client=client, session=session)
    dcp.save(original, storage_writer=writer)
    dcp.save(original, storage_writer=dcp.FileSystemWriter(str(tmp_path / "fs")))
    listed = sorted(o["Key"] for o in client.list_objects_v2(Bucket="bucket", Prefix="ckpt/one/")["Contents"])
    assert listed == ["ckpt/one/.metadata", "ckpt/one/__0_0.distcp"]

    ours = blank_like(original)
    dcp.load(ours, storage_reader=HipObjStorageReader("s3://bucket/ckpt/one", client=client, session=session))
    theirs = blank_like(original)
    dcp.load(theirs, storage_reader=dcp.FileSystemReader(str(tmp_path / "fs")))
    buffer = io.BytesIO()
    torch.save(original, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, map_location=DEVICE, weights_only=False)
    for name, value in original.items():
        if isinstance(value, torch.Tensor):
            assert ours[name].device.type == DEVICE, name
        assert same(ours[name], value), name
        assert same(ours[name], theirs[name]), name
        assert same(ours[name], saved[name]), name
    assert session.stats.rdma == 0 and session.stats.fallback > 0 and session.stats.failed == 0


def _rank(rank, world, port, endpoint, outdir):
    """One rank of two, both on GPU 0 or the CPU (gloo carries DCP's
    plans)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if DEVICE == "cuda":
        torch.cuda.set_device(0)
    mesh = init_device_mesh(DEVICE, (world,))
    full = sharded_full()
    saved_dims = {k: (1 if k == "cols" else 0) for k in full}

    def sharded(state, dims):
        return {k: DTensor.from_local(v.chunk(world, dim=dims[k])[rank].contiguous(), mesh, [Shard(dims[k])],
                                      run_check=False) for k, v in state.items()}

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=ACCESS,
                          aws_secret_access_key=SECRET)
    with hipobj.Session() as session:
        uri = "s3://bucket/ckpt/sharded"
        dcp.save(sharded(full, saved_dims), storage_writer=HipObjStorageWriter(uri, client=client, session=session))
        dcp.save(sharded(full, saved_dims), storage_writer=dcp.FileSystemWriter(os.path.join(outdir, "fs-sharded")))
        # Loaded as saved, then resharded the other way (rows saved, columns
        # loaded: many ranges of each stored chunk, or whole rows of it).
        for dims in (saved_dims, {k: 1 - d for k, d in saved_dims.items()}):
            back = sharded({k: torch.zeros_like(v) for k, v in full.items()}, dims)
            dcp.load(back, storage_reader=HipObjStorageReader(uri, client=client, session=session))
            for k, v in full.items():
                assert same(back[k].to_local(), v.chunk(world, dim=dims[k])[rank]), (rank, dims[k], k)
        print(f"rank {rank}: stats {session.stats}")
    dist.barrier()
    dist.destroy_process_group()


def sharded_full():
    full = {k: v for k, v in model_state(2).items() if isinstance(v, torch.Tensor) and v.dim() == 2}
    full["cols"] = torch.arange(300 * 96, dtype=torch.float32, device=DEVICE).reshape(300, 96)
    full["small2d"] = torch.arange(40 * 64, dtype=torch.int32, device=DEVICE).reshape(40, 64)
    return full


def test_a_checkpoint_sharded_over_two_ranks_loads_back_sharded_and_whole(server, client, session, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(2, port, server.endpoint, str(tmp_path)), nprocs=2, start_method="spawn")
    listed = sorted(o["Key"] for o in client.list_objects_v2(Bucket="bucket", Prefix="ckpt/sharded/")["Contents"])
    assert listed == ["ckpt/sharded/.metadata", "ckpt/sharded/__0_0.distcp", "ckpt/sharded/__1_0.distcp"]
    full = sharded_full()
    # Resharded on load: whole tensors (one process, no process group),
    # each read from both ranks' objects; "cols" (sharded by columns) by
    # many ranges, "attn.qkv" by row ranges.
    ours = {k: torch.zeros_like(v) for k, v in full.items()}
    dcp.load(ours, storage_reader=HipObjStorageReader("s3://bucket/ckpt/sharded", client=client, session=session))
    theirs = {k: torch.zeros_like(v) for k, v in full.items()}
    dcp.load(theirs, storage_reader=dcp.FileSystemReader(str(tmp_path / "fs-sharded")))
    for k, v in full.items():
        assert same(ours[k], v) and same(theirs[k], v), k
    # A sub-box: a column-sharded tensor read into a non-contiguous view.
    part = {"cols": torch.zeros(96, 300, device=DEVICE).t()}
    dcp.load(part, storage_reader=HipObjStorageReader("s3://bucket/ckpt/sharded", client=client, session=session))
    assert same(part["cols"].contiguous(), full["cols"])


def test_the_connector_names_save_and_load_a_checkpoint(server, session, tmp_path):
    original = model_state(3)
    writer = S3StorageWriter(region="us-east-1", path="s3://bucket/ckpt/named", endpoint=server.endpoint,
                             session=session, thread_count=4)
    dcp.save(original, storage_writer=writer)
    back = blank_like(original)
    dcp.load(back, storage_reader=S3StorageReader(region="us-east-1", path="s3://bucket/ckpt/named",
                                                 endpoint=server.endpoint, session=session))
    for k, v in original.items():
        assert same(back[k], v), k
    # The checkpoint id given to dcp.save instead of the path.
    writer = S3StorageWriter(region="us-east-1", path="s3://bucket/ckpt/unused", endpoint=server.endpoint, session=session)
    dcp.save(original, storage_writer=writer, checkpoint_id="s3://bucket/ckpt/by-id")
    back = blank_like(original)
    dcp.load(back, checkpoint_id="s3://bucket/ckpt/by-id",
             storage_reader=S3StorageReader(region="us-east-1", path="s3://bucket/ckpt/unused",
                                            endpoint=server.endpoint, session=session))
    assert same(back["embed.weight"], original["embed.weight"])


def test_s3checkpoint_round_trips_torch_save(server, client, session):
    checkpoint = s3tc.S3Checkpoint(region="us-east-1", endpoint=server.endpoint, session=session)
    original = model_state(4)
    with checkpoint.writer("s3://bucket/model.pt") as f:
        torch.save(original, f)
    with checkpoint.reader("s3://bucket/model.pt") as f:
        back = torch.load(f, map_location=DEVICE, weights_only=False)
    for k, v in original.items():
        assert same(back[k], v), k
    assert f.transfer.path == "fallback"


def decode(reader):
    return torch.load(reader, weights_only=True)


def test_datasets_feed_a_dataloader_with_workers(server, client, session):
    images = {}
    for i in range(48):
        g = torch.Generator().manual_seed(i)
        images[i] = torch.randint(0, 256, (3, 32, 32), generator=g, dtype=torch.uint8)
        buffer = io.BytesIO()
        torch.save(images[i], buffer)
        client.put_object(Bucket="bucket", Key=f"images/{i:03d}.pt", Body=buffer.getvalue())
    mapped = s3tc.S3MapDataset.from_prefix("s3://bucket/images/", region="us-east-1", endpoint=server.endpoint,
                                           transform=decode)
    assert len(mapped) == 48
    loader = torch.utils.data.DataLoader(mapped, batch_size=8, num_workers=2)
    seen = torch.cat([batch.to(DEVICE) for batch in loader])
    assert same(seen, torch.stack([images[i] for i in range(48)]).to(DEVICE))
    iterable = s3tc.S3IterableDataset.from_prefix("s3://bucket/images/", region="us-east-1", endpoint=server.endpoint,
                                                  transform=decode, enable_sharding=True)
    loader = torch.utils.data.DataLoader(iterable, batch_size=None, num_workers=3)
    got = sorted(int(t.sum()) for t in loader)
    assert got == sorted(int(images[i].sum()) for i in range(48))
