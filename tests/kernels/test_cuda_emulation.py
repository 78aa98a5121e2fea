"""The CUDA device emulation itself (``csrc/cuda/emulation``): what a kernel relies on.

The probe kernels of ``cuda_emulation_probes.cpp`` are compiled here with the
host compiler against the emulation header and its runtime (no torch, a few
seconds) and called through ctypes:

* barriers order shared-memory writes before reads, per thread block, also when
  thread blocks run on several CPU threads;
* a barrier that some threads never reach, a shuffle missing a lane, and lanes
  that disagree on the warp operation fail the launch with a message naming the
  threads: nothing hangs (each probe runs under a timeout);
* ``__shfl_xor_sync`` / ``__shfl_sync`` follow CUDA's lane and width rules;
* the half and bfloat16 conversions equal torch's bit for bit (all 65536 inputs
  one way; ties, subnormals, overflow and specials the other way).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.step03, pytest.mark.emulated, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
CXX = os.environ.get("CXX", "c++")


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    if shutil.which(CXX) is None:
        pytest.skip(f"no C++ compiler ({CXX!r} is not on PATH): the CUDA device emulation cannot be built")
    lib = tmp_path_factory.mktemp("emulation") / "probes.so"
    cmd = [CXX, "-O1", "-std=c++17", "-shared", "-fPIC", "-pthread", "-DPAGED_CUDA_EMULATION",
           "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas", f"-I{ROOT / 'csrc' / 'cuda'}",
           str(Path(__file__).with_name("cuda_emulation_probes.cpp")),
           str(ROOT / "csrc" / "cuda" / "emulation" / "runtime.cpp"), "-o", str(lib)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return ctypes.CDLL(str(lib))


def _ptr(t: torch.Tensor):
    return ctypes.c_void_p(t.data_ptr())


def _message(fn, *args) -> tuple[int, str]:
    buf = ctypes.create_string_buffer(1024)
    err = fn(*args, buf, len(buf))
    return err, buf.value.decode()


LAUNCH_FAILURE = 719  # cudaErrorLaunchFailure


@pytest.mark.parametrize("threads", ["1", "2"])
def test_emulation_barrier_orders_shared_memory_per_block(probes, monkeypatch, threads):
    """Every thread reads its neighbour's write after __syncthreads, in each of 6 blocks
    of 96 threads (3 warps), run on 1 or 2 CPU threads: exact integers."""
    monkeypatch.setenv("PAGED_EMULATION_THREADS", threads)
    out = torch.full((6 * 96,), -1, dtype=torch.int32)
    assert probes.probe_neighbours(_ptr(out), 6, 96) == 0
    t = torch.arange(96)
    want = torch.cat([(t + 1) % 96 + 1000 * b for b in range(6)]).int()
    assert torch.equal(out, want)


def test_emulation_divergent_barrier_fails_instead_of_hanging(probes):
    """Threads 40-63 exit while 0-39 wait at __syncthreads: a launch failure naming both."""
    err, msg = _message(probes.probe_divergent_barrier, 64, 40)
    assert err == LAUNCH_FAILURE
    assert "deadlock" in msg and "threads 0-39 wait at __syncthreads" in msg and "threads 40-63 have exited" in msg
    err, msg = _message(probes.probe_divergent_barrier, 64, 64)  # nobody exits: fine
    assert err == 0, msg


def test_emulation_shuffle_missing_lane_fails(probes):
    """Lane 5 exits before a full-mask shuffle: the other 31 lanes are reported waiting for it."""
    err, msg = _message(probes.probe_missing_lane, 5)
    assert err == LAUNCH_FAILURE
    assert "warp 0 lanes 0-4, 6-31 wait at __shfl_xor_sync for lanes 5" in msg


def test_emulation_lanes_disagreeing_on_the_operation_fail(probes):
    err, msg = _message(probes.probe_mismatched_ops)
    assert err == LAUNCH_FAILURE
    assert "__syncwarp" in msg and "__shfl_sync" in msg


def _cuda_xor_source(lane: int, lane_mask: int, width: int) -> int:
    """CUDA's rule: lane ^ laneMask, unless that lies in a later segment of `width` lanes."""
    src = lane ^ lane_mask
    return lane if src >= (lane // width + 1) * width else src


@pytest.mark.parametrize("width", [1, 2, 4, 8, 16, 32])
def test_emulation_shfl_xor_follows_cuda_lane_rules(probes, width):
    """Every lane mask 0-31 at every width: each lane gets the source lane CUDA documents."""
    out = torch.empty(32, dtype=torch.int32)
    for lane_mask in range(32):
        assert probes.probe_shfl_xor(_ptr(out), lane_mask, width) == 0
        assert out.tolist() == [_cuda_xor_source(lane, lane_mask, width) for lane in range(32)], (lane_mask, width)
    probes.probe_shfl_xor(_ptr(out), 1, 32)
    assert out.tolist()[:4] == [1, 0, 3, 2]  # the butterfly, by hand


@pytest.mark.parametrize("width", [1, 2, 4, 8, 16, 32])
def test_emulation_shfl_follows_cuda_lane_rules(probes, width):
    """Source lanes 0-40: within each segment of `width` lanes, srcLane modulo width."""
    out = torch.empty(32, dtype=torch.int32)
    for src in range(41):
        assert probes.probe_shfl(_ptr(out), src, width) == 0
        assert out.tolist() == [lane // width * width + src % width for lane in range(32)], (src, width)
    probes.probe_shfl(_ptr(out), 3, 32)
    assert out.tolist() == [3] * 32  # a broadcast, by hand


def _float_inputs() -> torch.Tensor:
    """Every half and bfloat16 value, the midpoints between neighbours (ties to even)
    and their float neighbours, random floats across all exponents, and specials."""
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = [every.view(torch.float16).float(), every.view(torch.bfloat16).float()]
    for v in list(values):
        v = v[torch.isfinite(v)].sort().values.double()
        mid = ((v[1:] + v[:-1]) / 2).float()
        values += [mid, torch.nextafter(mid, torch.tensor(float("inf"))), torch.nextafter(mid, torch.tensor(0.0))]
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (200_000,), generator=gen, dtype=torch.int64).to(torch.int32)
    values.append(bits.view(torch.float32))
    values.append(torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 65504.0, 65519.99, 65520.0,
                                2.0**-24, 2.0**-25, 2.0**-25 * 1.0001, 1e-45, 3.0e38]))  # fmt: skip
    return torch.cat(values).contiguous()


@pytest.mark.parametrize("kind", ["half", "bfloat16"])
def test_emulation_conversions_bitwise_equal_torch(probes, kind):
    """float -> 16 bits (round to nearest even) and all 65536 patterns -> float, equal to
    torch's conversions bit for bit (any NaN for NaN: payloads are not specified)."""
    dtype = torch.float16 if kind == "half" else torch.bfloat16
    to16, to32 = (probes.float_to_half, probes.half_to_float) if kind == "half" else \
        (probes.float_to_bfloat16, probes.bfloat16_to_float)  # fmt: skip
    x = _float_inputs()
    got = torch.empty(x.numel(), dtype=torch.int16)
    to16(_ptr(x), _ptr(got), x.numel())
    want = x.to(dtype).view(torch.int16)
    nan = torch.isnan(x)
    assert torch.equal(got[~nan], want[~nan])
    assert torch.isnan(got[nan].view(dtype)).all()
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).contiguous()
    back = torch.empty(every.numel(), dtype=torch.float32)
    to32(_ptr(every), _ptr(back), every.numel())
    assert torch.equal(back.view(torch.int32), every.view(dtype).float().view(torch.int32))
