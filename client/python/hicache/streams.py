"""BackupStream: a session's BackupSession stream (prepare backups, report
stored layers, wait for commits), and the senders that put its messages on
the wire (_QueuedSender, _DirectSender, _BackgroundSender)."""

import collections
from dataclasses import dataclass
import queue
import threading
import time
from typing import TYPE_CHECKING, List, Optional, Sequence, Union

import grpc

from hicache.errors import HiCacheError
from hicache.rpc import _STATUS_CODES, _leader_of, pb

if TYPE_CHECKING:  # Sessions open streams (hicache.session imports this module).
    from hicache.session import Session

__all__ = ["BackupStream"]


@dataclass
class _Pending:
    steps: int = 0
    committed_node: Optional[int] = None
    rolled_back: bool = False


_BACKUP_SESSION = "/hicache.v1.HiCache/BackupSession"


class _QueuedSender:
    """Sends a bidi stream's messages through gRPC's public API: a generator
    that gRPC's request thread drains from a queue. Each message wakes that
    thread, which waits for the send to complete before taking the next."""

    _CLOSE = object()

    def __init__(self, channel):
        self._outbox = queue.SimpleQueue()
        self.responses = channel.stream_stream(
            _BACKUP_SESSION, request_serializer=None,
            response_deserializer=pb.BackupServerMessage.FromString)(self._generator())

    def _generator(self):
        get = self._outbox.get
        while True:
            message = get()
            if message is self._CLOSE:
                return
            yield message

    def send(self, data: bytes):
        self._outbox.put(data)

    def close(self):
        self._outbox.put(self._CLOSE)


class _DirectSender:
    """Sends a bidi stream's messages from the calling thread: a message
    starts at once when none is in flight, else the completion of the one in
    flight starts it (on gRPC's channel thread). No request-iterator thread
    (which takes a message from the iterator, starts it, then sleeps until
    gRPC's channel thread says it was sent): on a 2-core host about 100 us
    of CPU less per message.

    Built on grpcio's internal call machinery (grpc._channel, cygrpc), which
    is not a public API: `create` returns None where it does not look as
    expected (another grpcio version), and the stream falls back to
    _QueuedSender."""

    @classmethod
    def create(cls, channel):
        try:
            from grpc import _channel as impl  # pylint: disable=import-outside-toplevel
            from grpc._cython import cygrpc  # pylint: disable=import-outside-toplevel
            multicallable = channel.stream_stream(
                _BACKUP_SESSION, request_serializer=None,
                response_deserializer=pb.BackupServerMessage.FromString)
            for name in ("_managed_call", "_method", "_context"):
                getattr(multicallable, name)
            return cls(impl, cygrpc, multicallable)
        except (ImportError, AttributeError, TypeError):
            return None

    def __init__(self, impl, cygrpc, multicallable):
        self._cygrpc = cygrpc
        self._flags = impl._EMPTY_FLAGS  # pylint: disable=protected-access
        self._send_type = cygrpc.OperationType.send_message
        self._queue = collections.deque()
        self._in_flight = False
        self._closing = False
        deserialize = pb.BackupServerMessage.FromString
        self._state = state = impl._RPCState(  # pylint: disable=protected-access
            impl._STREAM_STREAM_INITIAL_DUE, None, None, None, None)  # pylint: disable=protected-access
        base = impl._event_handler(state, deserialize)  # pylint: disable=protected-access
        send_type = self._send_type

        def handle_event(event):
            operations = event.batch_operations
            if len(operations) == 1 and operations[0].type() == send_type:
                # A send completed: nobody waits for that, so the reader
                # thread (waiting on the same condition) is not woken.
                with state.condition:
                    state.due.discard(send_type)
                    self._in_flight = False
                    self._start_next_locked()
                    return not state.due
            return base(event)

        self._handle_event = handle_event
        operations = (
            (cygrpc.SendInitialMetadataOperation(
                None, impl._InitialMetadataFlags()),  # pylint: disable=protected-access
             cygrpc.ReceiveStatusOnClientOperation(self._flags)),
            (cygrpc.ReceiveInitialMetadataOperation(self._flags),),
        )
        self._call = multicallable._managed_call(  # pylint: disable=protected-access
            cygrpc.PropagationConstants.GRPC_PROPAGATE_DEFAULTS,
            multicallable._method, None,  # pylint: disable=protected-access
            impl._determine_deadline(None), None, None,  # pylint: disable=protected-access
            operations, handle_event, multicallable._context)  # pylint: disable=protected-access
        self.responses = impl._MultiThreadedRendezvous(  # pylint: disable=protected-access
            state, self._call, deserialize, None)

    def _start_next_locked(self):
        state = self._state
        if self._in_flight or state.code is not None:
            return
        cygrpc = self._cygrpc
        if self._queue:
            state.due.add(self._send_type)
            operation = cygrpc.SendMessageOperation(self._queue.popleft(), self._flags)
            if self._call.operate((operation,), self._handle_event):
                self._in_flight = True
            else:
                state.due.discard(self._send_type)
        elif self._closing:
            self._closing = False
            close_type = cygrpc.OperationType.send_close_from_client
            state.due.add(close_type)
            if not self._call.operate(
                    (cygrpc.SendCloseFromClientOperation(self._flags),), self._handle_event):
                state.due.discard(close_type)

    def send(self, data: bytes):
        with self._state.condition:
            self._queue.append(data)
            self._start_next_locked()

    def close(self):
        with self._state.condition:
            self._closing = True
            self._start_next_locked()


