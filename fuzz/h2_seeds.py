#!/usr/bin/env python3
"""fuzz/h2_seeds.py - write the seed corpus of fuzz/fuzz_h2.c to
fuzz/corpus/h2/: a few valid HTTP/2 frame sequences (what a client sends
after its preface and SETTINGS, which the target prepends), made with
hyperframe and hpack (Debian's python3-hyperframe, python3-hpack).  Each
file's first byte is the target's mode byte (how the bytes arrive, how its
handler answers).  Run it again after changing it; the files are committed.
"""
import os
import sys

try:
    import hpack  # noqa: F401
except ImportError:
    sys.path.append("/usr/lib/python3/dist-packages")
import hpack  # noqa: E402
from hyperframe.frame import (ContinuationFrame, DataFrame, GoAwayFrame,  # noqa: E402
                              HeadersFrame, PingFrame, PriorityFrame, RstStreamFrame,
                              SettingsFrame, WindowUpdateFrame)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "h2")


def head(enc, sid, method="POST", path="/pay", extra=(), end_stream=False, end_headers=True):
    fields = [(":method", method), (":path", path), (":scheme", "http"),
              (":authority", "127.0.0.1")] + list(extra)
    f = HeadersFrame(sid, data=enc.encode(fields))
    if end_headers:
        f.flags.add("END_HEADERS")
    if end_stream:
        f.flags.add("END_STREAM")
    return f.serialize()


def data(sid, payload, end=False):
    f = DataFrame(sid, data=payload)
    if end:
        f.flags.add("END_STREAM")
    return f.serialize()


def seeds():
    out = {}
    enc = hpack.Encoder()
    out["get"] = bytes([0x00]) + head(enc, 1, "GET", "/x", end_stream=True)
    enc = hpack.Encoder()
    out["post_body"] = bytes([0x18]) + head(
        enc, 1, extra=[("idempotency-key", "k1"), ("content-length", "13")]) + \
        data(1, b'{"amount"') + data(1, b": 7}", end=True)
    enc = hpack.Encoder()
    out["interleaved"] = bytes([0x30]) + head(enc, 1, extra=[("idempotency-key", "a")]) + \
        head(enc, 3, extra=[("idempotency-key", "b")]) + data(3, b"{}", end=True) + \
        data(1, b"[1]", end=True) + head(enc, 5, "GET", "/r", end_stream=True)
    enc = hpack.Encoder()
    ack = SettingsFrame(0)
    ack.flags.add("ACK")
    out["reset_mid_body"] = bytes([0x05]) + ack.serialize() + head(enc, 1) + \
        data(1, b"half") + RstStreamFrame(1, error_code=8).serialize() + \
        head(enc, 3, "GET", "/after", end_stream=True)
    enc = hpack.Encoder()
    block = enc.encode([(":method", "GET"), (":path", "/c"), (":scheme", "http"),
                        (":authority", "h"), ("x-a", "1"), ("x-b", "2")])
    h = HeadersFrame(1, data=block[:5])
    h.flags.add("END_STREAM")
    c = ContinuationFrame(1, data=block[5:])
    c.flags.add("END_HEADERS")
    out["continuation"] = bytes([0x00]) + h.serialize() + c.serialize()
    enc = hpack.Encoder()
    out["big_answer_window"] = bytes([0x08]) + head(enc, 1, "GET", "/big", end_stream=True) + \
        WindowUpdateFrame(0, window_increment=100000).serialize() + \
        WindowUpdateFrame(1, window_increment=100000).serialize() + \
        PingFrame(0, opaque_data=b"12345678").serialize()
    enc = hpack.Encoder()
    out["priority_goaway"] = bytes([0x14]) + PriorityFrame(3, depends_on=1).serialize() + \
        head(enc, 1, "GET", "/p", end_stream=True) + \
        GoAwayFrame(0, last_stream_id=0).serialize()
    enc = hpack.Encoder()
    out["body_too_large"] = bytes([0x04]) + head(enc, 1) + data(1, b"z" * 1500) + \
        data(1, b"z" * 10, end=True)
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, b in seeds().items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(b)


if __name__ == "__main__":
    main()
