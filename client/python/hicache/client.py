"""Typed wrapper over the hicache.v1 gRPC API (see docs/api.md)."""

import contextlib
import os
import struct
import threading
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence

import grpc

from grpc_health.v1 import health_pb2, health_pb2_grpc
from hicache_proto.v1 import hicache_pb2 as pb
from hicache_proto.v1 import hicache_pb2_grpc as pb_grpc


class HiCacheError(Exception):
    """An RPC failed. ``code`` is the grpc.StatusCode, ``details`` the message."""

    def __init__(self, code: grpc.StatusCode, details: str, call: str):
        super().__init__(f"{call}: {code.name}: {details}")
        self.code = code
        self.details = details
        self.call = call


def default_socket_path() -> str:
    """$XDG_RUNTIME_DIR/hicached.sock, else /tmp/hicached.sock (as hicached)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return f"{runtime}/hicached.sock" if runtime else "/tmp/hicached.sock"


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as the API carries them: packed little-endian int32."""
    return struct.pack(f"<{len(tokens)}i", *tokens)


def _call(name, fn, request, timeout):
    try:
        return fn(request, timeout=timeout)
    except grpc.RpcError as e:  # pylint: disable=no-member
        raise HiCacheError(e.code(), e.details(), name) from None


@dataclass
class MatchResult:
    device_pages: List[int]
    device_tokens: int
    last_device_node: int
    last_host_node: int
    host_hit_tokens: int
    lock_handle: int = 0  # With lock=True: this hit's lock (0: no hit).


@dataclass
class LoadBackResult:
    load_id: int
    pages: List[int]
    device_tokens: int
    loaded_tokens: int
    node: int
    miss_reason: str
    layers_loaded: int = 0
    ok: bool = True
    lock_handle: int = 0  # The session's lock on `node` (release with unlock).