class _BackgroundSender:
    """Hands messages to a _DirectSender on a thread of its own: starting a
    send writes to the socket (about 100 us here), which then happens off
    the caller's critical path, with one thread wake-up per message."""

    _CLOSE = object()

    def __init__(self, sender: _DirectSender):
        self._sender = sender
        self.responses = sender.responses
        self._inbox = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="hicache-backup-sender")
        self._thread.start()

    def _run(self):
        get, send = self._inbox.get, self._sender.send
        while True:
            data = get()
            if data is self._CLOSE:
                self._sender.close()
                return
            send(data)

    def send(self, data: bytes):
        self._inbox.put(data)

    def close(self):
        self._inbox.put(self._CLOSE)


class BackupStream:
    """The BackupSession stream of one session, as a context manager.

    prepare() returns backup ids; layer_stored(ids, step) streams each layer;
    wait_committed(id) blocks until the daemon commits (or rolls back) it;
    wait_event(seen) blocks until the stream delivers anything after the
    `seen`-th event (events counts them). Sends never wait.

    `direct`: True (default) starts each send on the stream from a sender
    thread of this stream (one wake-up per message); "caller" starts it
    from the calling thread (no thread at all, but the caller pays the
    socket write); False uses gRPC's request-iterator thread (public API
    only; several thread hand-offs per message). Where grpcio's internals
    differ from what _DirectSender expects, it is False.
    """

    def __init__(self, session: "Session", direct: Union[bool, str] = True):
        self.session = session
        self._cv = threading.Condition()
        self._pending = {}
        self._prepared = []
        self._errors = []  # (code, message) the daemon sent.
        self.error_count = 0
        self._end = None  # HiCacheError once the stream ended.
        self.events = 0  # Messages received so far.
        self.ended = 0   # Backups committed or rolled back so far.
        channel = session.client._channel  # pylint: disable=protected-access
        sender = _DirectSender.create(channel) if direct else None
        self.direct = sender is not None
        if sender is None:
            self._sender = _QueuedSender(channel)
        elif direct == "caller":
            self._sender = sender
        else:
            self._sender = _BackgroundSender(sender)
        self._send = self._sender.send
        self._responses = self._sender.responses
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        pending = self._pending
        try:
            for message in self._responses:
                kind = message.WhichOneof("message")
                with self._cv:
                    if kind == "step_done":
                        backup = message.step_done.backup_id
                        entry = pending.get(backup)
                        if entry is None:
                            entry = pending[backup] = _Pending()
                        entry.steps += 1
                    elif kind == "committed":
                        pending.setdefault(message.committed.backup_id,
                                           _Pending()).committed_node = message.committed.node
                        self.ended += 1
                    elif kind == "rolled_back":
                        pending.setdefault(message.rolled_back.backup_id,
                                           _Pending()).rolled_back = True
                        self.ended += 1
                    elif kind == "prepared":
                        self._prepared.append(list(message.prepared.backup_ids))
                    elif kind == "error":
                        self._errors.append((message.error.code, message.error.message))
                        self.error_count += 1
                    self.events += 1
                    self._cv.notify_all()
        except grpc.RpcError as e:  # pylint: disable=no-member
            self._end = HiCacheError(e.code(), e.details(), "BackupSession",
                                     leader=_leader_of(e))
        finally:
            with self._cv:
                if self._end is None:
                    self._end = HiCacheError(grpc.StatusCode.CANCELLED, "the stream ended",
                                             "BackupSession")
                self._cv.notify_all()

    # A prepare's reply is `prepared` or `error`; errors of earlier messages
    # (layer_stored, rollback) arrive before it, in order. An error is the
    # prepare's own when no `prepared` follows it within this grace.
    _PREPARE_ERROR_GRACE_S = 0.2

    def prepare(self, specs: Sequence[tuple]) -> List[int]:
        """specs: (pages, logical_tokens) per request. 0 = skipped (host full)."""
        self._send(pb.BackupClientMessage(
            session_id=self.session.id, prepare=pb.BackupClientMessage.Prepare(specs=[
                pb.BackupSpec(pages=pages, logical_tokens=tokens) for pages, tokens in specs])
        ).SerializeToString())
        clock = time.monotonic
        deadline = clock() + self.session.client.timeout
        with self._cv:
            errors_before = self.error_count
            error_at = None
            while not self._prepared:
                if self._end is not None:
                    raise self._end
                now = clock()
                if self.error_count > errors_before and error_at is None:
                    error_at = now
                if error_at is not None and now - error_at >= self._PREPARE_ERROR_GRACE_S:
                    code, message = self._errors.pop()
                    raise HiCacheError(_STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN),
                                       message, "BackupSession.prepare")
                if now >= deadline:
                    raise HiCacheError(grpc.StatusCode.DEADLINE_EXCEEDED, "no reply",
                                       "BackupSession.prepare")
                limit = deadline if error_at is None else min(
                    deadline, error_at + self._PREPARE_ERROR_GRACE_S)
                self._cv.wait(limit - now)
            return self._prepared.pop(0)

    def layer_stored(self, backup_ids: Sequence[int], step: int,
                     fences: Optional[dict] = None) -> None:
        """fences: {rank: fence_id} (CUDA backend): that rank's copy of the
        step waits on the fence's latest record. Does not wait."""
        if fences:
            stored = pb.BackupClientMessage.LayerStored(
                backup_ids=backup_ids, step=step,
                fences=[pb.RankFence(rank=r, fence_id=f) for r, f in fences.items()])
        else:
            stored = pb.BackupClientMessage.LayerStored(backup_ids=backup_ids, step=step)
        self._send(pb.BackupClientMessage(session_id=self.session.id,
                                          layer_stored=stored).SerializeToString())

    def layers_stored(self, backup_ids: Sequence[int], num_steps: int) -> None:
        """layer_stored(backup_ids, step) for every step 0 .. num_steps - 1."""
        send, session = self._send, self.session.id
        Message, Stored = pb.BackupClientMessage, pb.BackupClientMessage.LayerStored
        for step in range(num_steps):
            send(Message(session_id=session, layer_stored=Stored(
                backup_ids=backup_ids, step=step)).SerializeToString())

    def rollback(self, backup_id: int):
        """Gives up a backup: its host pages are freed, nothing is attached."""
        self._send(pb.BackupClientMessage(
            session_id=self.session.id,
            rollback=pb.BackupClientMessage.Rollback(backup_id=backup_id)).SerializeToString())

    def errors(self) -> List[tuple]:
        """(grpc.StatusCode, message) of the errors the daemon sent on the
        stream (e.g. a layer_stored naming an unknown backup or fence) that
        no prepare raised; clears them. `error_count` counts every error."""
        with self._cv:
            errors, self._errors = self._errors, []
        return [(_STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN), message)
                for code, message in errors]

    def wait_event(self, seen: int, timeout: float) -> int:
        """Waits until more than `seen` messages arrived, or `timeout`
        seconds; returns the count of messages received."""
        with self._cv:
            self._cv.wait_for(lambda: self.events > seen, timeout=timeout)
            return self.events

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
        """How many steps of `backup_id` the daemon reported done."""
        with self._cv:
            return self._pending.get(backup_id, _Pending()).steps

    def forget(self, backup_ids: Sequence[int]) -> None:
        """Drops what the stream remembers of finished backups (long runs)."""
        with self._cv:
            for backup in backup_ids:
                self._pending.pop(backup, None)

    def close(self) -> None:
        """Ends the stream and waits (up to the client's timeout) for its reader."""
        self._sender.close()
        self._reader.join(timeout=self.session.client.timeout)

    def __enter__(self) -> "BackupStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
