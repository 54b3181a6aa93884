"""The errors a client call raises.

Every failed call raises a HiCacheError; constructing one picks the subclass
of its status code, so callers may catch what they handle::

    try:
        session.complete(items)
    except hicache.NotFoundError:        # a node, lock or session is gone
        ...
    except hicache.UnavailableError:     # no daemon (socket missing, down)
        ...

``code`` is the grpc.StatusCode, ``details`` the daemon's message, ``call``
the method, ``leader`` (a CP group follower's refusal) the leader's target.
"""

from typing import Dict, Optional, Type

import grpc


class HiCacheError(Exception):
    """An RPC failed. ``code`` is the grpc.StatusCode, ``details`` the message.

    ``leader``: when a CP group follower refused the call (a tree RPC, or a
    scheduler's OpenSession), the leader's target it named in the
    ``hicache-leader`` trailer (valid_leader_target); else None.

    ``HiCacheError(code, ...)`` makes the subclass for `code`
    (UnavailableError, NotFoundError, ...) where there is one."""

    def __new__(cls, code: grpc.StatusCode, *args: object, **kwargs: object) -> "HiCacheError":
        if cls is HiCacheError:
            cls = _BY_CODE.get(code, HiCacheError)
        return super().__new__(cls)

    def __init__(self, code: grpc.StatusCode, details: str, call: str, *,
                 leader: Optional[str] = None):
        super().__init__(f"{call}: {code.name}: {details}")
        self.code = code
        self.details = details
        self.call = call
        self.leader = leader

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild, (self.code.name, self.details, self.call, self.leader))


def _rebuild(code_name: str, details: str, call: str,
             leader: Optional[str]) -> HiCacheError:
    return HiCacheError(grpc.StatusCode[code_name], details, call, leader=leader)


class CancelledError(HiCacheError):
    """CANCELLED: the call was cancelled (by this client, or at shutdown)."""


class InvalidArgumentError(HiCacheError):
    """INVALID_ARGUMENT: the daemon refused the arguments (nothing changed)."""


class DeadlineExceededError(HiCacheError):
    """DEADLINE_EXCEEDED: no answer within the call's timeout."""


class NotFoundError(HiCacheError):
    """NOT_FOUND: a session, node, lock, backup or load the call names is
    not (or no longer) there."""


class AlreadyExistsError(HiCacheError):
    """ALREADY_EXISTS: e.g. a KV-event topic another session holds."""


class PermissionDeniedError(HiCacheError):
    """PERMISSION_DENIED: an operator call from a client, another
    namespace's state, or a socket this user may not open."""


class ResourceExhaustedError(HiCacheError):
    """RESOURCE_EXHAUSTED: a limit (sessions, request size, pool room)."""


class FailedPreconditionError(HiCacheError):
    """FAILED_PRECONDITION: not now or not here (a CP group follower, a
    stale handle, a backup still in flight)."""


class AbortedError(HiCacheError):
    """ABORTED: the daemon gave up the call (e.g. it is draining)."""


class OutOfRangeError(HiCacheError):
    """OUT_OF_RANGE."""


class UnimplementedError(HiCacheError):
    """UNIMPLEMENTED: the daemon is older than this client."""


class InternalError(HiCacheError):
    """INTERNAL: a daemon bug; its log says more."""


class UnavailableError(HiCacheError):
    """UNAVAILABLE: no daemon answers (socket missing, daemon down or
    restarting); retrying later may work."""


class DataLossError(HiCacheError):
    """DATA_LOSS: bytes failed their checksum."""


class UnauthenticatedError(HiCacheError):
    """UNAUTHENTICATED: the daemon rejected this client's identity (TLS)."""


class StaleHandleError(FailedPreconditionError):
    """A call named daemon state (node ids, lock handles, pages, backup or
    load ids) obtained before its session was reopened. The daemon that
    issued them is gone (or dropped the session when its lease lapsed): the
    same numbers may name other state now, so the call is refused before it
    is sent. Match or admit again."""

    def __new__(cls, details: str, call: str) -> "StaleHandleError":
        return Exception.__new__(cls)

    def __init__(self, details: str, call: str):
        super().__init__(grpc.StatusCode.FAILED_PRECONDITION, details, call)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (StaleHandleError, (self.details, self.call))


_BY_CODE: Dict[grpc.StatusCode, Type[HiCacheError]] = {
    grpc.StatusCode.CANCELLED: CancelledError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.ABORTED: AbortedError,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRangeError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DATA_LOSS: DataLossError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}
