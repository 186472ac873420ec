"""The first process inside a local sandbox: network setup, the proxy bridge, the harness.

This file runs *inside* the bubblewrap sandbox with the host's Python and the standard library
only (``python3 -I -S local_init.py CONFIG``); it imports nothing of OpenForgeRL. It holds
``CAP_NET_ADMIN`` and ``CAP_NET_RAW`` in the sandbox's own user and network namespaces (never
outside them) and gives the harness none. Design (see ``backends/local.py``):

1. The network namespace has only ``lo``. A ``local`` route for every IPv4/IPv6 address
   (``local 0.0.0.0/0 dev lo table local``) makes a connection to any outside address land on
   ``lo`` and fail at once (refused), instead of failing at route lookup where nothing can
   see it.
2. A packet socket on ``lo`` records every TCP SYN and UDP datagram whose destination is not a
   loopback address (with the name asked for, for DNS queries), one JSON line each on the
   report descriptor the host passed in. The harness cannot read or write that descriptor:
   it is close-on-exec, and ``/proc/1/fd`` needs capabilities the harness does not have.
3. ``127.0.0.1:<port>`` is bridged to the bind-mounted unix socket ``/run/openforge/proxy.sock``,
   whose other end (on the host) connects to the proxy: the one way out.
4. The harness is forked and exec'ed (no asyncio or subprocess import: this process's start-up
   is part of every sandbox's start latency) with an empty capability set (bounding, ambient, permitted, effective,
   inheritable) and ``no_new_privs``; its exit status becomes this process's.

Config (JSON file, argv[1]): ``argv``, ``env``, ``cwd``, ``report_fd``, ``bridge_port``
(0 = no bridge), ``proxy_socket``, ``monitor`` (bool).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import socket
import struct
import sys
import threading
import time
from typing import Any, TextIO

_ETH_P_ALL = 0x0003
_PACKET_OUTGOING = 4
_RTM_NEWROUTE = 24
_NLMSG_ERROR = 2
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
_RT_TABLE_LOCAL, _RTPROT_BOOT, _RT_SCOPE_HOST, _RTN_LOCAL, _RTA_OIF = 255, 3, 254, 2, 4
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


class Report:
    """JSON lines on the host's report descriptor (thread-safe, flushed per line)."""

    def __init__(self, fd: int) -> None:
        os.set_inheritable(fd, False)
        self._out: TextIO = os.fdopen(fd, "w", buffering=1)
        self._lock = threading.Lock()
        self._seen: set[tuple[Any, ...]] = set()

    def write(self, event: str, **fields: Any) -> None:
        with self._lock:
            self._out.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")

    def attempt(self, proto: str, dst: str, port: int, name: str = "") -> None:
        key = (proto, dst, port, name)
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        self.write("attempt", proto=proto, dst=dst, port=port, name=name)


def add_local_default_route(family: int) -> None:
    """``ip route add local <any>/0 dev lo table local`` over rtnetlink.

    Raises:
        OSError: The kernel refused (no ``CAP_NET_ADMIN``, or the family is disabled).
    """
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as nl:
        nl.bind((0, 0))
        rtmsg = struct.pack("BBBBBBBBI", family, 0, 0, 0, _RT_TABLE_LOCAL, _RTPROT_BOOT, _RT_SCOPE_HOST, _RTN_LOCAL, 0)
        attr = struct.pack("HHI", 8, _RTA_OIF, socket.if_nametoindex("lo"))
        body = rtmsg + attr
        flags = _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_CREATE | _NLM_F_EXCL
        nl.send(struct.pack("IHHII", 16 + len(body), _RTM_NEWROUTE, flags, 1, 0) + body)
        resp = nl.recv(4096)
        kind = struct.unpack_from("H", resp, 4)[0]
        error = struct.unpack_from("i", resp, 16)[0] if kind == _NLMSG_ERROR else 0
        if error:
            raise OSError(-error, os.strerror(-error))