class Client:
    """A connection to one daemon (unix socket by default)."""

    def __init__(self, socket_path: Optional[str] = None, target: Optional[str] = None,
                 timeout: float = 10.0):
        self.target = target or f"unix:{socket_path or default_socket_path()}"
        self.timeout = timeout
        self._channel = grpc.insecure_channel(self.target)
        self.stub = pb_grpc.HiCacheStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def health(self, service: str = "") -> str:
        """'SERVING', 'NOT_SERVING', ..."""
        response = _call("Check", self._health.Check,
                         health_pb2.HealthCheckRequest(service=service), self.timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def stats(self) -> pb.CacheStats:
        return _call("Stats", self.stub.Stats, pb.GetStatsRequest(), self.timeout)

    def daemon_info(self) -> pb.GetStatsResponse:
        return _call("GetStats", self.stub.GetStats, pb.GetStatsRequest(), self.timeout)

    def layout(self) -> pb.GetLayoutResponse:
        return _call("GetLayout", self.stub.GetLayout, pb.GetLayoutRequest(), self.timeout)

    def evict(self, device_pages_per_lane=(), host_pages_per_rank=()) -> pb.EvictResponse:
        return _call("Evict", self.stub.Evict,
                     pb.EvictRequest(device_pages_per_lane=list(device_pages_per_lane),
                                     host_pages_per_rank=list(host_pages_per_rank)),
                     self.timeout)

    def session(self, client_name: str, role: str = "scheduler", rank: int = 0,
                namespace: str = "", lease_ms: int = 10000) -> "Session":
        """Opens a session; use it as a context manager to close it."""
        return Session(self, client_name, role, rank, namespace, lease_ms)


class Session:
    """An open session with a background keep-alive at a third of the lease."""

    def __init__(self, client: Client, client_name: str, role: str, rank: int,
                 namespace: str, lease_ms: int):
        self.client = client
        roles = {"scheduler": pb.ROLE_SCHEDULER, "worker": pb.ROLE_WORKER}
        if role not in roles:
            raise ValueError(f"role must be 'scheduler' or 'worker', got {role!r}")
        response = _call("OpenSession", client.stub.OpenSession,
                         pb.OpenSessionRequest(client_name=client_name, role=roles[role],
                                               rank=rank, namespace=namespace,
                                               lease_ms=lease_ms),
                         client.timeout)
        self.id = response.session_id
        self.lease_ms = response.lease_ms
        self._closed = threading.Event()
        self._keep_alive = threading.Thread(target=self._keep_alive_loop, daemon=True)
        self._keep_alive.start()

    def _keep_alive_loop(self):
        while not self._closed.wait(self.lease_ms / 3000.0):
            try:
                self.client.stub.KeepAlive(pb.KeepAliveRequest(session_id=self.id),
                                           timeout=self.client.timeout)
            except grpc.RpcError:  # pylint: disable=no-member
                pass  # Reported by the next real call.

    def close(self) -> pb.CloseSessionResponse:
        if self._closed.is_set():
            return pb.CloseSessionResponse()
        self._closed.set()
        self._keep_alive.join()
        return _call("CloseSession", self.client.stub.CloseSession,
                     pb.CloseSessionRequest(session_id=self.id), self.client.timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _rpc(self, name, request):
        return _call(name, getattr(self.client.stub, name), request, self.client.timeout)

    def allocate(self, num_pages: int = 0, owners: Sequence[int] = (),
                 mode: str = "any") -> List[int]:
        """Logical pages: an exact owner pattern, or num_pages in a mode
        ('any', 'zigzag', 'round_robin')."""
        modes = {"any": pb.COMPUTE_OWNER_MODE_UNSPECIFIED,
                 "zigzag": pb.COMPUTE_OWNER_MODE_ZIGZAG,
                 "round_robin": pb.COMPUTE_OWNER_MODE_ROUND_ROBIN}
        item = pb.AllocateItem(num_pages=num_pages, owners=list(owners), mode=modes[mode])
        response = self._rpc("Allocate", pb.AllocateRequest(session_id=self.id, items=[item]))
        return list(response.allocations[0].pages)

    def free(self, pages: Sequence[int]):
        self._rpc("Free", pb.FreeRequest(session_id=self.id, pages=list(pages)))

    def match(self, requests: Sequence[Sequence[int]], lock: bool = False) -> List[MatchResult]:
        response = self._rpc("MatchPrefix", pb.MatchPrefixRequest(
            session_id=self.id, lock=lock,
            items=[pb.MatchItem(tokens=pack_tokens(t)) for t in requests]))
        return [MatchResult(list(r.device.pages), r.device.valid_tokens, r.last_device_node,
                            r.last_host_node, r.host_hit_tokens, r.lock_handle)
                for r in response.results]

    def insert(self, tokens: Sequence[int], pages: Sequence[int], unfinished: bool = False,
               backup_id: int = 0) -> pb.InsertResult:
        response = self._rpc("Insert", pb.InsertRequest(session_id=self.id, items=[
            pb.InsertItem(tokens=pack_tokens(tokens), pages=list(pages),
                          unfinished=unfinished, backup_id=backup_id)]))
        return response.results[0]

    def lock(self, nodes: Sequence[int]) -> List[int]:
        """Locks each node once; returns one lock handle per node."""
        response = self._rpc("Lock", pb.LockRequest(session_id=self.id, nodes=list(nodes)))
        return list(response.lock_handles)

    def unlock(self, nodes: Sequence[int] = (), handles: Sequence[int] = ()):
        """Releases one lock per listed node, or exactly the locks `handles`
        (preferred: two requests that hit one node release independently)."""
        self._rpc("Unlock", pb.LockRequest(session_id=self.id, nodes=list(nodes),
                                           lock_handles=list(handles)))

    @contextlib.contextmanager
    def locked(self, nodes: Sequence[int]):
        """Holds device locks on `nodes` for the block."""
        self.lock(nodes)
        try:
            yield
        finally:
            self.unlock(nodes)

    def load_back(self, tokens: Sequence[int]) -> LoadBackResult:
        """Runs a load-back to completion (all per-layer events)."""
        return self.load_back_batch([tokens])[0]

    def load_back_batch(self, requests: Sequence[Sequence[int]]) -> List[LoadBackResult]:
        """Loads several requests back over one stream, to completion; one
        result per request, in order."""
        results = {}
        by_load = {}
        items = [pb.LoadItem(tokens=pack_tokens(t)) for t in requests]
        for event in self._load_stream(pb.LoadBackRequest(session_id=self.id, items=items)):
            kind = event.WhichOneof("event")
            if kind == "started":
                s = event.started
                results[s.item] = LoadBackResult(s.load_id, list(s.locations.pages),
                                                 s.device_tokens, s.loaded_tokens, s.node,
                                                 s.miss_reason, lock_handle=s.lock_handle)
                if s.load_id:
                    by_load[s.load_id] = results[s.item]
            elif kind == "layer_loaded":
                by_load[event.layer_loaded.load_id].layers_loaded += 1
            elif kind == "done":
                result = results[event.done.item]
                result.ok = event.done.ok
                if event.done.lock_handle:
                    result.lock_handle = event.done.lock_handle
        return [results[i] for i in range(len(requests))]

    def finish_load(self, load_id: int):
        """Abandons a load still running (its stream ends with done(ok=False))."""
        self._rpc("FinishLoad", pb.FinishLoadRequest(session_id=self.id, load_id=load_id))

    def subscribe(self):
        """A worker session's own events (pb.WorkerEvent): its rank's backup
        steps and loaded layers (with fences) and every outcome of its
        namespace. Returns once the subscription is live; iterate the
        returned stream, and cancel() it when done."""
        stream = self.client.stub.Subscribe(pb.SubscribeRequest(session_id=self.id))
        try:
            first = next(stream)
        except grpc.RpcError as e:  # pylint: disable=no-member
            raise HiCacheError(e.code(), e.details(), "Subscribe") from None
        if first.WhichOneof("event") != "subscribed":
            raise HiCacheError(grpc.StatusCode.INTERNAL, "no subscribed marker", "Subscribe")
        return stream

    def _load_stream(self, request) -> Iterator[pb.LoadBackEvent]:
        try:
            yield from self.client.stub.LoadBack(request, timeout=self.client.timeout)
        except grpc.RpcError as e:  # pylint: disable=no-member
            raise HiCacheError(e.code(), e.details(), "LoadBack") from None

    def load_back_events(self, tokens: Sequence[int]) -> Iterator[pb.LoadBackEvent]:
        """The raw event stream: started, layer_loaded..., done."""
        try:
            yield from self.client.stub.LoadBack(
                pb.LoadBackRequest(session_id=self.id, tokens=pack_tokens(tokens)),
                timeout=self.client.timeout)
        except grpc.RpcError as e:  # pylint: disable=no-member
            raise HiCacheError(e.code(), e.details(), "LoadBack") from None

    def backup_stream(self) -> "BackupStream":
        return BackupStream(self)

    def register_fence(self, rank: int, event_handle: bytes) -> int:
        """Registers a worker's "layer written" event (64 IPC handle bytes,
        e.g. hicache.LayerWrittenFence.handle) for `rank`; the fence id to
        name in layer_stored. CUDA backend only (FAILED_PRECONDITION else)."""
        return self._rpc("RegisterFence", pb.RegisterFenceRequest(
            session_id=self.id, rank=rank, event_handle=bytes(event_handle))).fence_id

    def release_fence(self, fence_id: int):
        self._rpc("ReleaseFence", pb.ReleaseFenceRequest(session_id=self.id,
                                                         fence_id=fence_id))


@dataclass
class _Pending:
    steps: int = 0
    committed_node: Optional[int] = None
    rolled_back: bool = False


class BackupStream:
    """The BackupSession stream of one session, as a context manager.

    prepare() returns backup ids; layer_stored(ids, step) streams each layer;
    wait_committed(id) blocks until the daemon commits (or rolls back) it.
    """

    def __init__(self, session: Session):
        self.session = session
        self._requests = []
        self._cv = threading.Condition()
        self._closed = False
        self._pending = {}
        self._prepared = []
        self._errors = []
        self._responses = session.client.stub.BackupSession(self._generator())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _generator(self):
        while True:
            with self._cv:
                while not self._requests and not self._closed:
                    self._cv.wait()
                if not self._requests and self._closed:
                    return
                message = self._requests.pop(0)
            yield message

    def _send(self, **kwargs):
        with self._cv:
            self._requests.append(pb.BackupClientMessage(session_id=self.session.id, **kwargs))
            self._cv.notify_all()

    def _read(self):
        try:
            for message in self._responses:
                kind = message.WhichOneof("message")
                with self._cv:
                    if kind == "prepared":
                        self._prepared.append(list(message.prepared.backup_ids))
                    elif kind == "step_done":
                        self._pending.setdefault(message.step_done.backup_id, _Pending()).steps += 1
                    elif kind == "committed":
                        self._pending.setdefault(message.committed.backup_id,
                                                 _Pending()).committed_node = message.committed.node
                    elif kind == "rolled_back":
                        self._pending.setdefault(message.rolled_back.backup_id,
                                                 _Pending()).rolled_back = True
                    elif kind == "error":
                        self._errors.append(message.error.message)
                    self._cv.notify_all()
        except grpc.RpcError:  # pylint: disable=no-member
            pass

    def prepare(self, specs: Sequence[tuple]) -> List[int]:
        """specs: (pages, logical_tokens) per request. 0 = skipped (host full)."""
        self._send(prepare=pb.BackupClientMessage.Prepare(specs=[
            pb.BackupSpec(pages=list(pages), logical_tokens=tokens) for pages, tokens in specs]))
        with self._cv:
            self._cv.wait_for(lambda: self._prepared or self._errors,
                              timeout=self.session.client.timeout)
            if self._errors:
                raise HiCacheError(grpc.StatusCode.INVALID_ARGUMENT, self._errors.pop(0),
                                   "BackupSession.prepare")
            if not self._prepared:
                raise HiCacheError(grpc.StatusCode.DEADLINE_EXCEEDED, "no reply", "prepare")
            return self._prepared.pop(0)

    def layer_stored(self, backup_ids: Sequence[int], step: int,
                     fences: Optional[dict] = None):
        """fences: {rank: fence_id} (CUDA backend): that rank's copy of the
        step waits on the fence's latest record."""
        self._send(layer_stored=pb.BackupClientMessage.LayerStored(
            backup_ids=list(backup_ids), step=step,
            fences=[pb.RankFence(rank=r, fence_id=f) for r, f in (fences or {}).items()]))

    def rollback(self, backup_id: int):
        self._send(rollback=pb.BackupClientMessage.Rollback(backup_id=backup_id))

    def wait_committed(self, backup_id: int, timeout: Optional[float] = None) -> Optional[int]:
        """The committed node id, or None if rolled back / timed out."""
        with self._cv:
            self._cv.wait_for(lambda: backup_id in self._pending and (
                self._pending[backup_id].committed_node is not None
                or self._pending[backup_id].rolled_back),
                timeout=timeout or self.session.client.timeout)
            pending = self._pending.get(backup_id)
            return pending.committed_node if pending else None

    def steps_done(self, backup_id: int) -> int:
        with self._cv:
            return self._pending.get(backup_id, _Pending()).steps

    def close(self):
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._reader.join(timeout=self.session.client.timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
