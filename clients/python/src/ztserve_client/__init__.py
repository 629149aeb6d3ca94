"""ztserve_client: load tensors from a ztserve server into numpy arrays or torch tensors.

    from ztserve_client import Client
    weights = Client("http://127.0.0.1:8080").load("demo/dense")
"""

from ._artifacts import ArtifactStore
from ._client import TRANSFORMER_SHARD_DIMS, Client, Snapshot
from ._delta import DeltaError, DeltaHeader, apply_delta, parse_delta_header
from ._errors import (
    BrokenModel,
    ClientError,
    DigestMismatch,
    HTTPError,
    ModelChanged,
    NotFound,
    RangeNotSatisfiable,
    ServerError,
    TransferError,
    Unauthorized,
    Unavailable,
    VersionGone,
    ZtserveError,
)
from ._signing import BundleRefused

__all__ = [
    "Client",
    "ArtifactStore",
    "BundleRefused",
    "Snapshot",
    "TRANSFORMER_SHARD_DIMS",
    "ZtserveError",
    "HTTPError",
    "ClientError",
    "Unauthorized",
    "NotFound",
    "RangeNotSatisfiable",
    "BrokenModel",
    "ServerError",
    "Unavailable",
    "DigestMismatch",
    "ModelChanged",
    "TransferError",
    "VersionGone",
    "DeltaError",
    "DeltaHeader",
    "apply_delta",
    "parse_delta_header",
]
