"""The few CUDA runtime calls a worker needs for the daemon's CUDA pools and
fences, through ``ctypes`` over libcudart: no CUDA Python package, no build
step, and importable where CUDA is absent (calls then raise
``CudaUnavailableError``).

Streams are ``cudaStream_t`` values; ``stream_handle()`` accepts an int, None
(the default stream), a ``torch.cuda.Stream`` (``.cuda_stream``) or a CuPy
stream (``.ptr``).
"""

import contextlib
import ctypes
import threading
from typing import Dict, Iterable, Iterator, Optional, Union

IPC_HANDLE_BYTES = 64  # cudaIpcMemHandle_t and cudaIpcEventHandle_t.

# Tried in order: the loader's search path, then /usr/local/cuda/lib64.
DEFAULT_CANDIDATES = tuple(
    prefix + name
    for prefix in ("", "/usr/local/cuda/lib64/")
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"))

GPU_ADVICE = "run the worker on the GPU node with CUDA installed"

# cudaError_t values meaning this process cannot use the GPU at all (no
# device or driver, driver too old, device unavailable, IPC refused).
_UNUSABLE_GPU = frozenset({3, 34, 35, 36, 46, 100, 101, 102, 205, 217, 800, 801,
                           802, 803, 804})
_INVALID_DEVICE, _INVALID_VALUE = 101, 1
_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x01
_EVENT_DISABLE_TIMING_INTERPROCESS = 0x02 | 0x04


class CudaError(RuntimeError):
    """A CUDA call failed. ``call`` names it, ``code`` is the cudaError_t
    (None when the runtime itself is missing)."""

    def __init__(self, message: str, call: str = "", code: Optional[int] = None):
        super().__init__(message)
        self.call = call
        self.code = code


class CudaUnavailableError(CudaError):
    """libcudart could not be loaded, or it reports that no GPU is usable
    here (no device, no or too old driver)."""


class _IpcHandle(ctypes.Structure):
    # Passed by value, as the runtime's own struct { char reserved[64]; }.
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


def to_ipc_handle(data: bytes, what: str = "handle") -> _IpcHandle:
    """The 64 handle bytes as the runtime takes them; ValueError otherwise."""
    data = bytes(data)
    if len(data) != IPC_HANDLE_BYTES:
        raise ValueError(f"{what} is {len(data)} bytes; a CUDA IPC handle is "
                         f"{IPC_HANDLE_BYTES}")
    handle = _IpcHandle()
    ctypes.memmove(ctypes.addressof(handle), data, IPC_HANDLE_BYTES)
    return handle


def stream_handle(stream: object) -> int:
    """The cudaStream_t of `stream` as an int (0: the default stream)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attribute in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int):
            return value
    raise TypeError(f"not a CUDA stream: {stream!r}")


class CudaRuntime:
    """libcudart loaded with ctypes. Methods raise CudaError (naming the call)
    or CudaUnavailableError; device-less calls act on the calling thread's
    current device."""

    def __init__(self, library: ctypes.CDLL, path: str):
        self.path = path
        self._lib = library
        lib = library
        c_int_p, c_void_pp = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p)
        signatures = {
            "cudaSetDevice": [ctypes.c_int],
            "cudaGetDevice": [c_int_p],
            "cudaDeviceGetByPCIBusId": [c_int_p, ctypes.c_char_p],
            "cudaIpcOpenMemHandle": [c_void_pp, _IpcHandle, ctypes.c_uint],
            "cudaIpcCloseMemHandle": [ctypes.c_void_p],
            "cudaIpcOpenEventHandle": [c_void_pp, _IpcHandle],
            "cudaIpcGetEventHandle": [ctypes.POINTER(_IpcHandle), ctypes.c_void_p],
            "cudaEventCreateWithFlags": [c_void_pp, ctypes.c_uint],
            "cudaEventRecord": [ctypes.c_void_p, ctypes.c_void_p],
            "cudaEventDestroy": [ctypes.c_void_p],
            "cudaStreamWaitEvent": [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint],
        }
        for name, argtypes in signatures.items():
            function = getattr(lib, name)  # AttributeError when missing.
            function.argtypes = argtypes
            function.restype = ctypes.c_int
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p

    @classmethod
    def load(cls, candidates: Iterable[str] = DEFAULT_CANDIDATES) -> "CudaRuntime":
        """The first candidate that opens and has every symbol; else
        CudaUnavailableError('libcudart could not be loaded: ...')."""
        failures = []
        for path in candidates:
            try:
                return cls(ctypes.CDLL(path), path)
            except OSError as e:
                failures.append(str(e))
            except AttributeError as e:
                failures.append(f"{path}: no symbol ({e})")
        raise CudaUnavailableError(
            "libcudart could not be loaded: " + ("; ".join(failures) or "no candidate"))

    def check(self, code: int, call: str) -> None:
        """Raises for a nonzero cudaError_t: CudaUnavailableError where no GPU
        is usable, CudaError otherwise; the message names the call."""
        if code == 0:
            return
        text = self._lib.cudaGetErrorString(code)
        message = f"{call}: {text.decode() if text else 'unknown error'} (CUDA error {code})"
        if code in _UNUSABLE_GPU:
            raise CudaUnavailableError(message, call, code)
        raise CudaError(message, call, code)

    def find_device(self, pci_bus_id: str, fallback: int) -> int:
        """The ordinal here of the GPU with that PCI bus id; `fallback` when the
        id is empty or not visible (other numbering, masked devices)."""
        if pci_bus_id:
            device = ctypes.c_int(-1)
            code = self._lib.cudaDeviceGetByPCIBusId(ctypes.byref(device),
                                                     pci_bus_id.encode())
            if code == 0:
                return device.value
            if code not in (_INVALID_DEVICE, _INVALID_VALUE):
                self.check(code, f"cudaDeviceGetByPCIBusId({pci_bus_id})")
        if fallback < 0:
            raise ValueError(f"no usable device: PCI bus id {pci_bus_id!r} and "
                             f"ordinal {fallback}")
        return fallback

    @contextlib.contextmanager
    def on_device(self, device: int) -> Iterator[None]:
        """Makes `device` current on this thread for the block, then restores
        the previous one."""
        previous = ctypes.c_int(-1)
        self.check(self._lib.cudaGetDevice(ctypes.byref(previous)), "cudaGetDevice")
        self.check(self._lib.cudaSetDevice(device), f"cudaSetDevice({device})")
        try:
            yield
        finally:
            if previous.value != device:
                self._lib.cudaSetDevice(previous.value)

    def ipc_open_mem_handle(self, handle: bytes) -> int:
        """cudaIpcOpenMemHandle (lazy peer access) on the current device."""
        ptr = ctypes.c_void_p()
        self.check(self._lib.cudaIpcOpenMemHandle(
            ctypes.byref(ptr), to_ipc_handle(handle, "ipc_handle"),
            _IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cudaIpcOpenMemHandle")
        return ptr.value or 0

    def ipc_close_mem_handle(self, ptr: int) -> None:
        """cudaIpcCloseMemHandle."""
        self.check(self._lib.cudaIpcCloseMemHandle(ctypes.c_void_p(ptr)),
                   "cudaIpcCloseMemHandle")

    def ipc_open_event_handle(self, handle: bytes) -> int:
        """cudaIpcOpenEventHandle: an event of another process."""
        event = ctypes.c_void_p()
        self.check(self._lib.cudaIpcOpenEventHandle(
            ctypes.byref(event), to_ipc_handle(handle, "event handle")),
            "cudaIpcOpenEventHandle")
        return event.value or 0

    def create_interprocess_event(self) -> int:
        """cudaEventCreateWithFlags(DisableTiming | Interprocess), current device."""
        event = ctypes.c_void_p()
        self.check(self._lib.cudaEventCreateWithFlags(
            ctypes.byref(event), _EVENT_DISABLE_TIMING_INTERPROCESS),
            "cudaEventCreateWithFlags")
        return event.value or 0

    def ipc_get_event_handle(self, event: int) -> bytes:
        """cudaIpcGetEventHandle: the 64 bytes another process opens."""
        handle = _IpcHandle()
        self.check(self._lib.cudaIpcGetEventHandle(ctypes.byref(handle),
                                                   ctypes.c_void_p(event)),
                   "cudaIpcGetEventHandle")
        return bytes(handle)

    def event_record(self, event: int, stream: object) -> None:
        """cudaEventRecord on `stream`."""
        self.check(self._lib.cudaEventRecord(ctypes.c_void_p(event),
                                             ctypes.c_void_p(stream_handle(stream))),
                   "cudaEventRecord")

    def stream_wait_event(self, stream: object, event: int) -> None:
        """Orders later work of `stream` after the event's latest record."""
        self.check(self._lib.cudaStreamWaitEvent(
            ctypes.c_void_p(stream_handle(stream)), ctypes.c_void_p(event), 0),
            "cudaStreamWaitEvent")

    def event_destroy(self, event: int) -> None:
        """cudaEventDestroy."""
        self.check(self._lib.cudaEventDestroy(ctypes.c_void_p(event)), "cudaEventDestroy")


_lock = threading.Lock()
# The CudaRuntime, or the CudaUnavailableError, once tried.
_loaded: Union[CudaRuntime, CudaUnavailableError, None] = None


def runtime() -> CudaRuntime:
    """The process-wide runtime, loaded once from DEFAULT_CANDIDATES (a failure
    is remembered and raised again as CudaUnavailableError)."""
    global _loaded  # pylint: disable=global-statement
    with _lock:
        if _loaded is None:
            try:
                _loaded = CudaRuntime.load()
            except CudaUnavailableError as e:
                _loaded = e
    if isinstance(_loaded, CudaUnavailableError):
        raise CudaUnavailableError(str(_loaded))
    return _loaded


class LoadFenceWaiter:
    """Makes CUDA streams wait on the daemon's load fences (the 64-byte
    LoadBackEvent.LayerLoaded.fence), without a host sync. Each distinct
    handle is opened once and kept until close(). Thread-safe.

        waiter = LoadFenceWaiter(pools.device.device)
        for event in session.load_back_events(tokens):
            if event.WhichOneof("event") == "layer_loaded":
                waiter.wait(event.layer_loaded.fence, torch.cuda.current_stream())
    """

    def __init__(self, device: int, cuda: Optional[CudaRuntime] = None):
        if device < 0:
            raise ValueError("device must be a CUDA device ordinal")
        self.device = device
        self._cuda = cuda or runtime()
        self._events: Dict[bytes, int] = {}
        self._lock = threading.Lock()

    def wait(self, fence: bytes, stream: object = None) -> None:
        """An empty fence (a backend without events) does nothing; a fence
        that is not 64 bytes is a ValueError."""
        fence = bytes(fence)
        if not fence:
            return
        to_ipc_handle(fence, "load fence")
        with self._lock, self._cuda.on_device(self.device):
            event = self._events.get(fence)
            if event is None:
                event = self._cuda.ipc_open_event_handle(fence)
                self._events[fence] = event
            self._cuda.stream_wait_event(stream, event)

    def close(self) -> None:
        """Stops waiting and releases the events."""
        with self._lock:
            events, self._events = list(self._events.values()), {}
        for event in events:
            with contextlib.suppress(CudaError), self._cuda.on_device(self.device):
                self._cuda.event_destroy(event)

    def __enter__(self) -> "LoadFenceWaiter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LayerWrittenFence:
    """A worker's "layer written" fence: an interprocess event it records on
    its stream after writing a layer; the daemon's copy waits on it.

        fence = LayerWrittenFence(pools.device.device)
        fence_id = session.register_fence(rank, fence.handle)   # once
        fence.record(stream); stream.layer_stored([backup], step,
                                                  fences={rank: fence_id})

    Record before sending layer_stored; release the fence (or close the
    session) before close()."""

    def __init__(self, device: int, cuda: Optional[CudaRuntime] = None):
        if device < 0:
            raise ValueError("device must be a CUDA device ordinal")
        self.device = device
        self._cuda = cuda or runtime()
        with self._cuda.on_device(device):
            self._event = self._cuda.create_interprocess_event()
            try:
                self.handle = self._cuda.ipc_get_event_handle(self._event)
            except CudaError:
                self._cuda.event_destroy(self._event)
                raise

    def record(self, stream: object = None) -> None:
        """Records the event on `stream` (the current one by default): the layer is written."""
        with self._cuda.on_device(self.device):
            self._cuda.event_record(self._event, stream)

    def close(self) -> None:
        """Destroys the event (after the daemon released its fence)."""
        if self._event:
            event, self._event = self._event, 0
            with self._cuda.on_device(self.device):
                self._cuda.event_destroy(event)

    def __enter__(self) -> "LayerWrittenFence":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
