"""The Raft port's guards as units: the restricted unpickler, the pins, the salted password."""

from __future__ import annotations

import errno
import itertools
import pickle
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
import pysyncobj.syncobj as pysyncobj_syncobj
import pysyncobj.tcp_connection as pysyncobj_tcp_connection
import pytest
from pysyncobj.node import TCPNode
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE

from broker.replication import raft, transport
from broker.replication._patches import PysyncobjPatchError

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class _CreateFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


@pytest.mark.parametrize("protocol", [2, 5])
def test_pysyncobj_messages_and_membership_commands_unpickle(protocol: int) -> None:
    message = {"type": "append_entries", "term": 3, "entries": [(b"\x00\x80cmd", 7, 3)], "set": {1, 2}}
    assert transport.restricted_loads(pickle.dumps(message, protocol)) == message
    change = transport.restricted_loads(pickle.dumps(["add", "127.0.0.1:9", TCPNode("127.0.0.1:9")], protocol))
    assert change[2] == TCPNode("127.0.0.1:9") and change[2].port == 9


@pytest.mark.parametrize("protocol", [2, 5])
def test_a_pickle_naming_any_other_global_runs_nothing(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(pickle.UnpicklingError, match="not allowed on the Raft port"):
        transport.restricted_loads(pickle.dumps(_CreateFile(str(marker)), protocol))
    assert not marker.exists()


def test_pysyncobj_reads_through_the_restriction_everywhere() -> None:
    assert pysyncobj_tcp_connection.pickle is transport.RESTRICTED_PICKLE
    assert pysyncobj_syncobj.pickle is transport.RESTRICTED_PICKLE
    parser = pysyncobj_tcp_connection.TcpConnection._TcpConnection__processParseMessage
    assert parser is transport._parse_message


def test_a_changed_pysyncobj_source_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    key = next(iter(transport._PINNED_SHA256))
    monkeypatch.setitem(transport._PINNED_SHA256, key, "0" * 64)
    monkeypatch.setattr(pysyncobj_tcp_connection.TcpConnection, "_TcpConnection__processParseMessage",
                        lambda self: None)
    with pytest.raises(PysyncobjPatchError, match="written against pysyncobj 0.3.17"):
        transport._install()


def test_the_password_is_salted_per_cluster_and_the_bind_address_is_set(tmp_path: Path) -> None:
    a = transport.salted_password("pw", "cluster-a")
    assert a == transport.salted_password("pw", "cluster-a") != transport.salted_password("pw", "cluster-b")
    conf = raft.RaftOptions(password="pw", password_salt="cluster-a").to_conf(
        tmp_path / "j", tmp_path / "d", lambda f, d: None, lambda f: (), bind_address="127.0.0.1:7")
    assert conf.password == a and conf.bindAddress == "127.0.0.1:7"
    with pytest.raises(ValueError, match="password_salt"):
        raft.RaftOptions(password="pw", password_salt="")


class _FullSocket:
    """A socket whose send buffer is always full: every frame sent is queued in the write buffer."""

    def sendmsg(self, buffers: Any) -> int:
        raise BlockingIOError(errno.EAGAIN, "full")

    def send(self, data: Any) -> int:
        raise BlockingIOError(errno.EAGAIN, "full")

    def getpeername(self) -> tuple[str, int]:
        return ("127.0.0.1", 1)


class _Connection:
    """The attributes of pysyncobj's TcpConnection that its send and frame parser touch."""

    def __init__(self, sock: socket.socket | None = None, recv_buffer_bytes: int = 0) -> None:
        self.sendRandKey: bytes | None = None
        self.recvRandKey: bytes | None = None
        self.encryptor = None
        self._TcpConnection__writeBuffer = b""
        self._TcpConnection__readBuffer: Any = b""
        self._TcpConnection__socket: Any = sock if sock is not None else _FullSocket()
        self._TcpConnection__recvBufferSize = recv_buffer_bytes
        self._TcpConnection__fileno = sock.fileno() if sock is not None else None
        self._TcpConnection__poller = self
        self.state = CONNECTION_STATE.CONNECTED
        self.disconnected = False
        self.subscriptions: list[tuple[Any, int]] = []  # (fileno, event mask) asked of the poller
        self.sending = False  # the socket is written (pysyncobj's loop over __processSend)

    def _TcpConnection__trySendBuffer(self) -> None:  # noqa: N802 (pysyncobj's name)
        while self.sending and transport._process_send(self):
            pass

    def _TcpConnection__processConnectionTimeout(self) -> None:  # noqa: N802
        pass

    def _TcpConnection__processConnection(self, descr: int, event: int) -> None:  # noqa: N802
        pass

    def subscribe(self, descr: Any, callback: Any, mask: int) -> None:  # the poller's
        self.subscriptions.append((descr, mask))

    def disconnect(self) -> None:
        self.disconnected = True

    def _TcpConnection__getSocket(self) -> None:  # noqa: N802
        return None


def _plain_frames(*messages: Any) -> bytes:
    """The frames a sender with compression off writes for ``messages``."""
    sender = _Connection()
    transport.set_message_compression("none")
    try:
        for message in messages:
            pysyncobj_tcp_connection.TcpConnection.send(sender, message)
    finally:
        transport.set_message_compression("zlib")
    return bytes(sender._TcpConnection__writeBuffer)


@pytest.mark.parametrize("mode", ["none", "zlib"])
def test_messages_are_sent_compressed_or_not_and_either_is_read(mode: str) -> None:
    import zlib

    message = {"type": "append_entries", "term": 3, "entries": [(b"\x00" + bytes(range(256)) * 40, 7, 3)]}
    sender = _Connection()
    try:
        transport.set_message_compression(mode)
        pysyncobj_tcp_connection.TcpConnection.send(sender, message)
    finally:
        transport.set_message_compression("zlib")  # the module's initial state (pysyncobj's)
    frame = sender._TcpConnection__writeBuffer
    body = frame[4:]
    assert (body[:1] == b"\x80") == (mode == "none")
    if mode == "zlib":
        assert pickle.loads(zlib.decompress(body)) == message
    receiver = _Connection()
    receiver._TcpConnection__readBuffer = frame
    assert transport._parse_message(receiver) == message and not receiver.disconnected


def test_a_frame_the_socket_takes_in_part_is_finished_on_write_events_in_place() -> None:
    """A 1 MiB frame behind a 64 KiB send buffer: the first send takes part of it, the connection asks
    the poller for write events, and each later send (as the peer reads) deletes what went out from
    the front of the same bytearray. The peer receives the frame whole and in order."""
    import os

    left, right = socket.socketpair()
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    left.setblocking(False)
    message = {"type": "append_entries", "term": 2, "entries": [(os.urandom(1 << 20), 5, 2)]}
    sender = _Connection(left)
    sender.sending = True
    transport.set_message_compression("none")
    try:
        pysyncobj_tcp_connection.TcpConnection.send(sender, message)
        buffer = sender._TcpConnection__writeBuffer
        assert isinstance(buffer, bytearray) and 0 < len(buffer) < (1 << 20)
        assert sender.subscriptions == [(left.fileno(),
                                         POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)]
        received = bytearray()
        while buffer:
            received += right.recv(1 << 20)
            while transport._process_send(sender):  # a write event
                pass
            assert sender._TcpConnection__writeBuffer is buffer
        right.settimeout(5)
        while len(received) < 4 or len(received) < 4 + struct.unpack_from("i", received)[0]:
            received += right.recv(1 << 20)  # what the kernel still holds
        receiver = _Connection()
        receiver._TcpConnection__readBuffer = bytes(received)
        assert transport._parse_message(receiver) == message and not sender.disconnected
    finally:
        transport.set_message_compression("zlib")
        left.close()
        right.close()


class _TakesSome:
    """A socket that takes ``take`` bytes of the next send, or fails it with ``error``."""

    def __init__(self, take: int = 0, error: int = 0) -> None:
        self.take, self.error, self.sent = take, error, bytearray()

    def sendmsg(self, buffers: Any) -> int:
        if self.error:
            raise OSError(self.error, "send failed")
        taken = b"".join(buffers)[:self.take]
        self.sent += taken
        return len(taken)

    def fileno(self) -> int:
        return 99


@pytest.mark.parametrize("take", [0, 1, 4, 5, 1000, -1, None])  # -1: all but the last byte, None: all
def test_a_frame_with_nothing_queued_goes_out_in_one_sendmsg_and_only_its_rest_is_queued(take: int | None) -> None:
    """With an empty write buffer a frame goes to the socket at once (its length and data in one
    ``sendmsg``, no copy into the buffer); whatever the socket did not take, inside the length or
    inside the data, is queued in order and write events are asked for only then."""
    message = {"type": "append_entries", "term": 4, "entries": [(bytes(range(256)) * 273, 9, 4)]}
    transport.set_message_compression("none")
    frame_bytes = 4 + len(transport.RESTRICTED_PICKLE.dumps(message))
    sock = _TakesSome(frame_bytes if take is None else frame_bytes + take if take < 0 else take)
    sender = _Connection()
    sender._TcpConnection__socket, sender._TcpConnection__fileno = sock, 99
    try:
        pysyncobj_tcp_connection.TcpConnection.send(sender, message)
        assert len(sock.sent) == sock.take
        assert len(sock.sent) + len(sender._TcpConnection__writeBuffer) == frame_bytes
        assert bool(sender.subscriptions) == (sock.take < frame_bytes), "write events only while bytes are left"
        receiver = _Connection()
        receiver._TcpConnection__readBuffer = bytes(sock.sent) + bytes(sender._TcpConnection__writeBuffer)
        assert transport._parse_message(receiver) == message and not sender.disconnected
    finally:
        transport.set_message_compression("zlib")


_SHAPES: dict[str, dict[str, Any]] = {
    "one small entry": {"type": "append_entries", "term": 1, "entries": [(b"\x00abc", 2, 1)]},
    "one large entry": {"type": "append_entries", "term": 4, "entries": [(bytes(range(256)) * 4096, 9, 4)]},
    "large among small": {"type": "append_entries", "term": 5, "commit_index": 7, "entries": [
        (b"\x01" * 10, 8, 5), (b"\x00" + b"a" * 65535, 9, 5), (b"\x00" + b"b" * 65534, 10, 5),
        (b"\x00" + b"c" * (1 << 20), 11, 5), (b"", 12, 5)]},
    "no entries": {"type": "heartbeat", "term": 3},
}


@pytest.mark.parametrize("shape", sorted(_SHAPES))
def test_a_frame_s_pieces_are_pysyncobj_s_pickle_with_each_large_command_sent_as_it_is(shape: str) -> None:
    """The pieces join to exactly the bytes of pysyncobj's ``dumps`` (the wire is unchanged), and a
    command of 64 KiB or more is a piece of its own, the command's own object (no copy per follower)."""
    message = _SHAPES[shape]
    pieces = transport._pickle_pieces(message)
    assert b"".join(pieces) == transport.RESTRICTED_PICKLE.dumps(message)
    large = [entry[0] for entry in message.get("entries", []) if len(entry[0]) >= 64 * 1024]
    assert [p for p in pieces if any(p is command for command in large)] == large


def test_a_frame_taken_in_part_at_every_piece_boundary_queues_exactly_its_rest() -> None:
    """Whatever the socket takes (up to, inside or just past any piece of the frame), the bytes sent
    and the bytes queued are the frame, in order."""
    message = _SHAPES["large among small"]
    transport.set_message_compression("none")
    try:
        body = transport._pickle_pieces(message)
        pieces = [struct.pack("i", sum(map(len, body))), *body]
        frame = b"".join(pieces)
        ends = list(itertools.accumulate(map(len, pieces)))
        for take in sorted({t for end in ends for t in (end - 1, end, end + 1) if 0 <= t <= len(frame)}):
            sock = _TakesSome(take)
            sender = _Connection()
            sender._TcpConnection__socket, sender._TcpConnection__fileno = sock, 99
            pysyncobj_tcp_connection.TcpConnection.send(sender, message)
            assert bytes(sock.sent) + bytes(sender._TcpConnection__writeBuffer) == frame, take
            assert bytes(sock.sent) == frame[:take]
            receiver = _Connection()
            receiver._TcpConnection__readBuffer = bytes(sock.sent) + bytes(sender._TcpConnection__writeBuffer)
            assert transport._parse_message(receiver) == message
    finally:
        transport.set_message_compression("zlib")


def test_a_failed_direct_send_disconnects_and_queues_nothing() -> None:
    sender = _Connection()
    sender._TcpConnection__socket = _TakesSome(error=errno.EPIPE)
    pysyncobj_tcp_connection.TcpConnection.send(sender, {"type": "heartbeat", "term": 1})
    assert sender.disconnected and not sender._TcpConnection__writeBuffer and not sender.subscriptions


def test_message_compression_is_validated_and_defaults_to_none() -> None:
    with pytest.raises(ValueError, match="none, zlib"):
        transport.set_message_compression("gzip")
    assert raft.RaftOptions().raft_message_compression == "none"
    with pytest.raises(ValueError, match="raft_message_compression is none or zlib"):
        raft.RaftOptions(raft_message_compression="lz4")


def test_frames_queued_and_read_in_pieces_are_parsed_in_order_in_place() -> None:
    """The write buffer grows in place as frames queue behind a full socket. Reads of any size land
    in the connection's one read buffer, which gives back whole frames in order and is reused: once
    it has grown to hold a frame and a read, more frames allocate nothing (pysyncobj's buffer was
    copied whole per read and per frame parsed, and a bytearray in its place still moved)."""
    messages = [{"type": "append_entries", "term": 1, "entries": [(bytes([i]) * (70_000 + i), i, 1)]}
                for i in range(5)] + [{"type": "heartbeat", "term": 1}]
    wire = _plain_frames(*messages)
    writer, reader = socket.socketpair()
    reader.setblocking(False)
    receiver = _Connection(reader, recv_buffer_bytes=50_000)
    try:
        allocations: list[set[int]] = []
        for _ in range(2):
            parsed: list[Any] = []
            buffers = set()
            for start in range(0, len(wire), 50_000):  # reads that split frames and length prefixes
                writer.sendall(wire[start:start + 50_000])
                while transport._read(receiver):
                    buffers.add(id(receiver._TcpConnection__readBuffer.data))
                while (message := transport._parse_message(receiver)) is not None:
                    parsed.append(message)
            assert parsed == messages and not receiver.disconnected
            assert len(receiver._TcpConnection__readBuffer) == 0
            allocations.append(buffers)
        assert len(allocations[0]) <= 3, "grows by doubling"
        assert allocations[1] == {id(receiver._TcpConnection__readBuffer.data)}, "the second pass reuses it"
    finally:
        writer.close()
        reader.close()


def test_a_length_prefix_alone_allocates_nothing_and_the_end_of_the_stream_disconnects() -> None:
    writer, reader = socket.socketpair()
    reader.setblocking(False)
    receiver = _Connection(reader, recv_buffer_bytes=64 * 1024)
    try:
        writer.sendall(struct.pack("i", transport.FRAME_BYTES_MAX) + b"x")  # a frame of 64 MiB announced
        while transport._read(receiver):
            pass
        assert transport._parse_message(receiver) is None and not receiver.disconnected
        # sized by what arrived (a read's room, doubled at most), not by the 64 MiB announced
        assert len(receiver._TcpConnection__readBuffer.data) <= 2 * 64 * 1024 + 5
        writer.close()
        assert not transport._read(receiver) and receiver.disconnected
    finally:
        writer.close()
        reader.close()


def test_a_refused_frame_still_disconnects_after_good_ones() -> None:
    receiver = _Connection()
    bad = b"\x10\x00\x00\x00" + b"\x00" * 16  # a frame of 16 bytes that no unpickler reads
    receiver._TcpConnection__readBuffer = _plain_frames({"type": "heartbeat", "term": 1}) + bad
    assert transport._parse_message(receiver) == {"type": "heartbeat", "term": 1}
    assert transport._parse_message(receiver) is None and receiver.disconnected


def test_a_connection_that_has_not_named_a_member_cannot_make_the_node_inflate_a_bomb(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A zlib frame of ~60 KB that inflates to 60 MiB: refused from an unnamed connection before it
    is inflated past UNNAMED_FRAME_BYTES_MAX (the Raft thread spent 0.7 s per 200 MB inflating such
    frames from anonymous sockets, longer than an election timeout); a member's frames inflate as
    large as MESSAGE_BYTES_MAX, the same bomb included."""
    import zlib

    bomb = zlib.compress(b"\0" * (60 << 20), 9)
    assert len(bomb) < transport.UNNAMED_FRAME_BYTES_MAX
    framed = struct.pack("i", len(bomb)) + bomb
    inflated: list[int] = []
    decompressobj = zlib.decompressobj

    class _Counting:  # what the parser inflates, in bytes
        def __init__(self) -> None:
            self._inner = decompressobj()
            self.unconsumed_tail = b""

        def decompress(self, data: bytes, max_length: int = 0) -> bytes:
            out = self._inner.decompress(data, max_length)
            self.unconsumed_tail = self._inner.unconsumed_tail
            inflated.append(len(out))
            return out

    monkeypatch.setattr(transport.zlib, "decompressobj", _Counting)
    anonymous = _Connection()
    anonymous.unnamed = True  # type: ignore[attr-defined]  # as GuardedTransport marks an accepted one
    anonymous._TcpConnection__readBuffer = framed
    assert transport._parse_message(anonymous) is None and anonymous.disconnected
    assert inflated == [transport.UNNAMED_FRAME_BYTES_MAX], "refused after inflating 64 KiB, not 60 MiB"
    large = _Connection()
    large.unnamed = True  # type: ignore[attr-defined]
    large._TcpConnection__readBuffer = struct.pack("i", transport.UNNAMED_FRAME_BYTES_MAX + 1) + b"x"
    assert transport._parse_message(large) is None and large.disconnected, "refused at its length prefix"
    member = _Connection()
    member._TcpConnection__readBuffer = framed  # a named member's frame: inflated, then refused by the unpickler
    assert transport._parse_message(member) is None and member.disconnected
    assert inflated[-1] == 60 << 20
    named = _Connection()
    named.unnamed = True  # type: ignore[attr-defined]
    named._TcpConnection__readBuffer = _plain_frames("127.0.0.1:1234")
    assert transport._parse_message(named) == "127.0.0.1:1234", "a member's address passes"


def test_a_timeout_that_redials_during_a_send_drops_the_frame_instead_of_sending_it_first() -> None:
    """The read timeout checked before a send may disconnect, and pysyncobj's disconnect callback may
    at once dial the peer again on the same connection object (state CONNECTING, a new socket). The
    frame is dropped, as pysyncobj drops what it had queued: sent on the new socket it would reach the
    peer before this node's address, and the peer would reject the connection."""
    redialled = _TakesSome(take=10_000)

    class _Redials(_Connection):
        def _TcpConnection__processConnectionTimeout(self) -> None:  # noqa: N802 (pysyncobj's name)
            self._TcpConnection__socket, self._TcpConnection__writeBuffer = redialled, b""
            self.state = CONNECTION_STATE.CONNECTING

    sender = _Redials()
    sender._TcpConnection__socket = _TakesSome(take=10_000)
    pysyncobj_tcp_connection.TcpConnection.send(sender, {"type": "pre_vote", "term": 2})
    assert not redialled.sent and not sender._TcpConnection__writeBuffer and not sender.subscriptions


class _Link:
    """Two real pysyncobj TcpConnections over loopback (one dialled, one accepted) on one poller, with
    a read timeout of ``timeout_s``; messages each side received."""

    def __init__(self, timeout_s: float) -> None:
        from pysyncobj.poller import createPoller

        self.poller = createPoller("auto")
        self.got: dict[str, list[Any]] = {"dialled": [], "accepted": []}
        server = socket.create_server(("127.0.0.1", 0))
        self.dialled = pysyncobj_tcp_connection.TcpConnection(
            self.poller, onMessageReceived=self.got["dialled"].append, timeout=timeout_s)
        assert self.dialled.connect("127.0.0.1", server.getsockname()[1])
        server.settimeout(10)
        accepted, _ = server.accept()
        server.close()
        accepted.setblocking(False)
        self.accepted = pysyncobj_tcp_connection.TcpConnection(
            self.poller, socket=accepted, onMessageReceived=self.got["accepted"].append, timeout=timeout_s)
        self.pump_until(lambda: self.dialled.state == CONNECTION_STATE.CONNECTED, "the dial completes")

    def pump_until(self, done: Any, what: str, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, f"timed out: {what}"
            self.poller.poll(0.01)

    def close(self) -> None:
        self.dialled.disconnect()
        self.accepted.disconnect()


def test_a_link_quiet_both_ways_past_the_timeout_still_carries_the_next_message() -> None:
    """pysyncobj counts its read timeout from the last read, so a live link where neither side sends
    (two followers between elections) timed out at the first message after ``connection_timeout_s``:
    the candidate's pre-vote was dropped on one side, or the other side disconnected on reading it.
    A link quiet both ways is idle: the next message gets through on it, both ways. A side that keeps
    sending without reading a reply still times out (a dead or partitioned peer)."""
    timeout_s = 0.3
    link = _Link(timeout_s)
    try:
        link.dialled.send("n3:4")  # a member's handshake
        link.pump_until(lambda: link.got["accepted"] == ["n3:4"], "the handshake")
        quiet_until = time.monotonic() + 2 * timeout_s
        link.pump_until(lambda: time.monotonic() > quiet_until, "a quiet link")  # nothing to read meanwhile
        link.dialled.send({"type": "pre_vote", "term": 2})
        link.pump_until(lambda: len(link.got["accepted"]) == 2, "the pre-vote after the quiet spell")
        # the dialled side's last read is of this answer, so its timeout counts from after this moment
        # (not from the first send below: on a loaded machine the pumps in between take a while)
        answered_from = time.monotonic()
        link.accepted.send({"type": "pre_vote_resp", "term": 2, "granted": True})
        link.pump_until(lambda: link.got["dialled"], "the answer")
        assert link.dialled.state == link.accepted.state == CONNECTION_STATE.CONNECTED
        # Now the accepted side goes silent while the dialled side keeps sending: that is a dead link.

        def sending_until_disconnected() -> bool:
            if link.dialled.state == CONNECTION_STATE.DISCONNECTED:
                return True
            link.dialled.send({"type": "append_entries", "term": 2})
            return False

        link.pump_until(sending_until_disconnected, "the timeout of a link that gets no replies")
        assert time.monotonic() - answered_from >= timeout_s
    finally:
        link.close()


@pytest.mark.parametrize("protocol", [2, 5])
def test_a_large_plain_frame_is_unpickled_where_it_was_received(monkeypatch: pytest.MonkeyPatch,
                                                                 protocol: int) -> None:
    """A large frame is not copied out of the read buffer before it is unpickled (only its entries
    are copied, by the unpickler): the copying path is not taken, the message is whole, and the buffer
    is free to be reused and grown afterwards."""
    messages = [{"type": "append_entries", "term": 2, "entries": [(b"\x00" + bytes([i]) * (100_000 * (i + 1)), i, 2),
                                                                  (b"\x00small", i + 1, 2)]} for i in range(3)]
    monkeypatch.setitem(pysyncobj_pickle.__dict__, "__protocol", protocol)  # stock pysyncobj sends protocol 2
    frames = _plain_frames(*messages, {"type": "heartbeat", "term": 2})

    def copying(data: bytes) -> Any:
        raise AssertionError("a large plain frame was copied out first")

    receiver = _Connection()
    receiver._TcpConnection__readBuffer = frames
    with monkeypatch.context() as patched:
        patched.setattr(transport, "restricted_loads", copying)
        for message in messages:
            got = transport._parse_message(receiver)
            assert got == message and type(got["entries"][0][0]) is bytes
    assert transport._parse_message(receiver) == {"type": "heartbeat", "term": 2}  # small: copied, as before
    buffer = receiver._TcpConnection__readBuffer
    assert len(buffer) == 0 and not receiver.disconnected
    with buffer.room(len(buffer.data) + 1):  # grows to a new block: nothing still holds the old one
        pass


@pytest.mark.parametrize("damage", ["global", "truncated"])
def test_a_large_hostile_or_damaged_frame_is_refused_in_place_too(tmp_path: Path, damage: str) -> None:
    marker = tmp_path / "ran"
    padding = b"p" * 100_000
    if damage == "global":
        body = pickle.dumps((padding, _CreateFile(str(marker))), 5)
    else:
        body = pickle.dumps({"type": "append_entries", "entries": [(padding, 1, 1)]}, 5)[:-1]
    receiver = _Connection()
    receiver._TcpConnection__readBuffer = struct.pack("i", len(body)) + body
    assert transport._parse_message(receiver) is None and receiver.disconnected
    assert not marker.exists()


@pytest.mark.parametrize("shape", ["protocol 2", "protocol 5", "a text line longer than a peek", "bytes after STOP"])
def test_a_large_plain_frame_parses_in_place_exactly_as_copied_out(shape: str) -> None:
    """The in-place reader is a file to the same restricted unpickler: whatever a frame holds, it
    gives what unpickling a copy gave (pysyncobj sends no text opcodes, but a peer may)."""
    message: Any = {"type": "append_entries", "entries": [(b"\x00" + bytes(range(256)) * 400, 5, 2)]}
    if shape == "a text line longer than a peek":
        body = b"\x80\x05" + pickle.dumps("x" * 200_000, 0)  # one line of 200 KB: readline is called
    else:
        body = pickle.dumps(message, 2 if shape == "protocol 2" else 5)
        if shape == "bytes after STOP":
            body += b"\x00" * 70_000
    receiver = _Connection()
    receiver._TcpConnection__readBuffer = struct.pack("i", len(body)) + body
    assert transport._parse_message(receiver) == transport.restricted_loads(body) and not receiver.disconnected
