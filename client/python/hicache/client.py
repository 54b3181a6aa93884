"""Typed wrapper over the hicache.v1 gRPC API (see docs/api.md).

This module holds Client (a connection to one daemon: channel, TLS, the
unary RPCs) and the channel's gRPC service config (READ_METHODS,
RETRY_POLICY, RECONNECT_BACKOFF, service_config). The rest of the client
lives in modules of its own, and every name this module offered before is
still importable from it:

    hicache.session   Session (an open session and its calls)
    hicache.streams   BackupStream (the BackupSession stream)
    hicache.items     MatchResult, AdmitItem, AdmitResult, CompleteItem,
                      LoadBackResult
    hicache.pages     pack_tokens, Tokens, Handle, PageList, Pages
    hicache.rpc       the stubs (pb, pb_grpc), errors of one call, CP group
                      leader redirects (valid_leader_target)
"""

import json
from typing import Any, Callable, List, Optional, Sequence, Tuple

import grpc

from hicache.info import CacheStats, DaemonInfo, Layout, from_message
from hicache.rpc import _call

# Every name this module held before the client was split into modules is
# still importable from it (`X as X`: an explicit re-export, for mypy
# --strict); hicache/__init__.py imports the public ones from their modules.
from hicache.endpoint import (  # noqa: F401
    default_socket_path as default_socket_path,
    resolve_endpoint as resolve_endpoint,
    socket_problem as socket_problem,
)
from hicache.errors import (  # noqa: F401
    HiCacheError as HiCacheError,
    StaleHandleError as StaleHandleError,
)
from hicache.items import (  # noqa: F401
    AdmitItem as AdmitItem,
    AdmitResult as AdmitResult,
    CompleteItem as CompleteItem,
    LoadBackResult as LoadBackResult,
    MatchResult as MatchResult,
)
from hicache.pages import (  # noqa: F401
    Handle as Handle,
    PageList as PageList,
    Pages as Pages,
    Tokens as Tokens,
    _handle_type as _handle_type,  # tests/python/test_reopen.py
    pack_tokens as pack_tokens,
)
from hicache.rpc import (  # noqa: F401
    LEADER_TRAILER as LEADER_TRAILER,
    MAX_LEADER_TARGET_BYTES as MAX_LEADER_TARGET_BYTES,
    pb as pb,
    pb_grpc as pb_grpc,
    valid_leader_target as valid_leader_target,
)
from hicache.session import Session as Session
from hicache.streams import BackupStream as BackupStream  # noqa: F401

# The health service's stubs: grpcio-health-checking (a dependency of the
# wheel), or in a checkout Bazel's //proto:py_stubs (bazel-bin/proto/py).
from grpc_health.v1 import health_pb2, health_pb2_grpc

# The standard modules and typing names this module imported before the
# split: kept, so that dir(hicache.client) is unchanged.
import array  # noqa: F401
import collections  # noqa: F401
import contextlib  # noqa: F401
from collections import abc  # noqa: F401
import logging  # noqa: F401
import os  # noqa: F401
import re  # noqa: F401
import queue  # noqa: F401
import sys  # noqa: F401
import threading  # noqa: F401
import time  # noqa: F401
from dataclasses import dataclass  # noqa: F401
from typing import Iterator, Union  # noqa: F401


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
