"""Python client for hicached, the hierarchical KV-cache daemon.

    import hicache
    with hicache.Client() as client, client.session("scheduler") as s:
        hit = s.match([[1, 2, 3, 4]])[0]

Install the wheel (tools/build_wheel; docs/python-client.md): its gRPC stubs,
generated from proto/ when it was built, are ``hicache.v1``; the health
service's come from its dependency grpcio-health-checking
(``grpc_health.v1``). From a checkout, put client/python and Bazel's
``//proto:py_stubs`` output (``bazel-bin/proto/py``: packages
``hicache_proto`` and ``grpc_health``) on ``sys.path`` instead.
"""

from hicache._version import __version__  # noqa: F401
from hicache.info import (  # noqa: F401
    BlockAddress,
    BuildInfo,
    CacheStats,
    CpGroupStatus,
    DaemonInfo,
    EngineSettings,
    HostTierPersistence,
    KvFamily,
    LaneStats,
    Layout,
    PoolGeometry,
    PoolSegment,
    RankSegments,
)
from hicache.client import READ_METHODS, Client, service_config  # noqa: F401
from hicache.session import Session  # noqa: F401
from hicache.streams import BackupStream  # noqa: F401
from hicache.items import (  # noqa: F401
    AdmitItem,
    AdmitResult,
    CompleteItem,
    LoadBackResult,
    MatchResult,
)
from hicache.pages import Handle, PageList, Pages, pack_tokens  # noqa: F401
from hicache.rpc import valid_leader_target  # noqa: F401
from hicache.errors import (  # noqa: F401
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    HiCacheError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    StaleHandleError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from hicache.endpoint import (  # noqa: F401
    PACKAGED_SOCKET_PATH,
    Endpoint,
    default_socket_path,
    resolve_endpoint,
    socket_problem,
)
from hicache.cuda import (  # noqa: F401
    CudaError,
    CudaUnavailableError,
    LayerWrittenFence,
    LoadFenceWaiter,
)
from hicache.pools import DevicePool, RankPools, ShmPool, map_pool, map_rank  # noqa: F401

# The public API (mypy --strict: names a user may import from hicache).
__all__ = [
    "AbortedError",
    "AdmitItem",
    "AdmitResult",
    "AlreadyExistsError",
    "BackupStream",
    "BlockAddress",
    "BuildInfo",
    "CacheStats",
    "CancelledError",
    "Client",
    "CompleteItem",
    "CpGroupStatus",
    "CudaError",
    "CudaUnavailableError",
    "DaemonInfo",
    "DataLossError",
    "DeadlineExceededError",
    "default_socket_path",
    "DevicePool",
    "EngineSettings",
    "Endpoint",
    "FailedPreconditionError",
    "Handle",
    "HiCacheError",
    "HostTierPersistence",
    "InternalError",
    "InvalidArgumentError",
    "KvFamily",
    "LaneStats",
    "Layout",
    "LayerWrittenFence",
    "LoadBackResult",
    "LoadFenceWaiter",
    "map_pool",
    "map_rank",
    "MatchResult",
    "NotFoundError",
    "OutOfRangeError",
    "pack_tokens",
    "PACKAGED_SOCKET_PATH",
    "PageList",
    "Pages",
    "PermissionDeniedError",
    "PoolGeometry",
    "PoolSegment",
    "RankPools",
    "RankSegments",
    "READ_METHODS",
    "resolve_endpoint",
    "ResourceExhaustedError",
    "service_config",
    "Session",
    "ShmPool",
    "socket_problem",
    "StaleHandleError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "valid_leader_target",
    "__version__",
]
