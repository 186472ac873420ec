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
   whose other end (on the host) connects to the proxy: the one way out. One thread serves
   every connection (:class:`Bridge`), so connection churn costs no process or thread.
4. The harness is forked and exec'ed (no asyncio or subprocess import: this process's start-up
   is part of every sandbox's start latency) with an empty capability set (bounding, ambient, permitted, effective,
   inheritable) and ``no_new_privs``; its exit status becomes this process's.

Config (JSON file, argv[1]): ``argv``, ``env``, ``cwd``, ``report_fd``, ``bridge_port``
(0 = no bridge), ``proxy_socket``, ``monitor`` (bool).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import selectors
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


class _Pair:
    """One bridged connection: the harness's end (``down``) and the proxy socket's (``up``)."""

    __slots__ = ("down", "down_eof", "to_down", "to_up", "up", "up_eof", "up_shut")

    def __init__(self, down: socket.socket, up: socket.socket) -> None:
        self.down, self.up = down, up
        self.to_up, self.to_down = bytearray(), bytearray()
        self.down_eof = self.up_eof = self.up_shut = False


class Bridge:
    """Joins each connection on ``127.0.0.1:<port>`` to the proxy's unix socket, in one thread.

    One ``selectors`` loop serves every connection: a connection costs two descriptors and no
    thread or process, so connection churn cannot reach the sandbox's pids limit (a thread per
    connection did, and the failed thread start ended the bridge for good). A connection ends
    when the harness resets it, or when the proxy side ends (the host closes its end of the unix
    socket both ways, so nothing more can pass) and what it sent was delivered; the harness
    half-closing is passed on as a half-close. Out of descriptors, the bridge pauses accepting
    briefly instead of failing.

    Args:
        listener: The bound, listening TCP socket.
        path: The proxy's unix socket.
    """

    #: Bytes held per direction before reading from the sending side pauses.
    BUFFER = 1 << 18
    #: Seconds accepting pauses when the process is out of descriptors.
    PAUSE_S = 0.05

    def __init__(self, listener: socket.socket, path: str) -> None:
        self.listener, self.path = listener, path
        listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.pairs: set[_Pair] = set()
        self._paused_until = 0.0

    def serve_forever(self) -> None:
        """Runs until the listener is closed."""
        while True:
            timeout = None
            if self._paused_until:
                timeout = self._paused_until - time.monotonic()
                if timeout <= 0:
                    self.selector.register(self.listener, selectors.EVENT_READ)
                    self._paused_until, timeout = 0.0, None
            for key, mask in self.selector.select(timeout):
                if key.data is None:
                    if not self._accept():
                        return
                else:
                    pair, is_up = key.data
                    self._step(pair, is_up, mask)

    def _accept(self) -> bool:
        while True:
            try:
                down, _ = self.listener.accept()
            except BlockingIOError:
                return True
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.selector.unregister(self.listener)
                    self._paused_until = time.monotonic() + self.PAUSE_S
                    return True
                return exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR)
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                up.settimeout(5.0)
                up.connect(self.path)
            except OSError:
                up.close()
                down.close()
                continue
            down.setblocking(False)
            up.setblocking(False)
            pair = _Pair(down, up)
            self.pairs.add(pair)
            self._watch(pair)

    def _step(self, pair: _Pair, is_up: bool, mask: int) -> None:
        sock = pair.up if is_up else pair.down
        try:
            if mask & selectors.EVENT_READ:
                chunk = sock.recv(self.BUFFER)
                if not chunk:
                    if is_up:
                        pair.up_eof = True
                    else:
                        pair.down_eof = True
                (pair.to_down if is_up else pair.to_up).extend(chunk)
            if mask & selectors.EVENT_WRITE:
                out = pair.to_up if is_up else pair.to_down
                del out[: sock.send(out)]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close(pair)
            return
        if pair.down_eof and not pair.to_up and not pair.up_shut:
            pair.up_shut = True
            with contextlib.suppress(OSError):
                pair.up.shutdown(socket.SHUT_WR)
        if pair.up_eof and not pair.to_down:
            self._close(pair)
            return
        self._watch(pair)

    def _watch(self, pair: _Pair) -> None:
        for sock, reading, pending in (
            (pair.down, not pair.down_eof and len(pair.to_up) < self.BUFFER, pair.to_down),
            (pair.up, not pair.up_eof and len(pair.to_down) < self.BUFFER, pair.to_up),
        ):
            events = (selectors.EVENT_READ if reading else 0) | (selectors.EVENT_WRITE if pending else 0)
            key = self.selector.get_map().get(sock)
            if key is None:
                if events:
                    self.selector.register(sock, events, (pair, sock is pair.up))
            elif not events:
                self.selector.unregister(sock)
            elif key.events != events:
                self.selector.modify(sock, events, key.data)

    def _close(self, pair: _Pair) -> None:
        self.pairs.discard(pair)
        for sock in (pair.down, pair.up):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(sock)
            sock.close()


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
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):  # the bridge's descriptors; the harness gets ``nofile``
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
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
        listener.listen(1024)
    # Python's sockets are close-on-exec: the harness inherits none of them.
    pid = spawn(cfg["argv"], cfg["env"], cfg["cwd"], int(cfg.get("nofile", 4096)))
    report.write("started", pid=pid)
    if sniffer is not None:
        threading.Thread(target=sniff, args=(sniffer, report), daemon=True).start()
    if listener is not None:
        bridge = Bridge(listener, str(cfg.get("proxy_socket", "")))
        threading.Thread(target=bridge.serve_forever, daemon=True).start()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    time.sleep(0.05)  # let the sniffer read what the last packets left in its buffer
    report.write("exited", code=code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
