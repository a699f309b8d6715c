"""The host's frame reader spilling artifact frames to files: every byte lands in its own file,
in order, whatever the read sizes, and the frames around them come through whole."""

from __future__ import annotations

import io
import os

import pytest

from execbox.sandbox.inside import protocol


@pytest.mark.parametrize("read_size", [1, 7, 4096, 1 << 20])
def test_spilled_frames_reach_their_files_whole_at_any_read_size(read_size: int) -> None:
    arts = [os.urandom(n) for n in (0, 1, 70_000, 300_001)]
    stream = (
        protocol.json_frame(protocol.RES, {"artifacts": len(arts)})
        + b"".join(protocol.frame(protocol.ART, a) for a in arts)
        + protocol.frame(protocol.ERR, b"after")
    )
    files: list[io.BytesIO] = []

    def spill(kind: bytes) -> io.BytesIO | None:
        if kind != protocol.ART:
            return None
        files.append(io.BytesIO())
        return files[-1]

    reader = protocol.FrameReader(1 << 20, spill)
    frames = []
    for at in range(0, len(stream), read_size):
        frames += reader.feed(stream[at : at + read_size])
    assert [kind for kind, _ in frames] == [protocol.RES] + [protocol.ART] * 4 + [protocol.ERR]
    assert all(payload == b"" for kind, payload in frames if kind == protocol.ART)
    assert frames[-1][1] == b"after"
    assert [f.getvalue() for f in files] == arts


def test_a_spilled_frame_over_the_cap_is_refused_before_any_byte_is_written() -> None:
    opened: list[bytes] = []
    reader = protocol.FrameReader(10, lambda kind: opened.append(kind) or io.BytesIO())
    with pytest.raises(ValueError, match="too large"):
        reader.feed(protocol.frame(protocol.ART, b"x" * 11))
    assert opened == []
