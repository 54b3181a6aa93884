"""A worker's view of the daemon's KV pools, for both backends.

    layout = client.layout()
    with hicache.map_rank(layout, rank) as pools:
        offset, nbytes = pools.device.block("kv", layer, physical_page)
        # CPU backend: pools.device is a ShmPool (host bytes):
        pools.device.view[offset:offset + nbytes]
        # CUDA backend: pools.device is a DevicePool (GPU memory):
        torch.as_tensor(pools.device, device="cuda")[offset:offset + nbytes]

Pages are *physical* pages of the rank's pool: logical page L lives on rank
L % cp_size as physical page L // cp_size (docs/cp-layout.md). Byte addresses
come from the layout's BlockAddress lists, never from a guessed order.
"""

import mmap
import os
from typing import Any, Dict, Optional, Sequence, Tuple, TypeVar, Union

from hicache.cuda import GPU_ADVICE, CudaError, CudaRuntime, CudaUnavailableError
from hicache.cuda import runtime as _runtime
from hicache.cuda import to_ipc_handle
from hicache.info import BlockAddress, Layout, PoolSegment

_PoolT = TypeVar("_PoolT", bound="_Pool")


class _Blocks:
    """Block addresses of one tier: (family, layer) -> BlockAddress."""

    def __init__(self, blocks: Sequence[BlockAddress], num_pages: int,
                 families: Sequence[str] = ()):
        self._blocks = {(b.family, b.layer): b for b in blocks}
        self.num_pages = num_pages
        self._families = {name: index for index, name in enumerate(families)}

    def locate(self, family: Union[int, str], layer: int, page: int,
               pool_size: int) -> Tuple[int, int]:
        if isinstance(family, str):
            if family not in self._families:
                raise KeyError(f"no KV family named {family!r}")
            family = self._families[family]
        block = self._blocks.get((family, layer))
        if block is None:
            raise KeyError(f"the layout has no block for family {family}, layer {layer}")
        if not 0 <= page < self.num_pages:
            raise IndexError(f"page {page} is not below the pool's {self.num_pages} pages")
        offset = block.offset + page * block.page_stride
        if offset + block.block_bytes > pool_size:
            raise IndexError(f"page {page} of (family {family}, layer {layer}) ends at "
                             f"{offset + block.block_bytes}, past the pool's {pool_size} bytes")
        return offset, block.block_bytes


class _Pool:
    kind = ""

    def __init__(self, name: str, size: int, blocks: Optional[_Blocks]):
        self.name = name
        self.size = size
        self._blocks = blocks or _Blocks((), 0)

    def block(self, family: Union[int, str], layer: int, page: int) -> Tuple[int, int]:
        """(offset, nbytes) of physical page `page` of block (family, layer):
        family is an index into layout.families or its name. KeyError for an
        unknown block, IndexError for a page outside the pool."""
        return self._blocks.locate(family, layer, page, self.size)

    def __enter__(self: _PoolT) -> _PoolT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


