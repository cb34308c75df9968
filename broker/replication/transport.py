"""The Raft port's defences: a restricted unpickler, a guarded transport, a per-cluster password salt.

pysyncobj 0.3.17 unpickles every frame that reaches its port (``TcpConnection.__processParseMessage``)
and every command it applies (``SyncObj`` calls ``pickle.loads``), answers utility commands
(``status``, ``add``, ``remove``, ``transfer``, ``set_version``) to anyone, and binds ``0.0.0.0``
unless told otherwise. This module, applied at import by ``raft.py``:

- replaces the ``pickle`` module that ``pysyncobj.tcp_connection`` and ``pysyncobj.syncobj`` use
  with :data:`RESTRICTED_PICKLE`, whose ``loads`` admits no global except :data:`ALLOWED_GLOBALS`
  (the one class pysyncobj's messages and commands carry), so no pickle can run code, with or
  without a password;
- replaces the frame parser with :func:`_parse_message` (same wire format) that caps frame and
  decompressed sizes (to :data:`UNNAMED_FRAME_BYTES_MAX` on a connection that has not named a
  member yet, so an anonymous zlib bomb costs the Raft thread 64 KiB of inflating, not 256 MiB)
  and logs every rejected frame with the peer's address (rate-limited), and the
  socket read with :func:`_read`, which receives straight into a :class:`_ReadBuffer` reused for
  every frame of the connection; a large plain frame is unpickled where it lies (:class:`_FrameReader`);
- replaces ``TcpConnection.send`` with :func:`_send`, which zlib-compresses each message (pysyncobj's
  way) or not, per :func:`set_message_compression` (``RaftOptions.raft_message_compression``). The
  parser tells the two apart by the first byte (a pickle starts with 0x80, a zlib stream never does),
  so nodes with either setting talk to each other (a rolling change is safe);
- finishes a message the socket took only in part: :func:`_send` asks the poller for a write event
  while bytes are left, and :func:`_process_send` drops what the socket took from the front of the
  write buffer in place. pysyncobj watched for write events only until a connection's first send,
  so the rest of a message larger than the socket's free send buffer (a 1 MiB publish where
  ``net.core.wmem_max`` caps ``SO_SNDBUF`` at its usual 208 KiB) waited for the node's next send to
  that peer, a heartbeat away when nothing else was sent, and every partial send copied the rest;
  a frame sent with nothing queued goes to the socket without a copy into the write buffer;
- keeps idle links: :func:`_process_connection_timeout` treats a connection quiet both ways for
  longer than ``connection_timeout_s`` as idle rather than dead (pysyncobj dropped two followers'
  link at the first message of an election, which cost a failover an extra timeout or reconnect);
- provides :class:`GuardedTransport`: utility commands off, and an incoming connection must name a
  cluster member as its first message (no read-only or unknown peers), else it is logged and closed;
  one that has not done so within :attr:`HandshakeLimits.timeout_s` of its accept (a stalled or
  trickled partial frame, an idle socket) is closed too, and the connections still unnamed are
  capped per peer host and in all (the oldest is closed first), so unauthenticated sockets cannot
  pile up until the node runs out of file descriptors;
- :func:`salted_password` turns the operator's password into pysyncobj's, salted per cluster
  (pysyncobj's own key derivation uses one fixed salt for everybody).

``raft.RaftOptions.to_conf`` sets ``bindAddress`` so that the port binds exactly the configured host.
Every patched or relied-upon pysyncobj function is pinned by the sha256 of its source: a different
pysyncobj fails at import (:class:`broker.replication._patches.PysyncobjPatchError`).
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import io
import logging
import math
import pickle
import socket
import struct
import threading
import time
import types
import zlib
from dataclasses import dataclass
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
import pysyncobj.syncobj as pysyncobj_syncobj
import pysyncobj.tcp_connection as pysyncobj_tcp_connection
import pysyncobj.transport as pysyncobj_transport
from pysyncobj.monotonic import monotonic as pysyncobj_monotonic
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE

from broker.listen import bind_failure
from broker.replication._patches import PINNED_VERSION, PysyncobjPatchError
from broker.replication.snapshot_guard import StampingTransport

logger = logging.getLogger(__name__)

# Globals a pickle from a peer may name: membership commands carry ['add'|'rem', id, TCPNode]; with
# protocol 2 (the pickle5 patch off: stock pysyncobj) bytes are rebuilt by _codecs.encode(str, 'latin1')
# and sets by builtins.set. None of them runs code of the sender's choosing.
ALLOWED_GLOBALS = frozenset({
    ("pysyncobj.node", "TCPNode"), ("_codecs", "encode"), ("__builtin__", "set"), ("builtins", "set"),
    ("__builtin__", "frozenset"), ("builtins", "frozenset"),
})
FRAME_BYTES_MAX = 64 * 1024 * 1024  # one wire frame (pysyncobj chunks entries by appendEntriesBatchSizeBytes)
MESSAGE_BYTES_MAX = 256 * 1024 * 1024  # one frame once decompressed
# A connection that has not named a cluster member yet sends only its key exchange (32 bytes) and a
# member's address: its frames, raw and inflated, are held to this. Without it an anonymous socket
# could send a zlib bomb that inflates to MESSAGE_BYTES_MAX on the Raft thread (0.7 s for 200 MB
# here, longer than an election timeout: three of them moved the leadership three times).
UNNAMED_FRAME_BYTES_MAX = 64 * 1024
REJECT_LOG_INTERVAL_S = 10.0  # at most one warning per peer host in this interval
_PASSWORD_KDF_ITERATIONS = 200_000
_ADDRESS_CHALLENGE_BYTES = 32  # pysyncobj's random key exchanged first on encrypted connections

_PINNED_SHA256 = {
    (pysyncobj_tcp_connection.TcpConnection, "_TcpConnection__processParseMessage"): (
        "4ecbfdad3baa2eacb0ad8d561281110fa5b06a3cd1f221614c31e4dc6e5a32ae"
    ),
    (pysyncobj_tcp_connection.TcpConnection, "send"): (
        "cb29077c32990abb055f388a1bad7fc94d1f2a20d9513698f09ebba8804520a6"
    ),
    # replaced by _read (the same errors and disconnects, received into the connection's _ReadBuffer)
    (pysyncobj_tcp_connection.TcpConnection, "_TcpConnection__processRead"): (
        "002c11f3c6f60907a12c9e402930e5e33bda022686475534bdcee04ee5570b67"
    ),
    # replaced by _process_send (the same errors and disconnects; what was sent deleted in place)
    (pysyncobj_tcp_connection.TcpConnection, "_TcpConnection__processSend"): (
        "86b72a4075c0cd79ca83c1783c82ab3fd332868ced01af5f42937c347414e8e9"
    ),
    # replaced by _process_connection_timeout (a link quiet both ways is idle, not dead); relied upon
    # by _send_now: the read timeout is checked before a send
    (pysyncobj_tcp_connection.TcpConnection, "_TcpConnection__processConnectionTimeout"): (
        "7828832eb85541f243cd3842628cfd058b928666a378ac192958d35c64f47dc4"
    ),
    (pysyncobj_tcp_connection.TcpConnection, "_TcpConnection__trySendBuffer"): (
        "6fc748d9120c1dfc463a3a5c28735ae7ef88a110e318ed01496e93923117dd31"
    ),
    # relied upon: a write event sends what is buffered, then watches for writes only while bytes are left
    (pysyncobj_tcp_connection.TcpConnection, "_TcpConnection__processConnection"): (
        "b2854d89c1b9724743800086d54841543148069bc9166890fec0eac0bba44462"
    ),
    (pysyncobj_transport.TCPTransport, "_onIncomingMessageReceived"): (
        "8b7217b0cc17c96de29c4b69b029cdb0b8d307f3eaf48fc8210060d47e48fcaf"
    ),
    # relied upon: which members this node dials (an incoming connection naming one is refused)
    (pysyncobj_transport.TCPTransport, "_shouldConnect"): (
        "45eab7664e7caa39655d7ccd39ecccfec9389c11a44220216555dabf962e244c"
    ),
    # relied upon by GuardedTransport._maybeBind: a failed bind counts _bindAttempts and is retried
    (pysyncobj_transport.TCPTransport, "_maybeBind"): (
        "d0f13699c8a87e49e562b11af1546ec81177e06848d93b878d6d8a34c200663e"
    ),
    (pysyncobj_transport.TCPTransport, "_createServer"): (
        "df2c7dd8d54c60839cde7872e9afaf19b8239191958e0dfd60bbdf6dc032786e"
    ),
    (pysyncobj_transport.Transport, "setOnUtilityMessageCallback"): (
        "9d429192a2b5a95fd2021b67af077724f4887ca4db27294f1154f29bf1164b29"
    ),
    (pysyncobj_transport.Transport, "_onMessageReceived"): (
        "c3e908d4e1c7ee9b60f71f9d286eb840e03c284ec23420e3d7e04ec44624d8c1"
    ),
}


class RaftPortViolation(Exception):
    """A peer sent something the Raft port does not accept (the connection is closed)."""


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed on the Raft port")


def restricted_loads(data: bytes) -> Any:
    """Unpickle ``data`` admitting no global but :data:`ALLOWED_GLOBALS` (UnpicklingError otherwise)."""
    return _RestrictedUnpickler(io.BytesIO(pysyncobj_pickle.to_bytes(data))).load()


class _FrameReader:
    """A pickle's bytes in place (a view of a connection's read buffer), read as a file by the
    restricted unpickler, which then copies out only the bytes objects it builds: a 1 MiB entry is
    copied once, not twice (the frame first, then its entries).

    ``peek`` lets the C unpickler take its small opcodes from a view (CPython asks for 128 KiB at a
    time) instead of a call per opcode; ``readinto`` fills a large bytes object straight from the view."""

    __slots__ = ("_view", "_at")

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._at = 0

    def peek(self, size: int = 0) -> memoryview:
        return self._view[self._at:self._at + max(size, 1)]

    def read(self, size: int = -1) -> memoryview:
        start = self._at
        self._at = len(self._view) if size < 0 else min(len(self._view), start + size)
        return self._view[start:self._at]

    def readinto(self, target: memoryview) -> int:
        start = self._at
        count = min(len(target), len(self._view) - start)
        target[:count] = self._view[start:start + count]
        self._at = start + count
        return count

    def readline(self) -> bytes:  # a text opcode's line longer than the unpickler's peek (never pysyncobj's)
        rest = bytes(self._view[self._at:])
        end = rest.find(b"\n") + 1 or len(rest)
        self._at += end
        return rest[:end]


def _restricted_load_in_place(view: memoryview) -> Any:
    """:func:`restricted_loads` of the pickle in ``view`` without copying it first."""
    reader: Any = _FrameReader(view)  # the C unpickler takes any buffer from read(), not only bytes
    return _RestrictedUnpickler(reader).load()


class _RestrictedPickleModule(types.ModuleType):
    """Stands in for ``pysyncobj.pickle`` inside pysyncobj's transport and SyncObj: writes as before
    (the protocol is read from ``pysyncobj.pickle`` at call time), reads through the restriction."""

    def __init__(self) -> None:
        super().__init__("raftbroker_restricted_pickle")
        self.dumps = pysyncobj_pickle.dumps
        self.dump = pysyncobj_pickle.dump
        self.to_bytes = pysyncobj_pickle.to_bytes
        self.loads = restricted_loads


RESTRICTED_PICKLE = _RestrictedPickleModule()


class _RejectLog:
    """Rate-limited warnings about rejected peers: one line per host per interval, with a count."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}  # host -> (time of last line, suppressed since)
        self.total = 0

    def report(self, peer: str, reason: str) -> None:
        host = peer.rpartition(":")[0] or peer
        now = time.monotonic()
        with self._lock:
            self.total += 1
            last, suppressed = self._last.get(host, (float("-inf"), 0))
            if now - last < self._interval_s:
                self._last[host] = (last, suppressed + 1)
                return
            self._last[host] = (now, 0)
        more = f" ({suppressed} more from this host suppressed)" if suppressed else ""
        logger.warning("raft port: rejected %s: %s; connection closed%s", peer, reason, more)


