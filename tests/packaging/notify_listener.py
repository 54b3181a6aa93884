"""Waits for a daemon's sd_notify READY=1, as systemd does for Type=notify.

    notify_listener.py SOCKET BOUND_FIFO TIMEOUT_SECONDS

Binds the datagram socket SOCKET (give it to the daemon as NOTIFY_SOCKET),
then writes one line to the FIFO BOUND_FIFO so that the caller knows it may
start the daemon, then blocks until a message with READY=1 arrives. Prints
every message; exits 0 on READY=1 and 1 when TIMEOUT_SECONDS pass first.
"""

import socket
import sys


def main():
    path, fifo, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    with open(fifo, "w") as bound:
        bound.write("bound\n")
    sock.settimeout(timeout)
    try:
        while True:
            message = sock.recv(4096).decode(errors="replace")
            print("sd_notify:", message.replace("\n", " "), flush=True)
            if "READY=1" in message.split("\n"):
                return 0
    except socket.timeout:
        print(f"no READY=1 within {timeout} s", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
