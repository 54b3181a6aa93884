"""The gRPC plumbing the client's modules share: the hicache.v1 stubs (`pb`,
`pb_grpc`), one unary call with its failure turned into a HiCacheError
(`_call`), and CP group leader redirects (`valid_leader_target`,
`_leader_of`)."""

import re
from typing import Optional

import grpc

from hicache.endpoint import socket_problem
from hicache.errors import HiCacheError

try:  # The installed wheel: stubs generated into the package at build time.
    from hicache.v1 import hicache_pb2 as pb
    from hicache.v1 import hicache_pb2_grpc as pb_grpc
except ImportError:  # A checkout: Bazel's //proto:py_stubs on sys.path.
    from hicache_proto.v1 import hicache_pb2 as pb
    from hicache_proto.v1 import hicache_pb2_grpc as pb_grpc

__all__ = ["LEADER_TRAILER", "MAX_LEADER_TARGET_BYTES", "pb", "pb_grpc", "valid_leader_target"]


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