REJECTIONS = _RejectLog(REJECT_LOG_INTERVAL_S)


def _peer_of(conn: Any) -> str:
    sock = getattr(conn, "_TcpConnection__socket", None)
    try:
        host, port = sock.getpeername()[:2] if sock is not None else ("?", "?")
    except OSError:
        return "unknown peer"
    return f"{host}:{port}"


def _reject(conn: Any, reason: str) -> None:
    REJECTIONS.report(_peer_of(conn), reason)
    conn.disconnect()


MESSAGE_COMPRESSIONS = ("none", "zlib")
_ZLIB_LEVEL = 3  # pysyncobj's
_LENGTH = struct.Struct("i")  # a frame's length prefix (native order, as pysyncobj writes it)
_PICKLE_PROTO_OPCODE = b"\x80"  # first byte of every pickle of protocol >= 2; never of a zlib stream (0x78)
_PICKLE_PROTO = _PICKLE_PROTO_OPCODE[0]
# Plain frames from this size on are unpickled in the read buffer (_FrameReader); below it, copying the
# frame out first costs less than the reader's calls. AppendEntries carrying a batch of publishes are
# far above it (a 1 KiB publish of 1000 records: ~1 MiB).
_IN_PLACE_FRAME_BYTES = 64 * 1024
_compress_messages = True  # pysyncobj's behaviour until set_message_compression() is called


