"""Session: one open session with the daemon (keep-alive, reopen after a
daemon restart or a lapsed lease, the CP group leader redirect) and its
calls: match, admit, complete, allocate, lock, load-back, fences,
subscribe; backup_stream opens its BackupStream (hicache.streams)."""

from collections import abc
import contextlib
import logging
import re
import threading
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc

from hicache.errors import HiCacheError, StaleHandleError
from hicache.items import (AdmitItem, AdmitResult, CompleteItem, LoadBackResult, MatchResult,
                           _BACKUPS, _MODES, _enum)
from hicache.pages import Handle, PageList, Pages, Tokens, _handle_type, _put_pages, pack_tokens
from hicache.rpc import _leader_of, pb
from hicache.streams import BackupStream

if TYPE_CHECKING:  # Client makes sessions (hicache.client imports this module).
    from hicache.client import Client

__all__ = ["Session"]


_SESSION_LOST = re.compile(r"session '[^']*' is unknown|^no session '|^session is unknown")


def _session_lost(error: HiCacheError) -> bool:
    """The daemon does not know the session: it restarted, or the lease
    lapsed (either way every lock, page and id of the session is gone)."""
    return error.code == grpc.StatusCode.NOT_FOUND and bool(_SESSION_LOST.search(error.details))


class Session:
    """An open session with a background keep-alive at a third of the lease.

    Reopen: when the daemon no longer knows the session -- it restarted, or
    the lease lapsed while the daemon was unreachable -- the session opens a
    new one (same name, role, rank, namespace and lease) by itself, unless
    `auto_reopen` is False. `id` changes, `generation` counts the reopens,
    and `on_reopen(session, old_session_id)` is called once per reopen (on
    the thread that noticed: a caller's or the keep-alive thread). Node ids,
    lock handles, pages, backup, load and fence ids from before are invalid
    (the daemon that issued them is gone, or freed them with the lease) --
    drop every cached location in the callback. Values this session
    returned carry their generation (Handle, PageList, AdmitResult's
    request_pages, MatchResult...): a call naming an older one raises
    StaleHandleError before anything is sent. A call naming no daemon state
    (match, admit, allocate, load_back...) that found the session lost is
    sent again on the new session; one that named state raises
    StaleHandleError. Streams (backup_stream, subscribe) end with the daemon
    and must be opened again."""

    def __init__(self, client: "Client", client_name: str, role: str, rank: int,
                 namespace: str, lease_ms: int, *,
                 on_reopen: Optional[Callable[["Session", str], None]] = None,
                 auto_reopen: bool = True, event_instance: str = "",
                 event_model: str = ""):
        self.client = client
        roles = {"scheduler": pb.ROLE_SCHEDULER, "worker": pb.ROLE_WORKER}
        if role not in roles:
            raise ValueError(f"role must be 'scheduler' or 'worker', got {role!r}")
        self._open_request = pb.OpenSessionRequest(client_name=client_name, role=roles[role],
                                                   rank=rank, namespace=namespace,
                                                   lease_ms=lease_ms,
                                                   event_instance=event_instance,
                                                   event_model=event_model)
        self.on_reopen = on_reopen
        self.auto_reopen = auto_reopen
        self.reopens = 0
        self._reopen_lock = threading.Lock()
        # The client of the CP group leader this session was redirected to
        # (closed with the session); None when opened where asked.
        self._leader_client = None
        # Sent once, but (with the client's wait_for_ready) only once the
        # daemon is reachable: waiting never resends.
        try:
            response = client.call("OpenSession", self._open_request,
                                   wait_for_ready=client.wait_for_ready)
        except HiCacheError as e:
            if e.leader is None or not client.follow_leader:
                raise
            response = self._open_at_leader(e.leader)
        # (session id, generation, Handle type of that generation): replaced
        # as one by a reopen, so a call reads a consistent triple.
        self._current = (response.session_id, 0, _handle_type(0))
        self.lease_ms = response.lease_ms
        self._closed = threading.Event()
        self._keep_alive = threading.Thread(target=self._keep_alive_loop, daemon=True,
                                            name="hicache-keep-alive")
        self._keep_alive.start()

    def _open_at_leader(self, leader: str):
        """Opens the session on the CP group leader `leader` that the
        client's daemon named; at most one hop. On success every later call
        of the session goes to the leader (self.client)."""
        first = self.client
        leader_client = first.for_target(leader)
        try:
            response = leader_client.call("OpenSession", self._open_request,
                                          wait_for_ready=leader_client.wait_for_ready)
        except HiCacheError as e:
            leader_client.close()
            if e.leader is not None:
                raise HiCacheError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{first.target} is not the CP group leader and named {leader}, "
                    f"which is not the leader either and named {e.leader}; not followed "
                    "(at most one hop)", "OpenSession") from None
            raise HiCacheError(e.code, f"at the CP group leader {leader} (named by "
                               f"{first.target}): {e.details}", "OpenSession") from None
        except BaseException:
            leader_client.close()
            raise
        self.client = leader_client
        self._leader_client = leader_client
        return response

    @property
    def target(self) -> str:
        """The daemon the session lives on (the leader after a redirect)."""
        return self.client.target

    def _keep_alive_loop(self):
        while not self._closed.wait(self.lease_ms / 3000.0):
            session = self.id
            try:
                self.client.call("KeepAlive", pb.KeepAliveRequest(session_id=session))
            except HiCacheError as e:
                if self.auto_reopen and _session_lost(e) and not self._closed.is_set():
                    try:
                        self._reopen(session)
                    except HiCacheError:
                        pass  # The daemon is not back yet: the next beat tries again.
                    except Exception:  # pylint: disable=broad-except
                        # on_reopen raised: keep the session alive anyway.
                        logging.getLogger("hicache").exception("on_reopen failed")
                # Anything else is reported by the next real call.

    def _reopen(self, lost_id: str):
        """Opens a new session in place of `lost_id` (once: a thread that
        finds it already replaced returns). OpenSession waits for the
        daemon to be reachable (it is sent once, after the connection)."""
        with self._reopen_lock:
            if self.id != lost_id or self._closed.is_set():
                return
            response = self.client.call("OpenSession", self._open_request, wait_for_ready=True)
            self.lease_ms = response.lease_ms
            generation = self.generation + 1
            self._current = (response.session_id, generation, _handle_type(generation))
            self.reopens += 1
            callback = self.on_reopen
        if callback is not None:
            callback(self, lost_id)

    def close(self) -> pb.CloseSessionResponse:
        """Closes the session: its locks, pages and backups are released."""
        if self._closed.is_set():
            return pb.CloseSessionResponse()
        self._closed.set()
        self._keep_alive.join()
        try:
            return self.client.call("CloseSession", pb.CloseSessionRequest(session_id=self.id))
        except HiCacheError as e:
            if _session_lost(e):  # Already gone with the daemon (or the lease).
                return pb.CloseSessionResponse()
            raise
        finally:
            if self._leader_client is not None:
                self._leader_client.close()

    @property
    def id(self) -> str:
        """The session id (a new one after each reopen)."""
        return self._current[0]

    @property
    def generation(self) -> int:
        """How many times the session was reopened: ids the session returns
        carry it, and calls refuse ids of another generation."""
        return self._current[1]

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stale(self, name: str, handles, pages, generation: int) -> None:
        """Raises StaleHandleError if an id in `handles` (ints, or lists of
        ints, each checked) or a page sequence in `pages` (its own tag only:
        no walk over the pages) carries another generation than the
        session's. Untagged values (plain ints and lists) are not checked."""
        tags = [getattr(p, "generation", None) for p in pages]
        for value in handles:
            if isinstance(value, (list, tuple, abc.Sequence)) and not isinstance(value, Handle):
                tags.extend(getattr(v, "generation", None) for v in value)
            else:
                tags.append(getattr(value, "generation", None))
        for tag in tags:
            if tag is not None and tag >= 0 and tag != generation:
                raise StaleHandleError(
                    f"names daemon state (node ids, lock handles, pages, backup or load ids) "
                    f"of session generation {tag}; the session was reopened (now generation "
                    f"{generation}, id '{self.id}') after the daemon restarted or the lease "
                    f"lapsed: those are invalid, match or admit again", name)

    def _rpc_tagged(self, name, request, handles=(), pages=(), **kwargs):
        """One unary call on this session: (response, generation, Handle
        type) of the session that answered. `handles`, `pages`: the daemon
        state the request names (see _stale). A call that names none is
        sent again once the session was reopened; one that does raises
        StaleHandleError."""
        session, generation, handle = self._current
        if handles or pages:
            self._stale(name, handles, pages, generation)
        request.session_id = session
        try:
            return self.client.call(name, request, **kwargs), generation, handle
        except HiCacheError as e:
            if not (self.auto_reopen and _session_lost(e)):
                raise
            self._reopen(session)
            names_state = any(len(p) for p in pages) or any(
                (len(h) if isinstance(h, abc.Sized) else h) for h in handles)
            if names_state:
                raise StaleHandleError(f"{e.details}; the session was reopened as '{self.id}', "
                                       "and the ids this call names are invalid", name) from None
            session, generation, handle = self._current
            request.session_id = session
            return self.client.call(name, request, **kwargs), generation, handle

    def _rpc(self, name, request, handles=(), pages=(), **kwargs):
        return self._rpc_tagged(name, request, handles, pages, **kwargs)[0]

    def allocate(self, num_pages: int = 0, owners: Sequence[int] = (),
                 mode: str = "any") -> List[int]:
        """Logical pages: an exact owner pattern, or num_pages in a mode
        ('any', 'zigzag', 'round_robin')."""
        item = pb.AllocateItem(num_pages=num_pages, owners=list(owners),
                               mode=_enum(_MODES, mode, "mode"))
        response, generation, _ = self._rpc_tagged("Allocate", pb.AllocateRequest(items=[item]))
        return PageList(response.allocations[0].pages, generation)

    def free(self, pages: Sequence[int]) -> None:
        """Frees pages this session allocated and did not insert."""
        self._rpc("Free", pb.FreeRequest(session_id=self.id, pages=list(pages)), pages=(pages,))

    def match(self, requests: Sequence[Tokens], lock: bool = False, peek: bool = False,
              exact_tail: bool = False) -> List[MatchResult]:
        """Device and host hits per request. A query that ends exactly at a
        cached sub-page tail is floored to the page boundary unless
        `exact_tail` (then the tail is valid for reading only)."""
        request = pb.MatchPrefixRequest(
            session_id=self.id, lock=lock, peek=peek, exact_tail=exact_tail,
            items=[pb.MatchItem(tokens=pack_tokens(t)) for t in requests])
        # Without a lock a match changes nothing but hit counts: let it wait
        # for a daemon that is not up yet (sent once connected; the service
        # config cannot single these out of MatchPrefix).
        response, generation, handle = self._rpc_tagged(
            "MatchPrefix", request, wait_for_ready=True if not lock else None)
        return [MatchResult(PageList(r.device.pages, generation), r.device.valid_tokens,
                            handle(r.last_device_node), handle(r.last_host_node),
                            r.host_hit_tokens, handle(r.lock_handle), r.tail_blocked)
                for r in response.results]

    def query_tiers(self, requests: Sequence[Tokens]) -> List[Tuple[int, int]]:
        """For each token sequence of this session's namespace: the tokens
        matchable on device and, past them, loadable from the host tier. A
        pure lookup (no hit counted, nothing locked)."""
        response = self._rpc("QueryTiers", pb.QueryTiersRequest(
            session_id=self.id, queries=[pb.TierQuery(tokens=pack_tokens(t))
                                         for t in requests]))
        return [(h.device_tokens, h.host_tokens) for h in response.hits]

    def admit(self, items: Sequence[Union[AdmitItem, Tokens]]) -> List[AdmitResult]:
        """One round trip before a forward pass, per item in order: match
        (page-floored), lock the device hit, allocate the rest of the request
        (and its output reserve) and, per the item's backup choice, prepare a
        per-layer backup of the new input pages. An item whose host hit is
        worth loading answers ``load`` (call load_back with extend_tokens,
        then allocate); one that does not fit holds nothing and answers
        ``admitted=False``, as does every item after it. Items may be
        AdmitItem or plain token sequences (no reserve, any lanes, auto)."""
        request = pb.AdmitRequest(session_id=self.id)
        add = request.items.add
        for item in items:
            if isinstance(item, AdmitItem):
                add(tokens=pack_tokens(item.tokens), reserve_tokens=item.reserve_tokens,
                    mode=_enum(_MODES, item.mode, "mode"),
                    backup=_enum(_BACKUPS, item.backup, "backup"),
                    unfinished=item.unfinished)
            else:
                add(tokens=pack_tokens(item))
        results = []
        response, generation, handle = self._rpc_tagged("Admit", request)
        for r in response.results:
            device = r.device
            results.append(AdmitResult(r.admitted, Pages(device.pages, generation=generation),
                                       device.valid_tokens, handle(r.lock_handle),
                                       handle(r.last_device_node), r.host_hit_tokens,
                                       handle(r.last_host_node), r.load,
                                       Pages(r.pages, generation=generation),
                                       handle(r.backup_id), r.tail_blocked, generation))
        return results

    def complete(self, items: Sequence[CompleteItem]) -> List[pb.InsertResult]:
        """One round trip after a forward pass, per item: insert (attaching
        the backup), then -- unless the insert was ``deferred`` (a backup in
        flight blocks it: the tree is unchanged, the locks and pages stay
        the session's; retry the item once that backup ended) -- release the
        lock handles and free the uncached and `free_pages`. Every handle and
        page is checked before anything changes.

        A deferred item keeps its own backup for the retry too (daemons
        before 19c7672 rolled it back, and a retry naming it was
        INVALID_ARGUMENT: hicache.replay then retries with backup_id=0)."""
        request = pb.CompleteRequest(session_id=self.id)
        add = request.items.add
        handles, pages = [], []
        for item in items:
            added = add(tokens=pack_tokens(item.tokens), unfinished=item.unfinished,
                        backup_id=item.backup_id, lock_handles=item.lock_handles,
                        free_uncached=item.free_uncached)
            _put_pages(added.pages, item.pages)
            _put_pages(added.free_pages, item.free_pages)
            handles.append(item.backup_id)
            handles.append(item.lock_handles)
            pages.append(item.pages)
            pages.append(item.free_pages)
        return list(self._rpc("Complete", request, handles, pages).results)

    def insert(self, tokens: Tokens, pages: Sequence[int], unfinished: bool = False,
               backup_id: int = 0) -> pb.InsertResult:
        """Inserts `tokens` whose KV is in `pages`, attaching `backup_id`."""
        response = self._rpc("Insert", pb.InsertRequest(session_id=self.id, items=[
            pb.InsertItem(tokens=pack_tokens(tokens), pages=list(pages),
                          unfinished=unfinished, backup_id=backup_id)]),
            (backup_id,), (pages,))
        return response.results[0]

    def lock(self, nodes: Sequence[int]) -> List[int]:
        """Locks each node once; returns one lock handle per node."""
        response, _, handle = self._rpc_tagged("Lock", pb.LockRequest(nodes=list(nodes)),
                                               (nodes,))
        return [handle(h) for h in response.lock_handles]

    def unlock(self, nodes: Sequence[int] = (), handles: Sequence[int] = ()):
        """Releases one lock per listed node, or exactly the locks `handles`
        (preferred: two requests that hit one node release independently)."""
        self._rpc("Unlock", pb.LockRequest(session_id=self.id, nodes=list(nodes),
                                           lock_handles=list(handles)), (nodes, handles))

    @contextlib.contextmanager
    def locked(self, nodes: Sequence[int]):
        """Holds device locks on `nodes` for the block."""
        self.lock(nodes)
        try:
            yield
        finally:
            self.unlock(nodes)

    def load_back(self, tokens: Tokens, extend_tokens: int = 0) -> LoadBackResult:
        """Runs a load-back to completion (all per-layer events).
        `extend_tokens`: the request's own extend (new input past the hit plus
        its output reserve); the load is a miss ('over_quota') unless the
        device keeps room for ceil(extend_tokens / P) + 1 pages besides it."""
        return self.load_back_batch([tokens], extend_tokens)[0]

    def load_back_batch(self, requests: Sequence[Tokens],
                        extend_tokens: Union[int, Sequence[int]] = 0) -> List[LoadBackResult]:
        """Loads several requests back over one stream, to completion; one
        result per request, in order. `extend_tokens`: one for all, or one
        per request (see load_back)."""
        results = {}
        by_load = {}
        if isinstance(extend_tokens, int):
            extend_tokens = [extend_tokens] * len(requests)
        elif len(extend_tokens) != len(requests):
            raise ValueError(f"extend_tokens has {len(extend_tokens)} entries "
                             f"for {len(requests)} requests")
        items = [pb.LoadItem(tokens=pack_tokens(t), extend_tokens=e)
                 for t, e in zip(requests, extend_tokens)]
        for event, generation, handle in self._load_stream(pb.LoadBackRequest(items=items)):
            kind = event.WhichOneof("event")
            if kind == "started":
                s = event.started
                results[s.item] = LoadBackResult(
                    handle(s.load_id), PageList(s.locations.pages, generation),
                    s.device_tokens, s.loaded_tokens, handle(s.node), s.miss_reason,
                    lock_handle=handle(s.lock_handle))
                if s.load_id:
                    by_load[s.load_id] = results[s.item]
            elif kind == "layer_loaded":
                by_load[event.layer_loaded.load_id].layers_loaded += 1
            elif kind == "done":
                result = results[event.done.item]
                result.ok = event.done.ok
                if event.done.lock_handle:
                    result.lock_handle = handle(event.done.lock_handle)
        return [results[i] for i in range(len(requests))]

    def finish_load(self, load_id: int):
        """Abandons a load still running (its stream ends with done(ok=False))."""
        self._rpc("FinishLoad", pb.FinishLoadRequest(session_id=self.id, load_id=load_id),
                  (load_id,))

    def subscribe(self):
        """A worker session's own events (pb.WorkerEvent): its rank's backup
        steps and loaded layers (with fences) and every outcome of its
        namespace. Returns once the subscription is live; iterate the
        returned stream, and cancel() it when done."""
        stream = self.client.stub.Subscribe(pb.SubscribeRequest(session_id=self.id))
        try:
            first = next(stream)
        except grpc.RpcError as e:  # pylint: disable=no-member
            raise HiCacheError(e.code(), e.details(), "Subscribe",
                               leader=_leader_of(e)) from None
        if first.WhichOneof("event") != "subscribed":
            raise HiCacheError(grpc.StatusCode.INTERNAL, "no subscribed marker", "Subscribe")
        return stream

    def _load_stream(self, request):
        """(event, generation, Handle type) of one LoadBack; sent again on
        a reopened session when the daemon did not know this one (nothing
        was loaded)."""
        for attempt in range(2):
            session, generation, handle = self._current
            request.session_id = session
            started = False
            try:
                for event in self.client.stub.LoadBack(request, timeout=self.client.timeout):
                    started = True
                    yield event, generation, handle
                return
            except grpc.RpcError as e:  # pylint: disable=no-member
                error = HiCacheError(e.code(), e.details(), "LoadBack",
                                     leader=_leader_of(e))
            if started or attempt or not (self.auto_reopen and _session_lost(error)):
                raise error
            self._reopen(session)

    def load_back_events(self, tokens: Tokens,
                         extend_tokens: int = 0) -> Iterator[pb.LoadBackEvent]:
        """The raw event stream: started, layer_loaded..., done."""
        try:
            yield from self.client.stub.LoadBack(
                pb.LoadBackRequest(session_id=self.id, tokens=pack_tokens(tokens),
                                   extend_tokens=extend_tokens),
                timeout=self.client.timeout)
        except grpc.RpcError as e:  # pylint: disable=no-member
            raise HiCacheError(e.code(), e.details(), "LoadBack",
                               leader=_leader_of(e)) from None

    def backup_stream(self, direct: Union[bool, str] = True) -> "BackupStream":
        """A stream for preparing backups and reporting stored layers."""
        return BackupStream(self, direct)

    def register_fence(self, rank: int, event_handle: bytes) -> int:
        """Registers a worker's "layer written" event (64 IPC handle bytes,
        e.g. hicache.LayerWrittenFence.handle) for `rank`; the fence id to
        name in layer_stored. CUDA backend only (FAILED_PRECONDITION else)."""
        response, _, handle = self._rpc_tagged("RegisterFence", pb.RegisterFenceRequest(
            rank=rank, event_handle=bytes(event_handle)))
        return handle(response.fence_id)

    def release_fence(self, fence_id: int):
        """Releases a fence register_fence returned (CUDA backend)."""
        self._rpc("ReleaseFence", pb.ReleaseFenceRequest(session_id=self.id,
                                                         fence_id=fence_id), (fence_id,))
