"""Whole messages out of a non-blocking pipe that a multiprocessing Connection writes to.

An event loop reads the engine's outputs when the pipe is readable; a large message can be half
there when it does. Reading with `Connection.recv` would then block the loop (blocking pipe) or
raise halfway through a message (non-blocking, which some event loops, uvloop among them, make
every fd they watch). So the loop reads whatever bytes are there and this buffer cuts them into
the messages `Connection.send` framed: a 4-byte big-endian length, or -1 and an 8-byte length
for messages of 2 GiB and more, then the pickle.
"""

from __future__ import annotations

import os
import pickle
import struct

_SHORT = struct.Struct("!i")
_LONG = struct.Struct("!Q")
READ_BYTES = 1 << 20  # the most one readable event takes from the pipe


class FrameReader:
    """Reads a non-blocking pipe's bytes as they come and returns the messages they complete."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    def read_available(self) -> list:
        """The messages completed by what the pipe holds now (maybe none); EOFError once the writer has closed it."""
        try:
            data = os.read(self.fd, READ_BYTES)
        except BlockingIOError:  # a spurious wake-up: nothing there after all
            return []
        if not data:
            raise EOFError("the pipe's writer closed it")
        self._buffer += data
        return [pickle.loads(frame) for frame in self._frames()]

    def _frames(self) -> list[bytes]:
        frames = []
        buffer = self._buffer
        while len(buffer) >= _SHORT.size:
            (size,) = _SHORT.unpack_from(buffer)
            header = _SHORT.size
            if size == -1:
                if len(buffer) < _SHORT.size + _LONG.size:
                    break
                (size,) = _LONG.unpack_from(buffer, _SHORT.size)
                header += _LONG.size
            if len(buffer) < header + size:
                break
            frames.append(bytes(buffer[header : header + size]))
            del buffer[: header + size]
        return frames