def _dns_name(payload: bytes) -> str:
    labels: list[str] = []
    i = 12
    while i < len(payload) and payload[i] and len(labels) < 64:
        n = payload[i]
        labels.append(payload[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    return ".".join(labels)


def _loopback(dst: str) -> bool:
    return dst.startswith("127.") or dst == "::1"


def sniff(sock: socket.socket, report: Report) -> None:
    """Records outgoing TCP SYNs and UDP datagrams to non-loopback addresses until the socket closes."""
    while True:
        try:
            frame, addr = sock.recvfrom(65535)
        except OSError:
            return
        if addr[2] != _PACKET_OUTGOING or len(frame) < 14:
            continue
        ethertype = struct.unpack_from("!H", frame, 12)[0]
        pkt = frame[14:]
        if ethertype == 0x0800 and len(pkt) >= 20:
            proto, dst, payload = pkt[9], socket.inet_ntop(socket.AF_INET, pkt[16:20]), pkt[(pkt[0] & 0x0F) * 4 :]
        elif ethertype == 0x86DD and len(pkt) >= 40:
            proto, dst, payload = pkt[6], socket.inet_ntop(socket.AF_INET6, pkt[24:40]), pkt[40:]
        else:
            continue
        if _loopback(dst) or len(payload) < 8:
            continue
        port = struct.unpack_from("!H", payload, 2)[0]
        if proto == 6 and len(payload) >= 14 and payload[13] & 0x02 and not payload[13] & 0x10:
            report.attempt("tcp", dst, port)
        elif proto == 17:
            report.attempt("udp", dst, port, _dns_name(payload[8:]) if port == 53 else "")


def drop_capabilities(nofile: int) -> None:
    """In the forked child before exec: limits, no capabilities of any kind, no way to regain them."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for cap in range(64):
        _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if _libc.capset(header, data) != 0:
        os._exit(126)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _bridge_one(path: str, conn: socket.socket) -> None:
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        conn.close()
        up.close()
        return
    back = threading.Thread(target=_pump, args=(up, conn), daemon=True)
    back.start()
    _pump(conn, up)
    back.join()
    conn.close()
    up.close()


def bridge(listener: socket.socket, path: str) -> None:
    """Accepts on ``127.0.0.1:<port>`` and joins each connection to the proxy's unix socket."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_bridge_one, args=(path, conn), daemon=True).start()


def spawn(argv: list[str], env: dict[str, str], cwd: str, nofile: int) -> int:
    """Forks and execs the harness without capabilities; returns its pid (exit 127: exec failed)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.chdir(cwd)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            drop_capabilities(nofile)
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:
            os.write(2, f"openforge sandbox: cannot run {argv[0]!r}: {exc}\n".encode())
        os._exit(127)
    return pid


def main() -> int:
    """Runs the harness as configured; returns its exit status (127: it could not start)."""
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    report = Report(int(cfg["report_fd"]))
    sniffer: socket.socket | None = None
    if cfg.get("monitor"):
        add_local_default_route(socket.AF_INET)
        with contextlib.suppress(OSError):  # IPv6 may be off in the kernel
            add_local_default_route(socket.AF_INET6)
        sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
        sniffer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        sniffer.bind(("lo", 0))
    listener: socket.socket | None = None
    if int(cfg.get("bridge_port", 0)):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", int(cfg["bridge_port"])))
        listener.listen(128)
    # Python's sockets are close-on-exec: the harness inherits none of them.
    pid = spawn(cfg["argv"], cfg["env"], cfg["cwd"], int(cfg.get("nofile", 4096)))
    report.write("started", pid=pid)
    if sniffer is not None:
        threading.Thread(target=sniff, args=(sniffer, report), daemon=True).start()
    if listener is not None:
        threading.Thread(target=bridge, args=(listener, str(cfg.get("proxy_socket", ""))), daemon=True).start()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    time.sleep(0.05)  # let the sniffer read what the last packets left in its buffer
    report.write("exited", code=code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
