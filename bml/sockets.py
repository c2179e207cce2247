"""Socket settings shared by every hot path: the host agent, its mesh, the baselines and the
software switch; and batched datagram I/O (``BatchReceiver``, ``BatchSender``: recvmmsg and
sendmmsg through ctypes) for the host agent's NICs and the software switch's ports."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import socket
import struct
import sys
import termios
from collections import deque
from collections.abc import Callable, Iterator

import numpy as np

from bml.protocol import MTU

# Linux values; Python's socket module does not export them.
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33


def force_buffers(sock: socket.socket, size: int = 8 << 20) -> None:
    """Large send/receive buffers past net.core.*mem_max (root only; silently kept otherwise),
    so bursts of results or contributions are queued rather than dropped."""
    for option in (SO_RCVBUFFORCE, SO_SNDBUFFORCE):
        with contextlib.suppress(PermissionError):
            sock.setsockopt(socket.SOL_SOCKET, option, size)


# Every NIC is the receiving end of several TCP connections at once (incast). TCP alone grows
# each window until the shaped link's queue overflows, and with jumbo segments the losses cost
# whole segments and timeouts. So a sender keeps at most QUEUE_BUDGET / (its receiver's
# fan-in) bytes unacknowledged on a connection: 3/4 of bml-net's 256 KB queue in all, enough
# to keep the link busy, with a quarter left for what else arrives (ACKs, other flows' bursts).
QUEUE_BUDGET = 192_000


def unacked_bytes(sock: socket.socket) -> int:
    """Bytes handed to the kernel on a TCP socket and not yet acknowledged (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


class StreamOutbox:
    """What waits to be written to a non-blocking stream socket: the queued buffers as they
    are, written with one gather ``sendmsg`` per ``write``, never joined into one growing
    buffer (a bytearray grown by each message and cut at the front by each write reallocates
    as it goes, and each reallocation costs fresh pages)."""

    GATHER = 64  # buffers per sendmsg (below the kernel's UIO_MAXIOV, 1024)

    def __init__(self) -> None:
        self._parts: deque[memoryview] = deque()
        self.size = 0  # bytes queued

    def __bool__(self) -> bool:
        return self.size > 0

    def queue(self, *parts: bytes | bytearray | memoryview) -> None:
        """Queue ``parts`` (kept, not copied: they must not change until written)."""
        for part in parts:
            view = memoryview(part).cast("B")
            if view.nbytes:
                self._parts.append(view)
                self.size += view.nbytes

    def write(self, sock: socket.socket, most: int | None = None) -> int:
        """Hand the kernel up to ``most`` bytes (default: all) from the front, in order, with
        one system call; returns how many it took. ``BlockingIOError`` when it takes none
        (its buffer is full), other ``OSError`` as raised."""
        most = self.size if most is None else min(most, self.size)
        gather, total = [], 0
        for part in self._parts:
            if total >= most or len(gather) == self.GATHER:
                break
            take = min(part.nbytes, most - total)
            gather.append(part if take == part.nbytes else part[:take])
            total += take
        sent = sock.sendmsg(gather) if gather else 0
        self.size -= sent
        parts, left = self._parts, sent
        while left:
            head = parts[0]
            if left >= head.nbytes:
                parts.popleft()
                left -= head.nbytes
            else:
                parts[0] = head[left:]
                left = 0
        return sent

    def clear(self) -> None:
        self._parts.clear()
        self.size = 0

    def drain(self) -> bytes:
        """Everything still queued, as one object; the outbox is then empty."""
        data = b"".join(self._parts)
        self.clear()
        return data


class StreamInbox:
    """Bytes read from a non-blocking stream socket and not yet taken, at
    ``data[start:end]``: read straight into one buffer that grows to the largest backlog
    and then stays (a bytearray appended to by each read and cut at the front by each parse
    reallocates as it goes, and each reallocation costs fresh pages). ``data`` is replaced,
    never resized, when it grows; what is still unread moves to its front only within
    ``fill``, so views of whole messages a parser hands out stay valid until then."""

    def __init__(self, chunk: int = 1 << 18) -> None:
        self.chunk = chunk  # the least room a read gets
        self.start = self.end = 0
        self._hold(bytearray(2 * chunk))

    def _hold(self, data: bytearray) -> None:
        self.data = data
        self._pin = ctypes.c_char.from_buffer(data)  # (never resized: replaced)
        self._address = ctypes.addressof(self._pin)

    def __len__(self) -> int:
        return self.end - self.start

    def fill(self, sock: socket.socket) -> bool:
        """Read what the socket has; False once the peer has closed (EOF or an error), True
        while it is open."""
        while True:
            if len(self.data) - self.end < self.chunk:
                self._make_room()
            try:
                with memoryview(self.data) as view:
                    size = sock.recv_into(view[self.end:])
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if not size:
                return False
            self.end += size

    def consume(self, size: int) -> None:
        """``size`` bytes from the front are taken."""
        self.start += size
        if self.start == self.end:
            self.start = self.end = 0

    def _make_room(self) -> None:
        held = self.end - self.start
        if held + self.chunk > len(self.data):
            bigger = bytearray(max(2 * len(self.data), held + self.chunk))
            bigger[:held] = memoryview(self.data)[self.start:self.end]
            self._hold(bigger)
        else:  # (a memoryview's overlapping copy would go through a new buffer)
            ctypes.memmove(self._address, self._address + self.start, held)
        self.start, self.end = 0, held


# ------------------------------------------------------------------ batched datagram I/O
#
# The hot paths move frames in batches: one recvmmsg(2) fills up to ``count`` preallocated
# buffers, one sendmmsg(2) hands the kernel a list of frames, so a system call (and Python's
# way into it) is paid per batch instead of per frame. glibc's functions are called through
# ctypes; the ``mmsghdr``/``iovec`` arrays live in objects built once (``BatchReceiver``,
# ``BatchSender``), never per call. Where there is no such libc (another OS, another libc, or
# ``BML_BATCHED_IO=0`` in the environment, which benchmarks use for an unbatched baseline), the
# same classes fall back to one ``recvmsg_into``/``sendto`` per frame, with the same interface.
#
# Both directions pass MSG_DONTWAIT: a receive finds what is queued and returns at once, a send
# that finds the queue full stops there (the caller decides what the rest become).

BATCH = 64  # frames per system call by default
# A receive buffer holds the largest frame a port can deliver: an MTU-sized IP packet, its
# Ethernet header and one 802.1Q tag (rounded up to 64 bytes). A UDP socket needs only MTU.
FRAME_BUFFER = (MTU + 14 + 4 + 63) // 64 * 64
QUEUE_FULL = frozenset((errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS))
_AGAIN = frozenset((errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR))
_MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0x40)


