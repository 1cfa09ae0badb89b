"""FrameReader cuts the bytes of a non-blocking pipe into the messages a multiprocessing Connection sent, however
the bytes arrive: split anywhere, several messages at once, the long header of very large messages."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import struct
import threading

import pytest

from ember.engine.frames import FrameReader


@pytest.fixture
def pipe():
    reader, writer = multiprocessing.Pipe(duplex=False)
    os.set_blocking(reader.fileno(), False)
    yield reader, writer
    reader.close()
    writer.close()


def test_messages_split_anywhere_come_out_whole_and_in_order(pipe):
    reader, writer = pipe
    frames = FrameReader(reader.fileno())
    messages = [{"n": 1}, list(range(50_000)), "x" * 20_000, None]  # two of them larger than a pipe read is likely to get
    raw = b"".join(struct.pack("!i", len(data)) + data for data in map(pickle.dumps, messages))
    received = []
    for start in range(0, len(raw), 7001):  # chunks that cut headers and bodies
        os.write(writer.fileno(), raw[start : start + 7001])
        received += frames.read_available()
    assert received == messages


def test_what_connection_send_writes_is_read_back(pipe):
    reader, writer = pipe
    frames = FrameReader(reader.fileno())
    assert frames.read_available() == []  # nothing there yet: no error, no message
    sender = threading.Thread(target=lambda: [writer.send(("small", 1)), writer.send(bytes(300_000))])
    sender.start()  # the large one fills the pipe: it is written while being read
    received = []
    while len(received) < 2:
        received += frames.read_available()
    sender.join()
    assert received == [("small", 1), bytes(300_000)]


def test_the_long_header_of_very_large_messages_is_understood(pipe):
    reader, writer = pipe
    data = pickle.dumps("long")
    os.write(writer.fileno(), struct.pack("!i", -1) + struct.pack("!Q", len(data)) + data)
    assert FrameReader(reader.fileno()).read_available() == ["long"]


def test_the_end_of_the_pipe_is_end_of_file(pipe):
    reader, writer = pipe
    frames = FrameReader(reader.fileno())
    writer.send(7)
    writer.close()
    assert frames.read_available() == [7]
    with pytest.raises(EOFError):
        frames.read_available()
