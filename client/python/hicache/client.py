"""Typed wrapper over the hicache.v1 gRPC API (see docs/api.md)."""

import array
import collections
import contextlib
from collections import abc
import json
import logging
import os
import re
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc

from hicache.endpoint import default_socket_path, resolve_endpoint, socket_problem  # noqa: F401
from hicache.errors import HiCacheError, StaleHandleError  # noqa: F401
from hicache.info import CacheStats, DaemonInfo, Layout, from_message

# The health service's stubs: grpcio-health-checking (a dependency of the
# wheel), or in a checkout Bazel's //proto:py_stubs (bazel-bin/proto/py).
from grpc_health.v1 import health_pb2, health_pb2_grpc

try:  # The installed wheel: stubs generated into the package at build time.
    from hicache.v1 import hicache_pb2 as pb
    from hicache.v1 import hicache_pb2_grpc as pb_grpc
except ImportError:  # A checkout: Bazel's //proto:py_stubs on sys.path.
    from hicache_proto.v1 import hicache_pb2 as pb
    from hicache_proto.v1 import hicache_pb2_grpc as pb_grpc


Tokens = Union[bytes, bytearray, memoryview, "array.array", Sequence[int]]

_LITTLE = sys.byteorder == "little"
assert array.array("i").itemsize == 4, "hicache needs a 4-byte C int"


def pack_tokens(tokens: Tokens) -> bytes:
    """Token ids as the API carries them: packed little-endian int32.

    Already packed bytes (bytes, bytearray, memoryview) pass through
    unchanged; an array('i') is copied out in one step; any other sequence of
    ints is packed without a Python-level loop per token."""
    if isinstance(tokens, bytes):
        return tokens
    if isinstance(tokens, (bytearray, memoryview)):
        return bytes(tokens)
    if not isinstance(tokens, array.array) or tokens.typecode != "i":
        tokens = array.array("i", tokens)
    if not _LITTLE:
        tokens = array.array("i", tokens)
        tokens.byteswap()
    return tokens.tobytes()


def _token_count(packed: bytes) -> int:
    return len(packed) // 4


_MODES = {"any": pb.COMPUTE_OWNER_MODE_UNSPECIFIED,
          "zigzag": pb.COMPUTE_OWNER_MODE_ZIGZAG,
          "round_robin": pb.COMPUTE_OWNER_MODE_ROUND_ROBIN}
_BACKUPS = {"auto": pb.BACKUP_CHOICE_AUTO,
            "never": pb.BACKUP_CHOICE_NEVER,
            "always": pb.BACKUP_CHOICE_ALWAYS}


def _enum(table, value, what):
    if isinstance(value, int):
        return value
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{what} must be one of {sorted(table)}, got {value!r}") from None


_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}

# CP group redirects (docs/api.md, "CP group leader redirect").
LEADER_TRAILER = "hicache-leader"
MAX_LEADER_TARGET_BYTES = 255
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*\Z")
_IPV6_LITERAL = re.compile(r"\[[0-9A-Fa-f:.]+\]\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")


def valid_leader_target(target) -> bool:
    """True for a target a client may be redirected to: a str of at most
    MAX_LEADER_TARGET_BYTES, "[dns:///]host:port", host a DNS name or IPv4
    address ([A-Za-z0-9.-], not starting with '-' or '.') or a bracketed
    IPv6 literal, port 1..65535. Nothing else (no unix sockets, other
    schemes, paths, user info or control bytes): a hostile or broken daemon
    must not send the client anywhere else. The daemon and the C++ client
    apply the same rule (proto/leader_target.h)."""
    if not isinstance(target, str) or not target:
        return False
    if len(target.encode("utf-8", "surrogatepass")) > MAX_LEADER_TARGET_BYTES:
        return False
    if target.startswith("dns:///"):
        target = target[len("dns:///"):]
    host, colon, port = target.rpartition(":")
    if not colon or not _PORT.match(port) or not 1 <= int(port) <= 65535:
        return False
    return bool(_HOST_NAME.match(host) or _IPV6_LITERAL.match(host))