def set_message_compression(mode: str) -> None:
    """``"zlib"``: compress every Raft message per connection (pysyncobj's way); ``"none"``: send the
    pickle as it is. Process-wide (pysyncobj's connections share one send function); either is read."""
    global _compress_messages
    if mode not in MESSAGE_COMPRESSIONS:
        raise ValueError(f"message compression must be one of {', '.join(MESSAGE_COMPRESSIONS)}, not {mode!r}")
    _compress_messages = mode == "zlib"


class _Pieces:
    """A pickler's file that keeps what it is given: the pickle's bytes as a list of pieces."""

    __slots__ = ("pieces",)

    def __init__(self) -> None:
        self.pieces: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.pieces.append(data)


# More pieces than this are joined first (sendmsg takes at most IOV_MAX = 1024 buffers; a frame of
# pysyncobj's is bounded by appendEntriesBatchSizeBytes, so it rarely holds that many large entries).
_PIECES_MAX = 256


def _pickle_pieces(message: Any) -> list[bytes]:
    """``pickle.dumps(message)`` (pysyncobj's protocol) as pieces whose concatenation is exactly its
    bytes, with every bytes object of 64 KiB or more (CPython's frame size target) as a piece of its
    own: the very object, not a copy. For protocol >= 4 the C pickler writes such an object straight
    to its file after ending the frame before it, which is what ``dumps`` writes too, so the frame
    on the wire is unchanged. A 1 MiB command was copied into a fresh 1 MiB pickle for every follower."""
    sink = _Pieces()
    pickle.Pickler(sink, pysyncobj_pickle.__dict__["__protocol"]).dump(message)
    return sink.pieces if len(sink.pieces) <= _PIECES_MAX else [b"".join(sink.pieces)]