class _IoVec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


class _MsgHdr(ctypes.Structure):  # struct msghdr, glibc's layout
    _fields_ = (("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.c_void_p), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int))


class _MMsgHdr(ctypes.Structure):  # struct mmsghdr
    _fields_ = (("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint))


class _CMsgHdr(ctypes.Structure):  # struct cmsghdr (without its data)
    _fields_ = (("cmsg_len", ctypes.c_size_t), ("cmsg_level", ctypes.c_int),
                ("cmsg_type", ctypes.c_int))


_SIZE_T = "Q" if ctypes.sizeof(ctypes.c_size_t) == 8 else "I"
_WORD = ctypes.sizeof(ctypes.c_size_t)  # control messages are aligned to this
_MSG_LEN = _MMsgHdr.msg_len.offset // 4  # in 32-bit words of one mmsghdr
_MSG_FLAGS = (_MMsgHdr.msg_hdr.offset + _MsgHdr.msg_flags.offset) // 4
_CMSG_DATA = (ctypes.sizeof(_CMsgHdr) + _WORD - 1) // _WORD * _WORD
_CMSG = struct.Struct(f"={_SIZE_T}ii")


def _load_libc() -> tuple[Callable, Callable] | None:
    """glibc's recvmmsg and sendmmsg, or None where they cannot be had (or are not wanted)."""
    if os.environ.get("BML_BATCHED_IO", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        recvmmsg, sendmmsg = libc.recvmmsg, libc.sendmmsg
    except (OSError, AttributeError):
        return None
    recvmmsg.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int,
                         ctypes.c_void_p)
    recvmmsg.restype = ctypes.c_int
    sendmmsg.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int)
    sendmmsg.restype = ctypes.c_int
    return recvmmsg, sendmmsg


def _bytes_data_offset() -> int | None:
    """Where a ``bytes`` object's data start, from the object's address (``id``): CPython's
    PyBytesObject keeps them inline at a fixed offset (``ob_sval``), here read off the C API's
    PyBytes_AsString once. A frame that is ``bytes`` is then handed to sendmmsg where it is,
    without a copy. None (frames are copied into a buffer first) on another Python."""
    if sys.implementation.name != "cpython":
        return None
    try:
        as_string = ctypes.pythonapi.PyBytes_AsString
    except AttributeError:
        return None
    as_string.argtypes = (ctypes.py_object,)
    as_string.restype = ctypes.c_void_p
    probes = (b"bml-ina probe", bytes(range(200)))
    offsets = {as_string(p) - id(p) for p in probes}
    if len(offsets) != 1:
        return None
    offset = offsets.pop()
    if any(ctypes.string_at(id(p) + offset, len(p)) != p for p in probes):
        return None
    return offset


_LIBC = _load_libc()
BATCHED_IO = _LIBC is not None  # False: the unbatched baseline (or no such libc here)
BATCHED = _LIBC is not None  # whether recvmmsg/sendmmsg are used (else one call per frame)
_BYTES_DATA = _bytes_data_offset() if BATCHED else None


def _address_of(buffer: bytearray) -> int:
    """Where ``buffer``'s bytes are (they stay there while the buffer is never resized: every
    buffer given here is also pinned by a live view of its owner's)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def _control_messages(control: bytes | bytearray | memoryview, start: int, end: int
                      ) -> Iterator[tuple[int, int, int, int]]:
    """(level, type, data start, data end) of each control message in ``control[start:end]``
    (struct cmsghdr each, aligned), up to the first that is empty or does not fit."""
    at = start
    while at + _CMSG_DATA <= end:
        length, level, kind = _CMSG.unpack_from(control, at)
        if length < _CMSG_DATA or at + length > end:
            return
        yield level, kind, at + _CMSG_DATA, at + length
        at += (length + _WORD - 1) // _WORD * _WORD


def parse_ancillary(control: bytes | bytearray | memoryview) -> list[tuple[int, int, bytes]]:
    """The control messages in a msghdr's control buffer as ``socket.recvmsg`` gives them:
    (level, type, data) each."""
    return [(level, kind, bytes(control[at:end]))
            for level, kind, at, end in _control_messages(control, 0, len(control))]


class BatchReceiver:
    """A ring of ``count`` receive buffers of ``size`` bytes each, filled by one recvmmsg per
    ``receive``; and, for sockets that report something beside each frame, a ring of
    ``control`` bytes per frame for the ancillary data (e.g. ``socket.CMSG_SPACE(n)``).

    The views ``receive`` returns are into the ring: valid until the next ``receive`` on this
    receiver, which overwrites them. Frame ``i``'s control messages are at
    ``control_buffer[i * control_space:]``, as the kernel lays them out (struct cmsghdr, then
    the data, each aligned), zero after the last (all zero if none came): a hot path that
    expects one known message may read it there at a fixed offset with one ``struct`` call,
    in either implementation. One receiver serves one thread (and any number of sockets, one
    after the other)."""

    def __init__(self, count: int = BATCH, size: int = FRAME_BUFFER, control: int = 0) -> None:
        if count <= 0 or size <= 0 or control < 0:
            raise ValueError("a receiver needs at least one buffer of at least one byte")
        self.count, self.size, self.control_space = count, size, control
        self.buffer = bytearray(count * size)
        self.slots = [memoryview(self.buffer)[i * size:(i + 1) * size] for i in range(count)]
        self.control_buffer = bytearray(count * control)
        self._control_view = memoryview(self.control_buffer)
        self._no_control = memoryview(bytes(count * control))
        self._flags = [0] * count  # the fallback's msg_flags per frame
        # The ring as numpy rows (``receive_rows``), and each frame's msg_len read in place.
        self.rows = np.frombuffer(self.buffer, np.uint8).reshape(count, size)
        if _LIBC is None:
            return
        self._recvmmsg = _LIBC[0]
        self._iovs = (_IoVec * count)()
        self._raw = bytearray(count * ctypes.sizeof(_MMsgHdr))
        messages = (_MMsgHdr * count).from_buffer(self._raw)
        base = _address_of(self.buffer)
        control_base = _address_of(self.control_buffer) if control else 0
        for i in range(count):
            self._iovs[i].iov_base, self._iovs[i].iov_len = base + i * size, size
            header = messages[i].msg_hdr
            header.msg_iov = ctypes.addressof(self._iovs[i])
            header.msg_iovlen = 1
            if control:
                header.msg_control = control_base + i * control
                header.msg_controllen = control
        # The ctypes views pin the arrays: a pinned bytearray cannot be resized (moved).
        self._pins = (messages, ctypes.c_char.from_buffer(self.buffer),
                      *([ctypes.c_char.from_buffer(self.control_buffer)] if control else []))
        self._messages = ctypes.addressof(messages)
        # The kernel writes each used msghdr's msg_controllen back: restored from here.
        self._pristine = memoryview(bytes(self._raw))
        self._words = memoryview(self._raw).cast("I")
        self._stride = ctypes.sizeof(_MMsgHdr) // 4
        self._lengths = np.frombuffer(self._raw, np.uint32)[_MSG_LEN::self._stride]

    def receive(self, sock: socket.socket, limit: int | None = None) -> list[memoryview]:
        """Up to ``limit`` (at most ``count``) frames queued on ``sock``, without waiting: a
        view of each frame's bytes, in arrival order; [] if none is queued. Other errors
        (e.g. ENETDOWN) are raised as ``OSError``."""
        n = self.count if limit is None else max(1, min(limit, self.count))
        if _LIBC is None:
            return self._receive_each(sock, n)
        got = self._receive_many(sock, n)
        words, stride, slots = self._words, self._stride, self.slots
        return [slots[i][:words[i * stride + _MSG_LEN]] for i in range(got)]

    def receive_rows(self, sock: socket.socket, limit: int | None = None) -> np.ndarray:
        """``receive`` for a caller that reads frames as numpy rows, with no Python object
        made per frame: the frames are the first rows of ``rows`` (frame ``i`` is
        ``rows[i, :lengths[i]]``; the rest of a row is left over from earlier frames).
        Returns ``lengths``, one int64 per frame."""
        if _LIBC is None:
            return np.array([len(view) for view in self.receive(sock, limit)], np.int64)
        n = self.count if limit is None else max(1, min(limit, self.count))
        return self._lengths[:self._receive_many(sock, n)].astype(np.int64)

    def _receive_many(self, sock: socket.socket, n: int) -> int:
        """One recvmmsg of up to ``n`` frames: how many came (0: none queued)."""
        if self.control_space:
            span = n * ctypes.sizeof(_MMsgHdr)
            self._raw[:span] = self._pristine[:span]
            span = n * self.control_space
            self.control_buffer[:span] = self._no_control[:span]
        got = self._recvmmsg(sock.fileno(), self._messages, n, _MSG_DONTWAIT, None)
        if got < 0:
            err = ctypes.get_errno()
            if err in _AGAIN:
                return 0
            raise OSError(err, os.strerror(err))
        return got

    def _receive_each(self, sock: socket.socket, n: int) -> list[memoryview]:
        views = []
        space = self.control_space
        for i in range(n):
            try:
                size, ancillary, self._flags[i], _address = sock.recvmsg_into(
                    [self.slots[i]], space, _MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                if views:  # reported with the next receive, as recvmmsg does
                    break
                raise
            if space:  # laid out as the kernel would have
                at, end = i * space, (i + 1) * space
                self.control_buffer[at:end] = self._no_control[at:end]
                for level, kind, data in ancillary:
                    if at + _CMSG_DATA + len(data) > end:
                        break
                    _CMSG.pack_into(self.control_buffer, at, _CMSG_DATA + len(data), level,
                                    kind)
                    self.control_buffer[at + _CMSG_DATA:at + _CMSG_DATA + len(data)] = data
                    at += (_CMSG_DATA + len(data) + _WORD - 1) // _WORD * _WORD
            views.append(self.slots[i][:size])
        return views

    def ancillary(self, index: int) -> list[tuple[int, int, bytes]]:
        """The ancillary data (level, type, data) of the last ``receive``'s frame ``index``,
        as ``socket.recvmsg`` gives them; [] if the receiver keeps no control buffers."""
        start = index * self.control_space
        return parse_ancillary(self._control_view[start:start + self.control_space])

    def truncated(self, index: int) -> bool:
        """Whether the last ``receive``'s frame ``index`` was longer than a buffer (and cut)."""
        if _LIBC is None:
            return bool(self._flags[index] & socket.MSG_TRUNC)
        return bool(self._words[index * self._stride + _MSG_FLAGS] & socket.MSG_TRUNC)


def _sockaddr(sock: socket.socket, address: tuple) -> bytes:
    """The C sockaddr of ``address`` for ``sock``'s family (AF_INET or AF_INET6)."""
    host, port = address[0], address[1]
    family = sock.family
    try:
        packed = socket.inet_pton(family, host)
    except OSError:
        packed = socket.inet_pton(family, socket.getaddrinfo(host, port, family)[0][4][0])
    if family == socket.AF_INET:
        return struct.pack("=H", family) + struct.pack("!H", port) + packed + bytes(8)
    if family == socket.AF_INET6:
        flow, scope = (address[2], address[3]) if len(address) >= 4 else (0, 0)
        return struct.pack("=H", family) + struct.pack("!HI", port, flow) + packed + \
            struct.pack("=I", scope)
    raise ValueError(f"no destination address for a socket of family {family!r}")


class BatchSender:
    """Preallocated sendmmsg arrays for up to ``count`` frames per system call (a longer list
    takes several calls). A ``bytes`` frame is sent from where it lies; any other buffer is
    first copied into a ``size``-byte slot of the sender's own. One sender serves one
    thread."""

    def __init__(self, count: int = BATCH, size: int = FRAME_BUFFER) -> None:
        self.count, self.size = count, size
        self._slab: bytearray | None = None  # for frames that are not bytes, made when needed
        self._name: bytes | None = None  # the sockaddr the messages carry now
        self._destination: tuple | None = None
        if _LIBC is None:
            return
        self._sendmmsg = _LIBC[1]
        self._iov_raw = bytearray(count * ctypes.sizeof(_IoVec))
        self._iov_words = memoryview(self._iov_raw).cast(_SIZE_T)
        self._iov_stride = ctypes.sizeof(_IoVec) // _WORD
        self._name_buffer = bytearray(128)  # sockaddr_storage
        self._raw = bytearray(count * ctypes.sizeof(_MMsgHdr))
        self._headers = (_MMsgHdr * count).from_buffer(self._raw)
        self._pins = (self._headers, memoryview(self._iov_raw), memoryview(self._name_buffer))
        iov_base = _address_of(self._iov_raw)
        for i in range(count):
            self._headers[i].msg_hdr.msg_iov = iov_base + i * ctypes.sizeof(_IoVec)
            self._headers[i].msg_hdr.msg_iovlen = 1
        self._messages = _address_of(self._raw)
        self._iov_array = np.frombuffer(self._iov_raw, np.uintp).reshape(count, 2)
        self._counting = np.arange(count, dtype=np.uintp)

    def _set_destination(self, sock: socket.socket, address: tuple | None) -> None:
        name = None if address is None else _sockaddr(sock, address)
        self._destination = address
        if name == self._name:
            return
        self._name = name
        pointer = 0
        if name is not None:
            self._name_buffer[:len(name)] = name
            pointer = _address_of(self._name_buffer)
        for header in self._headers:
            header.msg_hdr.msg_name = pointer
            header.msg_hdr.msg_namelen = 0 if name is None else len(name)

    def _slot(self, index: int, frame) -> int:
        """The address of a copy of ``frame`` in slot ``index`` of the sender's own buffer."""
        size = len(memoryview(frame).cast("B"))
        if size > self.size:
            raise ValueError(f"a {size}-byte frame does not fit a {self.size}-byte send slot")
        if self._slab is None:
            self._slab = bytearray(self.count * self.size)
            self._slab_view = memoryview(self._slab)  # (pins it)
            self._slab_base = _address_of(self._slab)
        start = index * self.size
        self._slab_view[start:start + size] = memoryview(frame).cast("B")
        return self._slab_base + start

    def send(self, sock: socket.socket, frames, address: tuple | None = None
             ) -> tuple[int, int]:
        """Send ``frames`` (a sequence of bytes-like objects) in order, to ``address`` (a UDP
        socket's destination) or to where ``sock`` sends anyway (a connected or AF_PACKET
        socket: ``None``). Returns (how many of the first frames went, the errno that stopped
        the next one, or 0 if all went): with a full queue (``QUEUE_FULL``: EAGAIN, ENOBUFS)
        or any other refusal the rest are the caller's, to keep, retry or drop."""
        total = len(frames)
        if _LIBC is None:
            return self._send_each(sock, frames, address)
        if address != self._destination:
            self._set_destination(sock, address)
        fd = sock.fileno()
        iov, stride, data = self._iov_words, self._iov_stride, _BYTES_DATA
        sent = 0
        while sent < total:
            n = min(self.count, total - sent)
            for i in range(n):
                frame = frames[sent + i]
                if data is not None and type(frame) is bytes:
                    iov[i * stride] = id(frame) + data
                    iov[i * stride + 1] = len(frame)
                else:
                    iov[i * stride] = self._slot(i, frame)
                    iov[i * stride + 1] = memoryview(frame).nbytes
            went, err = self._submit(fd, n)
            if err:
                return sent, err
            sent += went
        return sent, 0

    def _submit(self, fd: int, n: int) -> tuple[int, int]:
        """One sendmmsg of the first ``n`` messages (EINTR: again): (how many went, 0), or
        (0, the errno that stopped the first). Fewer than ``n`` may go: the kernel stopped at
        a frame and forgot why, and the next call says."""
        while True:
            went = self._sendmmsg(fd, self._messages, n, _MSG_DONTWAIT)
            if went > 0:
                return went, 0
            err = ctypes.get_errno() if went < 0 else errno.EAGAIN
            if err != errno.EINTR:
                return 0, err

    def send_rows(self, sock: socket.socket, rows: np.ndarray) -> tuple[int, int]:
        """``send`` of the rows of a 2-D uint8 array, each a whole frame (rows may lie apart,
        each one's bytes together), from where they lie: the messages' pointers are set for
        every row at once, no Python object is made per frame. To where ``sock`` sends (a
        connected or AF_PACKET socket). Returns as ``send`` does."""
        total = len(rows)
        if total and rows.strides[1] != 1:
            raise ValueError("each row to send must be one run of bytes")
        if _LIBC is None:
            return self._send_each(sock, rows, None)
        if self._destination is not None:
            self._set_destination(sock, None)
        fd = sock.fileno()
        iov = self._iov_array
        base, step = rows.ctypes.data, rows.strides[0]
        iov[:, 1] = rows.shape[1]
        sent = 0
        while sent < total:
            n = min(self.count, total - sent)
            iov[:n, 0] = self._counting[:n] * step + (base + sent * step)
            went, err = self._submit(fd, n)
            if err:
                return sent, err
            sent += went
        return sent, 0

    @staticmethod
    def _send_each(sock: socket.socket, frames, address: tuple | None) -> tuple[int, int]:
        sent = 0
        for frame in frames:
            try:
                if address is None:
                    sock.send(frame, _MSG_DONTWAIT)
                else:
                    sock.sendto(frame, _MSG_DONTWAIT, address)
            except OSError as exc:
                return sent, exc.errno or errno.EIO
            sent += 1
        return sent, 0