def _leader_of(error) -> Optional[str]:
    """The leader a refused call named: exactly one valid hicache-leader
    trailer on a FAILED_PRECONDITION; else None."""
    if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    try:
        trailers = error.trailing_metadata() or ()
    except Exception:  # pylint: disable=broad-except
        return None
    leaders = [value for key, value in trailers if key == LEADER_TRAILER]
    if len(leaders) != 1 or not valid_leader_target(leaders[0]):
        return None
    return leaders[0]


def _call(name, fn, request, timeout, hint="", socket_path="", **kwargs):
    try:
        return fn(request, timeout=timeout, **kwargs)
    except grpc.RpcError as e:  # pylint: disable=no-member
        code, details = e.code(), e.details()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            # A socket that is missing or closed to this user says why.
            problem = socket_problem(socket_path) if socket_path else None
            if problem is not None:
                raise HiCacheError(problem[0], problem[1], name) from None
            if hint:
                details = f"{details} ({hint})"
        raise HiCacheError(code, details, name, leader=_leader_of(e)) from None


# The RPCs gRPC itself retries (on UNAVAILABLE, with backoff) and lets wait
# for a connection (waitForReady) -- the same set as the C++ client's
# ServiceConfigJson() in client/cpp/endpoint.cc. Only reads and KeepAlive
# (which just extends a lease) are here: a retried attempt of any other call
# may run twice -- UNAVAILABLE can come after the daemon acted, e.g. when it
# drains or restarts mid-call -- and Allocate, Insert, Admit, Complete, Free,
# Lock, Unlock, Evict... are not idempotent (a second Allocate takes more
# pages, a second Unlock releases another lock). MatchPrefix is not listed
# either: with lock=True it takes locks, and a service config cannot tell a
# lock-free match apart; Session.match(lock=False) waits for the connection
# per call (wait_for_ready only delays the first send: never a retry).
READ_METHODS = (
    ("grpc.health.v1.Health", "Check"),
    ("hicache.v1.HiCache", "GetStats"),
    ("hicache.v1.HiCache", "Stats"),
    ("hicache.v1.HiCache", "GetLayout"),
    ("hicache.v1.HiCache", "KeepAlive"),
    ("hicache.v1.HiCache", "DumpTree"),
    ("hicache.v1.HiCache", "InspectNode"),
    ("hicache.v1.HiCache", "QueryTiers"),
    ("hicache.v1.HiCache", "ListSessions"),
)

RETRY_POLICY = {
    "maxAttempts": 5,
    "initialBackoff": "0.05s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


# Reconnect within about a second of a daemon coming back (gRPC's default
# backoff grows to 120 s): calls that wait for ready wait for this too. The
# daemon is local or one per node with few clients, so retrying often is
# cheap. "min_reconnect_backoff_ms" is gRPC's minimum *connect timeout*
# (how long one attempt may take to finish its handshake), not a delay: it
# stays at gRPC's 20 s, because at 100 ms a daemon on a busy node that took
# longer to answer failed the connection (UNAVAILABLE "connection attempt
# timed out before receiving SETTINGS frame"). A refused connection still
# fails at once and is retried after the backoff. The same as the C++
# client's HiCacheClient::ChannelArgs().
RECONNECT_BACKOFF = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 20000,
    "grpc.max_reconnect_backoff_ms": 1000,
}


def service_config(wait_for_ready: bool = True) -> str:
    """The channel's gRPC service config (JSON): READ_METHODS retry on
    UNAVAILABLE and, with `wait_for_ready`, wait (up to their deadline) for
    a daemon that is not listening yet instead of failing at once."""
    return json.dumps({"methodConfig": [{
        "name": [{"service": service, "method": method} for service, method in READ_METHODS],
        "waitForReady": wait_for_ready,
        "retryPolicy": RETRY_POLICY,
    }]})


def _read_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{what}: cannot read {path}: {e.strerror}") from None


# A daemon-issued id (node, lock handle, backup, load or fence id) is an int
# of a subclass that names the session generation it came from; a call
# naming one of an older generation raises StaleHandleError.
class Handle(int):
    """An int the daemon issued, tagged with its session's `generation`.
    Pickled or copied, it is a plain int (no longer checked)."""
    __slots__ = ()
    generation = -1

    def __reduce__(self):
        return int, (int(self),)