def _send(self: Any, message: Any) -> None:
    """Replaces ``TcpConnection.send``: the same frame, zlib only when compression is on. With
    nothing queued, the frame goes straight to the socket in one ``sendmsg`` of its length and its
    pieces (:func:`_pickle_pieces`: a large entry is sent from the command's own bytes), and only what
    the socket did not take is queued (pysyncobj copied every frame into the write buffer first: a
    1 MiB entry once more per follower). The write buffer is a bytearray that frames are appended to
    in place (pysyncobj's bytes were copied whole for every frame queued behind a socket that was
    full)."""
    if self.sendRandKey:
        message = (self.sendRandKey, message)
    if _compress_messages or self.encryptor:
        data = RESTRICTED_PICKLE.dumps(message)
        if _compress_messages:
            data = zlib.compress(data, _ZLIB_LEVEL)
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(pysyncobj_monotonic()))
        pieces = [data]
    else:
        pieces = _pickle_pieces(message)
    pieces.insert(0, _LENGTH.pack(sum(map(len, pieces))))
    buffer = _own_buffer(self, "_TcpConnection__writeBuffer")
    if buffer or self.state != CONNECTION_STATE.CONNECTED:
        for piece in pieces:
            buffer += piece
        self._TcpConnection__trySendBuffer()
    else:
        sent = _send_now(self, pieces)
        for piece in pieces:  # what the socket did not take, queued
            if sent >= len(piece):
                sent -= len(piece)
            else:
                buffer += memoryview(piece)[sent:] if sent else piece
                sent = 0
    self._raftbroker_sent_at = pysyncobj_monotonic()  # after the timeout check: see _process_connection_timeout
    if self._TcpConnection__writeBuffer and self.state == CONNECTION_STATE.CONNECTED:
        # the socket's send buffer is full: the rest goes out on the next write event (pysyncobj's
        # __processConnection stops watching for them once the buffer is empty)
        self._TcpConnection__poller.subscribe(
            self._TcpConnection__fileno, self._TcpConnection__processConnection,
            POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)


def _send_now(self: Any, pieces: list[bytes]) -> int:
    """What one ``sendmsg`` of a frame's ``pieces`` sent on a connected connection with nothing
    queued; with ``__trySendBuffer``'s read timeout check first and ``__processSend``'s errors (a
    full socket sends nothing, any other error disconnects, which empties the write buffer: the
    frame is dropped as pysyncobj drops what it had queued). A timeout there disconnects, and the
    disconnect callback may at once dial the peer again on this same object: the frame is dropped
    then too, never sent on the new socket, where it would arrive before this node's address (the
    peer rejects such a connection, and the next dial waits ``connection_retry_s``). A dropped frame
    counts as sent whole."""
    self._TcpConnection__processConnectionTimeout()
    if self.state != CONNECTION_STATE.CONNECTED:
        return sum(map(len, pieces))
    try:
        sent: int = self._TcpConnection__socket.sendmsg(pieces)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            self.disconnect()
            return sum(map(len, pieces))
        return 0
    return sent


