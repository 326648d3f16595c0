"""The Amazon S3 Connector for PyTorch's DCP names over hipobj:

    # from s3torchconnector.dcp import S3StorageWriter, S3StorageReader
    from hipobj.s3torchconnector.dcp import S3StorageWriter, S3StorageReader

    dcp.save(state_dict, storage_writer=S3StorageWriter(region="us-east-1", path="s3://b/ckpt/step-1"))
    dcp.load(state_dict, storage_reader=S3StorageReader(region="us-east-1", path="s3://b/ckpt/step-1"))

``hipobj.dcp``'s writer and reader with the connector's arguments
(`region`, `path`, `s3client_config`, `thread_count`), plus `endpoint`,
`client` and `session`. The connector's `prefix_strategy` (spreading data
objects over key prefixes) is not supported: its objects are laid out as
``FileSystemWriter`` lays out files, which that strategy's default is too.
A checkpoint written by one is read by the same one only: the connector
stores ``torch.save``'d tensors, hipobj their raw bytes."""

from __future__ import annotations

from typing import Any, Optional

from .. import _session
from ..dcp import HipObjStorageReader, HipObjStorageWriter
from . import S3ClientConfig, make_client

__all__ = ["S3StorageReader", "S3StorageWriter"]


class S3StorageWriter(HipObjStorageWriter):
    """``HipObjStorageWriter`` under the connector's name and arguments."""

    def __init__(
        self,
        region: Optional[str],
        path: str,
        s3client_config: Optional[S3ClientConfig] = None,
        prefix_strategy: Any = None,
        thread_count: int = 1,
        *,
        endpoint: Optional[str] = None,
        client: Any = None,
        session: Optional[_session.Session] = None,
        **kwargs: Any,
    ) -> None:
        if prefix_strategy is not None:
            raise ValueError("prefix_strategy is not supported: data objects are named __RANK_0.distcp under the path")
        super().__init__(
            path,
            client=client if client is not None else make_client(region, endpoint, s3client_config),
            session=session,
            thread_count=max(thread_count, 1),
            **kwargs,
        )
        self.region = region


class S3StorageReader(HipObjStorageReader):
    """``HipObjStorageReader`` under the connector's name and arguments."""

    def __init__(
        self,
        region: Optional[str],
        path: str,
        s3client_config: Optional[S3ClientConfig] = None,
        reader_constructor: Any = None,
        *,
        endpoint: Optional[str] = None,
        client: Any = None,
        session: Optional[_session.Session] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            path,
            client=client if client is not None else make_client(region, endpoint, s3client_config),
            session=session,
            **kwargs,
        )
        self.region = region