class ShmPool(_Pool):
    """A "shm" pool (CPU backend pools, CUDA host pools) mapped read-write and
    shared. ``view`` is a writable memoryview of all of it; release slices of
    it before close() (mmap refuses to close under exported buffers)."""

    kind = "shm"

    def __init__(self, name: str, size: int, blocks: Optional[_Blocks] = None):
        super().__init__(name, size, blocks)
        # shm_open(name) is /dev/shm/<name without the leading slash> on Linux.
        fd = os.open("/dev/shm/" + name.lstrip("/"), os.O_RDWR)
        try:
            self._mmap: Optional[mmap.mmap] = mmap.mmap(
                fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.view = memoryview(self._mmap)

    def read(self, offset: int, nbytes: int) -> bytes:
        """`nbytes` bytes at byte `offset` of the pool."""
        return bytes(self.view[offset:offset + nbytes])

    def write(self, offset: int, data: bytes) -> None:
        """Writes `data` at byte `offset` of the pool."""
        self.view[offset:offset + len(data)] = data

    def close(self) -> None:
        """Unmaps the pool (release views of it first)."""
        if self._mmap is not None:
            self.view.release()
            self._mmap.close()
            self._mmap = None


class DevicePool(_Pool):
    """A "cuda_ipc" pool: GPU memory opened with cudaIpcOpenMemHandle.
    ``ptr`` is a device pointer; ``__cuda_array_interface__`` (a flat uint8
    array of the whole pool) lets torch/CuPy/Numba wrap it without a copy.
    close() unmaps it; arrays made from it must not be used afterwards."""

    kind = "cuda_ipc"

    def __init__(self, name: str, size: int, ptr: int, device: int,
                 blocks: Optional[_Blocks] = None, cuda: Optional[CudaRuntime] = None):
        super().__init__(name, size, blocks)
        self.ptr = ptr
        self.device = device
        self._cuda = cuda  # None: nothing to close (a test-only pool).

    @classmethod
    def for_testing(cls, ptr: int, size: int, device: int = 0,
                    blocks: Sequence[BlockAddress] = (), num_pages: int = 0,
                    families: Sequence[str] = (), name: str = "test") -> "DevicePool":
        """A pool over an arbitrary pointer, without CUDA (tests only: the
        memory is neither opened nor closed)."""
        return cls(name, size, ptr, device, _Blocks(blocks, num_pages, families))

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        return {
            "version": 3,
            "shape": (self.size,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "strides": None,
            "stream": None,
        }

    def close(self) -> None:
        """Closes the CUDA IPC mapping."""
        if self._cuda is not None and self.ptr:
            ptr, self.ptr = self.ptr, 0
            with self._cuda.on_device(self.device):
                self._cuda.ipc_close_mem_handle(ptr)


def _gpu_error(segment: PoolSegment, cause: Exception) -> CudaError:
    where = f" [pool {segment.name!r} on device {segment.device}" + (
        f", PCI {segment.pci_bus_id}]" if segment.pci_bus_id else "]")
    message = str(cause)
    if not message.startswith("libcudart"):
        message = "a CUDA call failed: " + message
    message = "this pool is GPU memory (cuda_ipc) and " + message + where
    if isinstance(cause, CudaUnavailableError):
        return CudaUnavailableError(f"{message}; {GPU_ADVICE}", cause.call, cause.code)
    return CudaError(message, getattr(cause, "call", ""), getattr(cause, "code", None))


def map_pool(segment: PoolSegment, blocks: Optional[_Blocks] = None,
             cuda: Optional[CudaRuntime] = None) -> Union[ShmPool, DevicePool]:
    """Maps one PoolSegment. ValueError for an unknown kind, size 0 or an
    ipc_handle that is not 64 bytes; FileNotFoundError for a missing shm
    segment; CudaUnavailableError for a GPU pool where libcudart cannot be
    loaded or no GPU is usable; CudaError for other CUDA failures."""
    if segment.size_bytes == 0:
        raise ValueError(f"pool {segment.name!r} has size_bytes 0")
    if segment.kind == "shm":
        return ShmPool(segment.name, segment.size_bytes, blocks)
    if segment.kind != "cuda_ipc":
        raise ValueError(f"pool {segment.name!r} has kind {segment.kind!r}; this client maps "
                         "'shm' and 'cuda_ipc'")
    to_ipc_handle(segment.ipc_handle, "ipc_handle")  # Checked before CUDA.
    try:
        api = cuda or _runtime()
        device = api.find_device(segment.pci_bus_id, segment.device)
        with api.on_device(device):
            ptr = api.ipc_open_mem_handle(segment.ipc_handle)
    except CudaError as e:
        raise _gpu_error(segment, e) from None
    return DevicePool(segment.name, segment.size_bytes, ptr, device, blocks, api)


class RankPools:
    """The mapped device (L1) and host (L2) pools of one rank; either may be
    None where the layout names none. close() (or the with block) unmaps."""

    def __init__(self, rank: int, device: Optional[Union[ShmPool, DevicePool]],
                 host: Optional[Union[ShmPool, DevicePool]]):
        self.rank = rank
        self.device = device
        self.host = host

    def close(self) -> None:
        """Unmaps both pools."""
        for pool in (self.device, self.host):
            if pool is not None:
                pool.close()

    def __enter__(self) -> "RankPools":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def map_rank(layout: Layout, rank: int, cuda: Optional[CudaRuntime] = None) -> RankPools:
    """Maps the pools of `rank` from a Layout (Client.layout(); device first).
    KeyError when the daemon serves no pools of that rank; otherwise the
    errors of map_pool, with nothing left mapped."""
    segments = next((r for r in layout.ranks if r.rank == rank), None)
    if segments is None:
        raise KeyError(f"the daemon serves no pools of rank {rank}")
    families = [f.name for f in layout.families]
    device_blocks = _Blocks(layout.device_blocks, layout.geometry.device_pages_per_rank,
                            families)
    host_blocks = _Blocks(layout.host_blocks, layout.geometry.host_pages_per_rank, families)
    device = host = None
    try:
        if segments.device is not None and segments.device.kind:
            device = map_pool(segments.device, device_blocks, cuda)
        if segments.host is not None and segments.host.kind:
            host = map_pool(segments.host, host_blocks, cuda)
    except BaseException:
        if device is not None:
            device.close()
        raise
    return RankPools(rank, device, host)
