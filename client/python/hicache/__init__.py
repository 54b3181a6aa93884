"""Python client for hicached, the hierarchical KV-cache daemon.

    import hicache
    with hicache.Client() as client, client.session("scheduler") as s:
        hit = s.match([[1, 2, 3, 4]])[0]

The gRPC stubs (packages ``hicache_proto`` and ``grpc_health``) are generated
from proto/ at build time; put their directory on ``sys.path`` (Bazel's
``//proto:py_stubs`` output ``bazel-bin/proto/py``).
"""

from hicache.client import (  # noqa: F401
    AdmitItem,
    AdmitResult,
    BackupStream,
    Client,
    CompleteItem,
    HiCacheError,
    LoadBackResult,
    MatchResult,
    Pages,
    Session,
    default_socket_path,
    pack_tokens,
)
from hicache.cuda import (  # noqa: F401
    CudaError,
    CudaUnavailableError,
    LayerWrittenFence,
    LoadFenceWaiter,
)
from hicache.pools import DevicePool, RankPools, ShmPool, map_pool, map_rank  # noqa: F401