def _process_connection_timeout(self: Any) -> None:
    """Replaces ``TcpConnection.__processConnectionTimeout`` (run before every send and on every event
    of the connection): pysyncobj disconnects when nothing was read for ``connection_timeout_s``. On
    a link where neither side sends, two followers' between elections, that is true of a live link:
    a candidate's first message to the other follower (its pre-vote) disconnected it and was lost,
    or was sent on the re-dialled socket ahead of the address (see :func:`_send_now`), and the other
    follower disconnected on reading one for the same reason. A failover then took an election
    timeout or a reconnect (1 s) more: 1.5-2.1 s instead of 0.4-0.6 in a cluster that had run for a
    while (bench/NOTE.md, 2026-11-29 16:25-17:25 UTC). Now a link quiet both ways past the timeout
    (nothing read and nothing sent) is idle, and its timeout starts again from now. A link this node
    sends on without reading a reply for that long is still dead, as before: a leader's heartbeats to
    a partitioned follower, a candidate's requests to a silent peer. Dead peers that close or reset
    the socket are seen at once, as before, through the poller's error and end-of-stream events."""
    now = pysyncobj_monotonic()
    timeout = self._TcpConnection__timeout
    if now - self._TcpConnection__lastReadTime <= timeout:
        return
    if now - getattr(self, "_raftbroker_sent_at", -math.inf) > timeout:
        self._TcpConnection__lastReadTime = now
        return
    self.disconnect()


def _process_send(self: Any) -> bool:
    """Replaces ``TcpConnection.__processSend``: one ``send`` of the write buffer, with pysyncobj's
    errors and disconnects. What the socket took is deleted from the front of the bytearray in place
    (CPython moves the start, copying nothing); pysyncobj sliced a copy of the rest after each send.
    True when bytes went out (the caller sends again until False)."""
    buffer = self._TcpConnection__writeBuffer
    if not buffer:
        return False
    try:
        sent = self._TcpConnection__socket.send(buffer)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            self.disconnect()
        return False
    if sent <= 0:
        return False
    if isinstance(buffer, bytearray):
        del buffer[:sent]
    else:  # pysyncobj's bytes (only before the first _send)
        self._TcpConnection__writeBuffer = buffer[sent:]
    return True


def _own_buffer(conn: Any, attribute: str) -> bytearray:
    """The connection's write buffer as a bytearray, converted once after pysyncobj set it to
    ``bytes()`` (at connect and disconnect); :func:`_send` extends it in place."""
    buffer = getattr(conn, attribute)
    if not isinstance(buffer, bytearray):
        buffer = bytearray(buffer)
        setattr(conn, attribute, buffer)
    return buffer


def _decompress(data: bytes, limit: int = MESSAGE_BYTES_MAX) -> bytes:
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, limit)
    if inflater.unconsumed_tail:
        raise RaftPortViolation(f"frame inflates beyond {limit} bytes")
    return out


def _frame_bytes_max(conn: Any) -> int:
    """The largest frame ``conn`` may send, raw or inflated: :data:`UNNAMED_FRAME_BYTES_MAX` while
    :class:`GuardedTransport` holds it unnamed (it sets and clears ``unnamed``), else the frame caps."""
    return UNNAMED_FRAME_BYTES_MAX if getattr(conn, "unnamed", False) else MESSAGE_BYTES_MAX


class _ReadBuffer:
    """A connection's received bytes: one bytearray that reads land in (``recv_into``) and frames are
    parsed out of, reused for every frame; ``data[start:end]`` is what is held.

    pysyncobj appends each read to its buffer and slices each frame off it. Even with a bytearray,
    CPython then copies: it grows a bytearray to the exact size on every large append (a realloc that
    may move it), and after a frame is deleted from the front it moves what is left to a new block.
    A 1 MiB entry read in 256 KiB pieces was copied several times over before it was parsed. Here it
    is copied once by the kernel; the buffer moves what it holds only to make room, and it grows (to
    twice its size) only when what it holds does not leave room for a read, so a peer makes it large
    only by sending that many bytes (a frame's length prefix alone allocates nothing).
    """

    __slots__ = ("data", "start", "end")

    def __init__(self, held: bytes = b"") -> None:
        self.data = bytearray(held)
        self.start, self.end = 0, len(held)

    def __len__(self) -> int:
        return self.end - self.start

    def room(self, at_least: int) -> memoryview:
        """The free space after what is held, at least ``at_least`` bytes (release it before the next call)."""
        if self.start == self.end:
            self.start = self.end = 0
        if len(self.data) - self.end < at_least:
            held = self.end - self.start
            size = len(self.data)
            if held + at_least > size:
                size = max(2 * size, held + at_least)
            kept = bytes(memoryview(self.data)[self.start:self.end])
            if size != len(self.data):
                self.data = bytearray(size)
            self.data[:held] = kept
            self.start, self.end = 0, held
        return memoryview(self.data)[self.end:]

    def consume(self, count: int) -> None:
        self.start += count


