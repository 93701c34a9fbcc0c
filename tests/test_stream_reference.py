"""The small suite's stream references: the read kernel folds what it reads (interpreter
on CPU, or the GPU), the copy copies, bad sizes are refused."""
import pytest
import torch

from tilesparse.bench import stream_reference
from tilesparse.bench._stream_read import stream_read


@pytest.mark.parametrize("n", [1, 5, stream_reference.READ_BLOCK, 2 * stream_reference.READ_BLOCK + 3])
def test_stream_read_stores_each_programs_xor(n):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    block = stream_reference.READ_BLOCK
    src = torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device=device)
    programs = -(-n // block)
    sink = torch.full((programs,), 12345, dtype=torch.int32, device=device)  # poison
    stream_read[(programs,)](src, sink, n, BLOCK=block)
    padded = torch.zeros(programs * block, dtype=torch.int32, device=device)
    padded[:n] = src
    expected = torch.zeros(programs, dtype=torch.int32, device=device)
    for i in range(block):
        expected ^= padded.view(programs, block)[:, i]
    assert torch.equal(sink, expected)


def test_copy_call_moves_half_the_traffic():
    out = stream_reference.copy_call(8000, "cpu")()
    assert out.dtype == torch.int32 and out.numel() == 1000
    assert torch.equal(out, torch.arange(1000, dtype=torch.int32))  # every word moved


def test_read_call_on_cpu_reads_every_word():
    assert int(stream_reference.read_call(4000, "cpu")()) == sum(range(1000))


@pytest.mark.gpu
@pytest.mark.parametrize("nbytes", [4, 4 * stream_reference.READ_BLOCK * 3 + 12])
def test_read_call_on_the_gpu_folds_every_word(nbytes):
    block = stream_reference.READ_BLOCK
    words = nbytes // 4
    sink = stream_reference.read_call(nbytes, "cuda")().cpu()
    padded = torch.zeros(-(-words // block) * block, dtype=torch.int32)
    padded[:words] = torch.arange(words, dtype=torch.int32)
    expected = torch.zeros(len(sink), dtype=torch.int32)
    for i in range(block):
        expected ^= padded.view(-1, block)[:, i]
    assert torch.equal(sink, expected)


@pytest.mark.gpu
def test_copy_call_on_the_gpu_copies_every_word():
    out = stream_reference.copy_call(1 << 20, "cuda")()
    assert torch.equal(out.cpu(), torch.arange(1 << 17, dtype=torch.int32))


@pytest.mark.parametrize("nbytes", [0, -4])
def test_bad_sizes_are_refused(nbytes):
    with pytest.raises(ValueError, match="nbytes"):
        stream_reference.copy_call(nbytes, "cpu")
    with pytest.raises(ValueError, match="nbytes"):
        stream_reference.read_call(nbytes, "cpu")
