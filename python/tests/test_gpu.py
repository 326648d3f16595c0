"""On a GPU machine (``scripts/gpu/python.sh``): the package with
PyTorch's CUDA tensors and CuPy arrays, on the fake libhipobj whose GPU is
this machine's (``HIPOBJ_FAKE_REAL_GPU=cuda``: the fake fabric reads and
writes the real device memory, as a NIC would over PCIe). Models loaded
into CUDA tensors and checkpoints saved from them, byte for byte against
safetensors' own loader, and many GETs in flight into device memory."""

import json
import os

import numpy
import pytest
import safetensors.torch
import torch

import hipobj
from hipobj import safetensors as st

MIB = 1 << 20

if os.environ.get("HIPOBJ_FAKE_REAL_GPU") != "cuda" or not torch.cuda.is_available():
    raise RuntimeError("test_gpu.py runs on a GPU machine through scripts/gpu/python.sh")


def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(1024, 1024, generator=g),  # 4 MiB
        "attn.q": torch.randn(512, 512, generator=g).to(torch.bfloat16),
        "attn.k": torch.randn(512, 512, generator=g).to(torch.float16),
        "ids": torch.randint(-(2**40), 2**40, (3000,), generator=g, dtype=torch.int64),
        "mask": torch.rand(77, generator=g) > 0.5,
        "fp8": torch.randn(64, generator=g).to(torch.float8_e4m3fn),
        "empty": torch.zeros(0, 8),
    }


def same(a, b):
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8)) if a.numel() else True


@pytest.fixture
def gpu_session(fake):
    with hipobj.Session(gpu=0) as session:
        assert session.available, session.reason
        yield session


def test_a_model_loads_into_cuda_tensors_by_rdma_as_safetensors_loads_it(s3, gpu_session):
    tensors = state(1)
    blob = safetensors.torch.save(tensors, metadata={"step": "1"})
    s3.fake.objects[("bucket", "m.safetensors")] = blob
    loaded = st.load(s3, "bucket", "m.safetensors", framework="torch", device="cuda:0", session=gpu_session, span=MIB)
    reference = safetensors.torch.load(blob)
    assert loaded.keys() == reference.keys()
    for name, tensor in loaded.items():
        assert tensor.is_cuda and tensor.device.index == 0, name
        assert same(tensor, reference[name]), name
    assert gpu_session.stats.fallback == 0 and gpu_session.stats.rdma >= 4
    # One allocation: every tensor lies in it.
    base = min(t.data_ptr() for t in loaded.values() if t.numel())
    top = max(t.data_ptr() + t.numel() * t.element_size() for t in loaded.values())
    header = st.read_header(s3, "bucket", "m.safetensors")
    assert top - base <= header.data_len


def test_a_sharded_model_loads_into_cuda_with_every_shard_in_flight(s3, gpu_session):
    weight_map = {}
    shards = []
    for i in range(4):
        shard = {f"layer{i}.{k}": v for k, v in state(10 + i).items()}
        shards.append(shard)
        name = f"model-{i + 1:05d}-of-00004.safetensors"
        s3.fake.objects[("bucket", f"llm/{name}")] = safetensors.torch.save(shard)
        weight_map.update({k: name for k in shard})
    s3.fake.objects[("bucket", "llm/model.safetensors.index.json")] = json.dumps({"weight_map": weight_map}).encode()
    loaded = st.load_sharded(s3, "bucket", "llm/model.safetensors.index.json", framework="torch", device="cuda:0",
                             session=gpu_session)
    assert loaded.keys() == weight_map.keys()
    for shard in shards:
        for name, tensor in shard.items():
            assert loaded[name].is_cuda and same(loaded[name], tensor), name


def test_a_cuda_state_dict_is_saved_by_parallel_parts_read_from_device_memory(s3, gpu_session):
    tensors = {k: v.to("cuda:0") for k, v in state(2).items()}
    tensors["big"] = torch.arange(3 * MIB, dtype=torch.float32, device="cuda:0")  # 12 MiB
    t = st.save(s3, tensors, "bucket", "ckpt.safetensors", metadata={"step": "200"}, session=gpu_session,
                part_size=5 * MIB, jobs=3)
    assert t.path == "rdma" and t.parts == 4, t
    assert not t.verified and "GPU memory" in t.unverified
    stored = s3.fake.objects[("bucket", "ckpt.safetensors")]
    back = safetensors.torch.load(stored)
    assert back.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert same(back[name], tensor), name
    assert st.metadata(s3, "bucket", "ckpt.safetensors") == {"step": "200"}


def test_many_gets_in_flight_land_in_their_own_cuda_tensors(s3, gpu_session):
    datas = [numpy.random.default_rng(i).integers(0, 255, size=2 * MIB, dtype=numpy.uint8) for i in range(12)]
    for i, d in enumerate(datas):
        s3.fake.objects[("bucket", f"g{i}")] = d.tobytes()
    intos = [torch.zeros(2 * MIB, dtype=torch.uint8, device="cuda:0") for _ in datas]
    futures = [gpu_session.get_object_async(s3, Bucket="bucket", Key=f"g{i}", into=t) for i, t in enumerate(intos)]
    for f in hipobj.as_completed(futures):
        assert f.result().path == "rdma"
    for d, t in zip(datas, intos):
        assert numpy.array_equal(t.cpu().numpy(), d)


def test_cupy_arrays_load_and_save_too(s3, gpu_session):
    import cupy
    import safetensors.numpy as stnp

    arrays = {"a": numpy.arange(100_000, dtype=numpy.float32), "b": numpy.ones((3, 4), dtype=numpy.int16)}
    s3.fake.objects[("bucket", "c")] = stnp.save(arrays)
    loaded = st.load(s3, "bucket", "c", framework="cupy", session=gpu_session)
    for k, v in arrays.items():
        assert isinstance(loaded[k], cupy.ndarray) and numpy.array_equal(cupy.asnumpy(loaded[k]), v)
    st.save(s3, {k: cupy.asarray(v) for k, v in arrays.items()}, "bucket", "c2", session=gpu_session)
    back = stnp.load(s3.fake.objects[("bucket", "c2")])
    assert all(numpy.array_equal(back[k], v) for k, v in arrays.items())