_HANDLE_TYPES = {}


def _handle_type(generation: int):
    cls = _HANDLE_TYPES.get(generation)
    if cls is None:
        cls = _HANDLE_TYPES[generation] = type("Handle", (Handle,), {
            "__slots__": (), "generation": generation})
    return cls


def _oldest(*values) -> int:
    """The oldest generation any of `values` carries (-1: none)."""
    tags = [g for g in (getattr(v, "generation", None) for v in values)
            if g is not None and g >= 0]
    return min(tags) if tags else -1


class PageList(list):
    """A list of page ids tagged with its session's `generation`; slices
    and sums keep the tag (the oldest, when two are joined)."""
    __slots__ = ("generation",)

    def __init__(self, pages=(), generation=-1):
        super().__init__(pages)
        self.generation = generation

    def __getitem__(self, index):
        if isinstance(index, slice):
            return PageList(list.__getitem__(self, index), self.generation)
        return list.__getitem__(self, index)

    def __add__(self, other):
        return PageList(list.__add__(self, list(other)), _oldest(self, other))

    def __radd__(self, other):
        return PageList(list(other) + list(self), _oldest(self, other))


@dataclass
class MatchResult:
    device_pages: List[int]
    device_tokens: int
    last_device_node: int
    last_host_node: int
    host_hit_tokens: int
    lock_handle: int = 0  # With lock=True: this hit's lock (0: no hit).
    # The query runs past a cached sub-page tail locked by another request
    # or still being backed up: do not prepare a backup past the hit.
    tail_blocked: bool = False


@dataclass
class AdmitItem:
    """One request for Session.admit: its input `tokens` (ints or packed
    bytes), `reserve_tokens` of output to allocate pages for now, the lanes
    of the new pages (`mode`: 'any', 'zigzag', 'round_robin') and whether to
    prepare a per-layer backup of the new input pages (`backup`: 'auto' --
    per the daemon's write policy --, 'never', 'always'). `unfinished`: a
    middle chunk of a chunked prefill (complete it with unfinished=True):
    its backup covers only its whole pages."""
    tokens: Tokens
    reserve_tokens: int = 0
    mode: Union[str, int] = "any"
    backup: Union[str, int] = "auto"
    unfinished: bool = False


# The type of a protobuf repeated scalar field (C++, upb or pure Python).
_REPEATED_SCALARS = type(pb.Locations().pages)