def _own_reader(conn: Any) -> _ReadBuffer:
    """The connection's read buffer, made once after pysyncobj set it to ``bytes()`` (at connect and
    disconnect), keeping whatever it held."""
    buffer = conn._TcpConnection__readBuffer
    if not isinstance(buffer, _ReadBuffer):
        buffer = _ReadBuffer(bytes(buffer))
        conn._TcpConnection__readBuffer = buffer
    return buffer


def _read(self: Any) -> bool:
    """Replaces ``TcpConnection.__processRead``: one ``recv_into`` the connection's :class:`_ReadBuffer`
    (at least ``recvBufferSize`` bytes of room, all its free space offered), with pysyncobj's checks:
    a socket error other than EAGAIN, a pending SO_ERROR or the end of the stream disconnects. True
    when bytes arrived (pysyncobj reads again until False)."""
    buffer = _own_reader(self)
    sock = self._TcpConnection__socket
    try:
        with buffer.room(self._TcpConnection__recvBufferSize) as room:
            received = sock.recv_into(room)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            self.disconnect()
        return False
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
        self.disconnect()
        return False
    if not received:
        self.disconnect()
        return False
    buffer.end += received
    return True


def _parse_message(self: Any) -> Any:
    """Replaces ``TcpConnection.__processParseMessage``: the same frames (4-byte length, optional
    Fernet, zlib, pickle, optional random-key pair), restricted, bounded, and every refusal logged.
    Reads the connection's :class:`_ReadBuffer` (filled by :func:`_read`); a parsed frame is consumed
    from its front, nothing moves. A large plain frame (no password, no compression) is unpickled
    where it lies (:class:`_FrameReader`); any other is copied out first, to be decrypted or
    decompressed."""
    buffer = _own_reader(self)
    if len(buffer) < 4:
        return None
    length = _LENGTH.unpack_from(buffer.data, buffer.start)[0]
    limit = _frame_bytes_max(self)
    if not 0 <= length <= min(FRAME_BYTES_MAX, limit):
        unnamed = " (a connection that has not named a cluster member)" if limit < FRAME_BYTES_MAX else ""
        _reject(self, f"frame length {length} outside 0..{min(FRAME_BYTES_MAX, limit)}{unnamed}")
        return None
    if len(buffer) - 4 < length:
        return None
    start = buffer.start + 4
    try:
        if length >= _IN_PLACE_FRAME_BYTES and not self.encryptor and buffer.data[start] == _PICKLE_PROTO:
            # a large plain frame: unpickled where it was received (its entries are copied once)
            message = _restricted_load_in_place(memoryview(buffer.data)[start:start + length])
        else:
            with memoryview(buffer.data) as view:
                data = bytes(view[start:start + length])
            if self.encryptor:
                timestamp = self.encryptor.extract_timestamp(data)
                if timestamp < self.recvLastTimestamp:
                    raise RaftPortViolation("replayed or reordered encrypted frame")
                self.recvLastTimestamp = timestamp
                data = self.encryptor.decrypt(data)
            plain = data[:1] == _PICKLE_PROTO_OPCODE  # sent with compression off (FRAME_BYTES_MAX bounds it)
            message = restricted_loads(data if plain else _decompress(data, limit))
        if self.recvRandKey:
            rand_key, message = message
            if rand_key != self.recvRandKey:
                raise RaftPortViolation("wrong session key")
    except Exception as exc:  # noqa: BLE001 (anything a hostile frame provokes closes the connection)
        reason = type(exc).__name__ if self.encryptor and not str(exc) else f"{type(exc).__name__}: {exc}"
        _reject(self, f"undecodable frame ({reason[:200]})")
        return None
    buffer.consume(4 + length)
    return message


