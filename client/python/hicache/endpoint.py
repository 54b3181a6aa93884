"""Where the daemon is, and why a client cannot reach its socket.

One resolution order for hicachectl, the C++ and Python clients and
hicache-replay (client/cpp/endpoint.h; docs/operations.md, "Finding the
daemon"):

1. an explicit target (``Client(target=...)``, ``--target``);
2. an explicit unix socket (``Client(socket_path)``, ``--socket``);
3. ``$HICACHE_TARGET``, any gRPC target (``unix:PATH`` or ``host:port``);
4. ``$HICACHE_SOCKET``, a unix socket path;
5. the packaged socket, ``/run/hicached/hicached.sock``, when it exists
   (also when this user may not open it: connecting then says why);
6. ``default_socket_path()``, where a hicached started without --socket
   listens.
"""

import errno
import grp
import os
import stat
from typing import NamedTuple, Optional, Tuple

import grpc

PACKAGED_SOCKET_PATH = "/run/hicached/hicached.sock"


def default_socket_path() -> str:
    """$XDG_RUNTIME_DIR/hicached.sock, else /tmp/hicached.sock (as hicached)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return f"{runtime}/hicached.sock" if runtime else "/tmp/hicached.sock"


class Endpoint(NamedTuple):
    """A resolved daemon address."""
    target: str       # The gRPC target.
    socket_path: str  # Its unix socket path; "" for TCP.
    source: str       # "target", "socket", "HICACHE_TARGET",
                      # "HICACHE_SOCKET", "packaged" or "default".


def socket_path_of(target: str) -> str:
    """The socket path of a unix gRPC target ("unix:/p", "unix:///p"), or ""."""
    if not target.startswith("unix:"):
        return ""
    path = target[len("unix:"):]
    return path[2:] if path.startswith("//") else path


def _exists(path: str) -> bool:
    try:
        os.stat(path)
        return True
    except PermissionError:
        return True  # There, in a directory this user may not search.
    except OSError:
        return False


def resolve_endpoint(target: Optional[str] = None, socket_path: Optional[str] = None,
                     packaged_path: str = PACKAGED_SOCKET_PATH) -> Endpoint:
    """The daemon's address, in the order the module docstring gives. Empty
    strings and empty variables count as not given."""
    if target:
        return Endpoint(target, socket_path_of(target), "target")
    if socket_path:
        return Endpoint(f"unix:{socket_path}", socket_path, "socket")
    env_target = os.environ.get("HICACHE_TARGET")
    if env_target:
        return Endpoint(env_target, socket_path_of(env_target), "HICACHE_TARGET")
    env_socket = os.environ.get("HICACHE_SOCKET")
    if env_socket:
        return Endpoint(f"unix:{env_socket}", env_socket, "HICACHE_SOCKET")
    if packaged_path and _exists(packaged_path):
        return Endpoint(f"unix:{packaged_path}", packaged_path, "packaged")
    path = default_socket_path()
    return Endpoint(f"unix:{path}", path, "default")


def _denied(what: str, path: str) -> Tuple[grpc.StatusCode, str]:
    owner = ""
    try:
        st = os.stat(path)
        try:
            group = grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            group = str(st.st_gid)
        owner = (f" (group {group}, mode {stat.S_IMODE(st.st_mode):04o}): add this user "
                 f"to group {group} (sudo usermod -aG {group} $USER, then log in "
                 "again) or run as a member")
    except OSError:
        pass
    return (grpc.StatusCode.PERMISSION_DENIED,
            f"permission denied: this user may not {what} {path}{owner}")


def socket_problem(path: str) -> Optional[Tuple[grpc.StatusCode, str]]:
    """Why this process cannot connect to the unix socket at `path`, as
    (status code, message), or None when it exists as a socket this process
    may open (which says nothing about whether a daemon answers). The same
    words as client::CheckSocket (C++)."""
    try:
        st = os.stat(path)
    except PermissionError:
        # A directory on the way this user may not search: name the first.
        parts = path.split("/")
        for i in range(2, len(parts)):
            directory = "/".join(parts[:i])
            if not os.access(directory, os.X_OK):
                return _denied("enter the directory", directory)
        return _denied("reach", path)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return (grpc.StatusCode.UNAVAILABLE, f"no daemon at {path} (no such socket)")
        return (grpc.StatusCode.UNAVAILABLE, f"cannot use {path}: {e.strerror}")
    if not stat.S_ISSOCK(st.st_mode):
        return (grpc.StatusCode.FAILED_PRECONDITION,
                f"{path} is not a socket: check the socket path")
    if not os.access(path, os.R_OK | os.W_OK):
        return _denied("connect to the socket", path)
    return None
