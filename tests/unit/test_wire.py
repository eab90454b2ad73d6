"""The engine worker's pipe format: safetensors payloads streamed in, read back as views of one buffer."""
from __future__ import annotations

import io
import os
import socket
import threading

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from pipeline.core.stfile import tensors_from_buffer
from pipeline.engines.process import wire


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "hs/0": torch.randn(37, 3, 16, generator=g).to(torch.bfloat16),  # an odd byte count before the int64s
        "ids/0": torch.randint(0, 1 << 40, (37,), generator=g),
        "mask/0": torch.randint(0, 2, (37,), generator=g, dtype=torch.uint8),
        "hs/1": torch.randn(5, 3, 16, generator=g)[:, ::2],  # not contiguous: sent as its contiguous copy
        "flags": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 3, 16, dtype=torch.bfloat16),
        "f8": torch.randn(7, generator=g).to(torch.float8_e4m3fn),
    }


def _through_a_pipe(header, tensors, shared=False):
    """One message through a pipe; `shared`: with the side socket the engine worker has (large payloads in a memfd)."""
    r, w = os.pipe()
    mine, theirs = socket.socketpair() if shared else (None, None)
    with os.fdopen(r, "rb") as rx, os.fdopen(w, "wb") as tx:
        sender = threading.Thread(target=wire.send, args=(tx, header, tensors, theirs))  # a pipe holds 64 KiB
        sender.start()
        got = wire.recv(rx, mine)
        sender.join()
    for s in (mine, theirs):
        if s is not None:
            s.close()
    return got


def test_a_message_arrives_whole_and_every_tensor_is_aligned():
    sent = _tensors()
    header, got = _through_a_pipe({"op": "capture", "sample_ids": ["a", "b"]}, sent)
    assert header == {"op": "capture", "sample_ids": ["a", "b"]}
    assert set(got) == set(sent)
    for name, t in sent.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name].view(torch.uint8), t.contiguous().view(torch.uint8)), name
        assert got[name].data_ptr() % t.element_size() == 0, f"{name} is not on its natural alignment"
    # views of one buffer: no per-tensor copy on the receiving side
    ptrs = sorted(t.data_ptr() for t in got.values() if t.numel())
    assert ptrs[-1] - ptrs[0] < sum(t.numel() * t.element_size() for t in sent.values())


def test_a_large_payload_crosses_in_shared_memory_and_small_ones_through_the_pipe():
    g = torch.Generator().manual_seed(1)
    big = {"hs/0": torch.randn(600, 5, 256, generator=g).to(torch.bfloat16), "ids/0": torch.arange(600)}
    assert sum(t.numel() * t.element_size() for t in big.values()) >= wire.SHARED_MIN_BYTES
    header, got = _through_a_pipe({"op": "capture"}, big, shared=True)
    assert header == {"op": "capture"}
    for name, t in big.items():
        assert torch.equal(got[name], t), name
        assert got[name].data_ptr() % t.element_size() == 0, name
    # the tensors are views of the mapped memfd, which outlives the channel: they stay readable and writable
    got["hs/0"][0, 0, 0] = 7.0
    assert float(got["hs/0"][0, 0, 0]) == 7.0
    small = {"ids/0": torch.arange(10)}
    assert torch.equal(_through_a_pipe({"op": "x"}, small, shared=True)[1]["ids/0"], small["ids/0"])


def test_a_shared_payload_without_its_descriptor_is_refused():
    buf = io.BytesIO()
    mine, theirs = socket.socketpair()
    wire.send(buf, {"op": "x"}, {"hs": torch.zeros(1 << 20)}, theirs)
    theirs.close()
    with pytest.raises(ValueError, match="without a side socket"):
        wire.recv(io.BufferedReader(io.BytesIO(buf.getvalue())))
    mine.close()


def test_a_message_without_tensors():
    assert _through_a_pipe({"op": "close"}, None) == ({"op": "close"}, {})


def test_the_payload_is_plain_safetensors_both_ways():
    sent = {k: v for k, v in _tensors().items() if k != "f8"}
    buf = io.BytesIO()
    wire.send(buf, {"op": "x"}, sent)
    raw = buf.getvalue()
    head_len, payload_len, where = wire._PREFIX.unpack(raw[:wire._PREFIX.size])
    assert where == wire.INLINE
    payload = raw[wire._PREFIX.size + head_len:]
    assert len(payload) == payload_len
    for name, t in st_load(payload).items():  # the real library reads what the sender streamed
        assert torch.equal(t, sent[name].contiguous()), name
    for name, t in tensors_from_buffer(bytearray(st_save({k: v.contiguous() for k, v in sent.items()}))).items():
        assert torch.equal(t, sent[name].contiguous()), name  # and the receiver reads the library's images


@pytest.mark.parametrize("damage, said", [
    (lambda b: b[:5], "too short for a header"),
    (lambda b: (10**9).to_bytes(8, "little") + b[8:], "header length 1000000000 exceeds the image"),
    (lambda b: b[:-4], "do not hold shape"),
    (lambda b: b.replace(b'"BF16"', b'"Q4_K"'), "dtype 'Q4_K' is not one of"),
])
def test_a_damaged_payload_is_refused_by_name(damage, said):
    image = st_save({"hs": torch.zeros(4, 2, dtype=torch.bfloat16)})
    with pytest.raises(ValueError, match=said):
        tensors_from_buffer(bytearray(damage(image)))


def test_a_sender_that_dies_mid_message_is_reported():
    buf = io.BytesIO()
    wire.send(buf, {"op": "x"}, {"hs": torch.zeros(100)})
    with pytest.raises(wire.WorkerGone, match="pipe closed after"):
        wire.recv(io.BufferedReader(io.BytesIO(buf.getvalue()[:-10])))