@dataclass(frozen=True)
class HandshakeLimits:
    """How long, and how many, incoming Raft connections may stay unnamed (``RaftOptions`` sets them).

    A connection is *unnamed* from its accept until its first message names a cluster member (after
    the key exchange when a password is set). A member does that within a round trip; anything else
    holds a file descriptor for as long as it likes, since pysyncobj checks a connection's read
    timeout only when the socket has an event and a trickle of bytes keeps even that fresh.
    """

    timeout_s: float = 10.0  # from accept, whatever arrives meanwhile
    per_host_max: int = 16  # unnamed connections from one peer host; a new one closes that host's oldest
    total_max: int = 256  # unnamed connections in all; a new one closes the oldest

    def __post_init__(self) -> None:
        if not (self.timeout_s > 0 and 1 <= self.per_host_max <= self.total_max):
            raise ValueError(f"invalid HandshakeLimits {self}: timeout_s > 0 and 1 <= per_host_max <= total_max")


class GuardedTransport(StampingTransport):
    """pysyncobj's TCP transport (with the journal's send gate and the snapshot guard's stamps) that
    answers only cluster members: utility commands are never registered, and an incoming connection
    whose first message (after the encrypted key exchange, when a password is set) is not a member's
    Raft address is closed and logged, as is one still unnamed after the syncobj's
    ``handshake_limits`` (:class:`HandshakeLimits`) or beyond their caps. The server binds
    ``conf.bindAddress`` (set by ``RaftOptions.to_conf``), never 0.0.0.0."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:  # noqa: N803 (pysyncobj's names)
        # Unnamed incoming connections in accept order: connection -> (accepted at, peer host).
        self._unnamed: dict[Any, tuple[float, str]] = {}
        self._limits: HandshakeLimits = getattr(syncObj, "handshake_limits", None) or HandshakeLimits()
        super().__init__(syncObj, selfNode, otherNodes)

    def _onNewIncomingConnection(self, conn: Any) -> None:  # noqa: N802
        super()._onNewIncomingConnection(conn)
        peer = _peer_of(conn)
        host = peer.rpartition(":")[0] or peer
        self._forget_named()
        from_host = [c for c, (_, h) in self._unnamed.items() if h == host]
        if len(from_host) >= self._limits.per_host_max:
            self._close_unnamed(from_host[0], f"more than {self._limits.per_host_max} connections from "
                                              f"{host} have not named a cluster member; closed the oldest")
        elif len(self._unnamed) >= self._limits.total_max:
            self._close_unnamed(next(iter(self._unnamed)), f"more than {self._limits.total_max} connections "
                                                           "have not named a cluster member; closed the oldest")
        self._unnamed[conn] = (pysyncobj_monotonic(), host)
        conn.unnamed = True  # its frames are held to UNNAMED_FRAME_BYTES_MAX until it names a member

    def _onTick(self) -> None:  # noqa: N802
        super()._onTick()
        if not self._unnamed:
            return
        self._forget_named()
        deadline = pysyncobj_monotonic() - self._limits.timeout_s
        for conn, (accepted_at, _) in list(self._unnamed.items()):
            if accepted_at > deadline:
                break  # accept order: the rest are younger
            self._close_unnamed(conn, f"did not name a cluster member within {self._limits.timeout_s:g} s")

    def _forget_named(self) -> None:
        """Drop the connections that named a member, were rejected or went away since."""
        for conn in [c for c in self._unnamed if c not in self._unknownConnections]:
            del self._unnamed[conn]

    def _close_unnamed(self, conn: Any, reason: str) -> None:
        del self._unnamed[conn]
        self._unknownConnections.discard(conn)
        _reject(conn, reason)

    def setOnUtilityMessageCallback(self, message: str, callback: Any) -> None:  # noqa: N802 (pysyncobj's name)
        """Utility commands (status, add, remove, transfer, set_version) are off on the Raft port."""

    def _maybeBind(self) -> None:  # noqa: N802
        """pysyncobj's, saying why a bind failed: it retries every ``bindRetryTime`` without a word, so a
        node whose Raft port another process holds started, said ready and stayed a follower that no
        member could reach. Logged at the first failure and every :data:`BIND_REPORT_EVERY` after."""
        failed = self._bindAttempts
        super()._maybeBind()
        if self._bindAttempts > failed and failed % BIND_REPORT_EVERY == 0:
            address = self._syncObj.conf.bindAddress
            logger.error("raft port: cannot listen on %s (--raft / raft_address): %s; this node takes no "
                         "part in Raft until it can (retrying every %g s, %d attempts so far)", address,
                         _bind_reason(address), self._syncObj.conf.bindRetryTime, self._bindAttempts)

    def _createServer(self) -> None:  # noqa: N802
        if self._syncObj.conf.bindAddress is None:
            raise RaftPortViolation("refusing to bind the Raft port without an explicit bindAddress")
        super()._createServer()

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:  # noqa: N802
        if self._syncObj.encryptor and not conn.sendRandKey:
            if not (isinstance(message, bytes) and len(message) == _ADDRESS_CHALLENGE_BYTES):
                self._unknownConnections.discard(conn)
                _reject(conn, "bad key exchange")
                return
        elif isinstance(message, list):
            self._unknownConnections.discard(conn)
            _reject(conn, f"utility command {str(message[:1])[:60]} (utility commands are off)")
            return
        elif not (isinstance(message, str) and message in self._nodeAddrToNode):
            self._unknownConnections.discard(conn)
            _reject(conn, f"first message {str(message)[:60]!r} is not a cluster member's address")
            return
        elif self._shouldConnect(self._nodeAddrToNode[message]):
            # Members dial only nodes whose address sorts below their own, so this member never dials
            # here: it is an impostor (possible without a password). Accepting it would put this
            # connection in place of the one this node dials to that member, and pysyncobj would then
            # redial with it: no callback sends our address on it, so the member refuses every
            # reconnection and the link stays down for good.
            self._unknownConnections.discard(conn)
            _reject(conn, f"names {message}, which this node dials itself (a member never dials here)")
            return
        super()._onIncomingMessageReceived(conn, message)
        if conn not in self._unknownConnections:
            conn.unnamed = False  # named a member: a member's frames may be as large as entries are

    def _onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        if not (isinstance(message, dict) and isinstance(message.get("type"), str)):
            conn = self._connections.get(node)
            REJECTIONS.report(_peer_of(conn) if conn is not None else str(node),
                              f"message of type {type(message).__name__} from member {node}")
            if conn is not None:
                conn.disconnect()
            return
        super()._onMessageReceived(node, message)


BIND_REPORT_EVERY = 30  # failed binds of the Raft port between two log lines (one a second: 30 s)


def _bind_reason(address: str) -> str:
    """Why ``address`` cannot be bound now, in the OS's words (:func:`broker.listen.bind_failure`)."""
    failure = bind_failure(address)
    if failure is None:
        return "it could not be bound a moment ago"
    reason = failure.strerror or str(failure)
    return f"{reason} (another process, or an earlier node, listens there?)" if failure.errno == errno.EADDRINUSE \
        else reason