class Pages(abc.Sequence):
    """Page ids kept in the parts they came in (protobuf repeated fields are
    not turned into Python ints one by one): a read-only sequence --
    len, iteration, indexing, ``==`` with any sequence, ``+`` --, and
    Session.complete copies its parts into the request as they are. Slice or
    ``list()`` it for a list."""

    __slots__ = ("parts", "generation")

    def __init__(self, *parts: Sequence[int], generation: Optional[int] = None):
        self.parts = parts
        if generation is None:  # A part's, where one carries it (a PageList).
            generation = next((g for g in (getattr(p, "generation", None) for p in parts)
                               if g is not None and g >= 0), None)
        self.generation = generation

    def __len__(self):
        return sum(len(part) for part in self.parts)

    def __iter__(self):
        for part in self.parts:
            yield from part

    def __getitem__(self, index):
        if isinstance(index, slice):
            parts = self.parts
            pages = parts[0][index] if len(parts) == 1 else list(self)[index]
            return PageList(pages, -1 if self.generation is None else self.generation)
        if index < 0:
            index += len(self)
        for part in self.parts:
            if 0 <= index < len(part):
                return part[index]
            index -= len(part)
        raise IndexError("page index out of range")

    def __add__(self, other: Sequence[int]) -> "Pages":
        return Pages(*self.parts, other, generation=_oldest(self, other))

    def __radd__(self, other: Sequence[int]) -> "Pages":
        return Pages(other, *self.parts, generation=_oldest(self, other))

    def __eq__(self, other):
        if isinstance(other, abc.Sequence) and not isinstance(other, (str, bytes)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return f"Pages({list(self)})"


def _parts(pages):
    """The parts of a Pages, or (pages,) of any other sequence."""
    return pages.parts if isinstance(pages, Pages) else (pages,)


def _put_pages(field, pages):
    """Appends `pages` to a repeated field without a Python int per page
    where they are repeated fields already."""
    if isinstance(pages, _REPEATED_SCALARS):
        field.MergeFrom(pages)
    elif isinstance(pages, Pages):
        for part in pages.parts:
            _put_pages(field, part)
    elif pages:
        field.extend(pages)


@dataclass
class AdmitResult:
    """What Admit did for one item. The request's pages are
    ``device_pages + pages`` (``request_pages``). Both page lists are
    Pages views of the response's own repeated fields, not copies, tagged
    with the session generation: read-only sequences (len, index, iterate,
    ``==`` with a list; a slice is a tagged PageList; ``list()`` copies
    them), and complete() takes them -- or a Pages of them -- without
    converting."""
    admitted: bool  # False: nothing held (no room); retry later.
    device_pages: Sequence[int]  # The page-aligned device hit, locked.
    device_tokens: int
    lock_handle: int  # The hit's lock (0: nothing hit).
    last_device_node: int
    host_hit_tokens: int
    last_host_node: int
    load: bool  # Load the host hit (LoadBack, then Allocate): nothing allocated.
    pages: Sequence[int]  # The new pages, after device_pages.
    backup_id: int  # 0: no backup prepared (choice, host full, tail_blocked).
    tail_blocked: bool
    generation: int = -1  # The session generation that issued it (Session).

    @property
    def request_pages(self) -> Pages:
        """The whole request's pages: the locked device hit, then the new ones."""
        return Pages(*_parts(self.device_pages), *_parts(self.pages),
                     generation=self.generation)


@dataclass
class CompleteItem:
    """One finished request for Session.complete: insert `tokens` (whose KV
    is in `pages`, ceil(len(tokens) / P) of them) attaching `backup_id`, then
    release `lock_handles`, and with `free_uncached` free the pages the tree
    did not take plus `free_pages` (e.g. an unused output reserve)."""
    tokens: Tokens
    pages: Sequence[int]  # A list, a Pages, AdmitResult's repeated fields.
    backup_id: int = 0
    lock_handles: Sequence[int] = ()
    free_uncached: bool = True
    free_pages: Sequence[int] = ()
    unfinished: bool = False


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
    """A connection to one daemon: its unix socket (the default), or a TCP
    `target` ("host:port") over TLS.

    TLS (TCP targets only): the server is verified against `tls_ca_file`
    or `root_certificates` (PEM bytes), else the system's roots;
    `tls_server_name` overrides the name checked against its certificate.
    `tls_cert_file` and `tls_key_file` present a client certificate (mTLS,
    for a daemon started with --tls_client_ca_file). Plain TCP only with
    `insecure_tcp_for_testing` (the daemon's --insecure_tcp_for_testing).

    Retries and readiness are gRPC's, set in the channel's service config
    (service_config()): reads and KeepAlive retry on UNAVAILABLE and, with
    `wait_for_ready` (default), wait up to `timeout` for a daemon that is
    not up yet, as do OpenSession and lock-free matches (sent once
    connected); every other call that changes state is sent once and fails
    fast with UNAVAILABLE when the daemon is unreachable. `channel_options`
    adds gRPC channel arguments.

    CP groups: a scheduler session opened on a follower is opened on the
    leader it names instead (Session), over ``for_target(leader)``, once;
    ``follow_leader=False`` raises the HiCacheError (its ``leader`` set).
    A client of a follower's unix socket may be given TCP options (TLS,
    insecure_tcp_for_testing): they are the leader's."""

    def __init__(self, socket_path: Optional[str] = None, target: Optional[str] = None,
                 timeout: float = 10.0, *, tls_ca_file: Optional[str] = None,
                 root_certificates: Optional[bytes] = None,
                 tls_cert_file: Optional[str] = None, tls_key_file: Optional[str] = None,
                 tls_server_name: Optional[str] = None,
                 insecure_tcp_for_testing: bool = False, wait_for_ready: bool = True,
                 channel_options: Sequence[tuple] = (), follow_leader: bool = True):
        if socket_path and target:
            raise ValueError("give socket_path or target, not both")
        # What for_target() gives a client of another daemon.
        self._settings = dict(timeout=timeout, tls_ca_file=tls_ca_file,
                              root_certificates=root_certificates,
                              tls_cert_file=tls_cert_file, tls_key_file=tls_key_file,
                              tls_server_name=tls_server_name,
                              insecure_tcp_for_testing=insecure_tcp_for_testing,
                              wait_for_ready=wait_for_ready,
                              channel_options=tuple(channel_options),
                              follow_leader=follow_leader)
        self.follow_leader = follow_leader
        # Arguments, then $HICACHE_TARGET, $HICACHE_SOCKET, the packaged
        # socket if present, the default (hicache.endpoint).
        endpoint = resolve_endpoint(target, socket_path)
        self.target = endpoint.target
        self.socket_path = endpoint.socket_path
        self.endpoint_source = endpoint.source
        self.timeout = timeout
        self.wait_for_ready = wait_for_ready
        options = [("grpc.enable_retries", 1),
                   ("grpc.service_config", service_config(wait_for_ready)),
                   *RECONNECT_BACKOFF.items(), *channel_options]
        tls_given = any(x is not None for x in (tls_ca_file, root_certificates, tls_cert_file,
                                                tls_key_file, tls_server_name))
        self.tls = False
        if self.target.startswith(("unix:", "unix-abstract:")):
            # With follow_leader the TCP options are the CP group leader's (a
            # scheduler on a follower's node follows its redirect with them).
            if (tls_given or insecure_tcp_for_testing) and not follow_leader:
                raise ValueError(f"{self.target} is a unix socket: TLS options and "
                                 "insecure_tcp_for_testing apply to TCP targets only "
                                 "(with follow_leader, to the CP group leader)")
            self._channel = grpc.insecure_channel(self.target, options=options)
            self._hint = f"is hicached listening on {self.target[len('unix:'):]}?"
        elif insecure_tcp_for_testing:
            if tls_given:
                raise ValueError("insecure_tcp_for_testing and TLS options exclude each other")
            self._channel = grpc.insecure_channel(self.target, options=options)
            self._hint = f"plain TCP to {self.target}: is hicached listening there without TLS?"
        else:
            if root_certificates is not None and tls_ca_file is not None:
                raise ValueError("give tls_ca_file or root_certificates, not both")
            if (tls_cert_file is None) != (tls_key_file is None):
                raise ValueError("mTLS needs both tls_cert_file and tls_key_file")
            roots_from = "the system roots (no tls_ca_file given)"
            if root_certificates is not None:
                roots_from = "root_certificates"
            if tls_ca_file is not None:
                root_certificates = _read_file(tls_ca_file, "tls_ca_file")
                roots_from = tls_ca_file
            key = _read_file(tls_key_file, "tls_key_file") if tls_key_file else None
            chain = _read_file(tls_cert_file, "tls_cert_file") if tls_cert_file else None
            credentials = grpc.ssl_channel_credentials(root_certificates, key, chain)
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.secure_channel(self.target, credentials, options=options)
            self.tls = True
            self._hint = (
                f"TLS to {self.target}: is hicached listening there, did the CA in "
                f"{roots_from} "
                "sign its certificate, and does that certificate name the host "
                "(else set tls_server_name)? " + (
                    "Is the client certificate (tls_cert_file) signed by the daemon's "
                    "--tls_client_ca_file?" if tls_cert_file else
                    "If the daemon requires client certificates (--tls_client_ca_file), "
                    "set tls_cert_file and tls_key_file."))
        self.stub = pb_grpc.HiCacheStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def for_target(self, target: str) -> "Client":
        """A new Client of the daemon at TCP `target` with this client's
        settings: TLS (CA, client certificate, server name), timeout,
        wait_for_ready, channel options. A client of a unix socket passes on
        the TCP settings it was given for its leader (follow_leader); without
        any, the new one verifies TLS against the system roots."""
        if not valid_leader_target(target):
            raise ValueError(f"not a host:port target: {target[:64]!r}")
        return Client(target=target, **self._settings)

    def close(self) -> None:
        """Closes the channel; sessions of this client end with it."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, name: str, request: Any, timeout: Optional[float] = None,
             **kwargs: Any) -> Any:
        """Calls the unary RPC `name` of the HiCache service; a failure
        raises HiCacheError (with a hint where the daemon was not reached)."""
        return _call(name, getattr(self.stub, name), request,
                     self.timeout if timeout is None else timeout, self._hint,
                     self.socket_path, **kwargs)

    def wait_until_ready(self, timeout: Optional[float] = None) -> None:
        """Blocks until the channel is connected (the daemon is up), or
        raises HiCacheError(DEADLINE_EXCEEDED) after `timeout` seconds."""
        timeout = self.timeout if timeout is None else timeout
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise HiCacheError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"not connected within {timeout}s ({self._hint})",
                               "wait_until_ready") from None

    def check_socket(self) -> None:
        """Raises HiCacheError at once when this client's unix socket is
        missing (UNAVAILABLE), closed to this user (PERMISSION_DENIED, naming
        the group to join) or not a socket; a TCP target passes."""
        problem = socket_problem(self.socket_path) if self.socket_path else None
        if problem is not None:
            raise HiCacheError(problem[0], problem[1], "connect")

    def health(self, service: str = "") -> str:
        """'SERVING', 'NOT_SERVING', ... A missing or forbidden socket fails
        at once (check_socket), not after `timeout`."""
        self.check_socket()
        response = _call("Check", self._health.Check,
                         health_pb2.HealthCheckRequest(service=service), self.timeout,
                         self._hint, self.socket_path)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def stats(self) -> CacheStats:
        """The cache's counters and occupancy (the Stats RPC), as a
        dataclass (hicache.info)."""
        return from_message(CacheStats, self.call("Stats", pb.GetStatsRequest()))

    def daemon_info(self) -> DaemonInfo:
        """Build, backend, geometry, uptime, settings and CP group (the
        GetStats RPC), as a dataclass (hicache.info)."""
        return from_message(DaemonInfo, self.call("GetStats", pb.GetStatsRequest()))

    def layout(self) -> Layout:
        """The pools' geometry, KV layout, segments and block addresses (the
        GetLayout RPC), as a dataclass (hicache.info)."""
        return from_message(Layout, self.call("GetLayout", pb.GetLayoutRequest()))

    def evict(self, device_pages_per_lane=(), host_pages_per_rank=()) -> pb.EvictResponse:
        """Operators: evicts device pages per lane and/or host pages per rank."""
        return self.call("Evict", pb.EvictRequest(
            device_pages_per_lane=list(device_pages_per_lane),
            host_pages_per_rank=list(host_pages_per_rank)))

    def session(self, client_name: str, role: str = "scheduler", rank: int = 0,
                namespace: str = "", lease_ms: int = 10000, *,
                on_reopen: Optional[Callable[["Session", str], None]] = None,
                auto_reopen: bool = True, event_instance: str = "",
                event_model: str = "") -> "Session":
        """Opens a session; use it as a context manager to close it. See
        Session for `on_reopen` and `auto_reopen`. A scheduler may name the
        engine instance and model its namespace serves: its KV events then
        go to that topic (docs/kv-events.md)."""
        return Session(self, client_name, role, rank, namespace, lease_ms,
                       on_reopen=on_reopen, auto_reopen=auto_reopen,
                       event_instance=event_instance, event_model=event_model)

    def query_tiers(self, queries: Sequence[Tuple[str, Tokens]]) -> List[Tuple[int, int]]:
        """Routers (operators only): for each (namespace, tokens), the tokens
        matchable on device and, past them, loadable from the host tier. A
        pure lookup: no hit counted, nothing locked (docs/kv-events.md)."""
        response = self.call("QueryTiers", pb.QueryTiersRequest(queries=[
            pb.TierQuery(namespace=ns, tokens=pack_tokens(t)) for ns, t in queries]))
        return [(h.device_tokens, h.host_tokens) for h in response.hits]


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

    def __init__(self, client: Client, client_name: str, role: str, rank: int,
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

    def __init__(self, session: Session, direct: Union[bool, str] = True):
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