def salted_password(password: str, salt: str) -> str:
    """The password handed to pysyncobj: PBKDF2-SHA256 of ``password`` with this cluster's ``salt``
    (pysyncobj derives its Fernet key from what it gets with a salt fixed in its source)."""
    assert password and salt, "password and salt must be non-empty"
    key = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), _PASSWORD_KDF_ITERATIONS)
    return key.hex()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _install() -> None:
    parser = pysyncobj_tcp_connection.TcpConnection._TcpConnection__processParseMessage
    if parser is _parse_message:  # already installed (a module reload)
        return
    for (owner, attr), expected in _PINNED_SHA256.items():
        digest = _sha256(inspect.getsource(vars(owner)[attr]))
        if digest != expected:
            raise PysyncobjPatchError(
                f"raftbroker's Raft port guards were written against pysyncobj {PINNED_VERSION}; "
                f"{owner.__name__}.{attr} has sha256 {digest}. Re-review broker/replication/transport.py.")
    for module in (pysyncobj_tcp_connection, pysyncobj_syncobj):
        current = module.__dict__.get("pickle")
        if current is not pysyncobj_pickle and current is not RESTRICTED_PICKLE:
            raise PysyncobjPatchError(f"{module.__name__}.pickle is not pysyncobj.pickle; re-review transport.py")
        module.__dict__["pickle"] = RESTRICTED_PICKLE
    pysyncobj_tcp_connection.TcpConnection._TcpConnection__processParseMessage = _parse_message
    pysyncobj_tcp_connection.TcpConnection._TcpConnection__processRead = _read
    pysyncobj_tcp_connection.TcpConnection.send = _send
    pysyncobj_tcp_connection.TcpConnection._TcpConnection__processSend = _process_send
    pysyncobj_tcp_connection.TcpConnection._TcpConnection__processConnectionTimeout = _process_connection_timeout


_install()

__all__ = ["ALLOWED_GLOBALS", "GuardedTransport", "HandshakeLimits", "MESSAGE_COMPRESSIONS", "RESTRICTED_PICKLE",
           "REJECTIONS", "RaftPortViolation", "restricted_loads", "salted_password", "set_message_compression"]
