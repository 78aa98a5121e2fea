"""Several machines: ``torchrun`` starts the ranks, ``torch.distributed`` connects them (paper §4.6).

Two "nodes" on one machine: ``torchrun --nnodes=2 --nproc-per-node=1`` started
twice, with node ranks 0 and 1, on a free loopback port. Node 0 runs the driver
(``python -m paged.step06_tensor_parallel.torchrun_entry``: scheduler, block manager,
shard 0), node 1 a worker holding shard 1. The greedy tokens rank 0 prints must
equal a W = 1 run in this process (float64: token-identical, as in
``test_tensor_parallel.py``), and both launches must exit 0 within a bound.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paged.models import load_model
from paged.step05_preemption import PreemptingEngine, SamplingParams
from paged.step06_tensor_parallel import free_loopback_port
from tests.hf_models import build_hf_model, save_checkpoint

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
LAUNCH_TIMEOUT_S = 150  # two Python processes importing torch on a loaded 2-core machine, and the run
ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [[5, 9, 14, 3, 7], [40, 41], [100]]


def _tp1(path) -> list[list[int]]:
    engine = PreemptingEngine(load_model(path, dtype=torch.float64), block_size=4, num_blocks=64,
                              attention_backend="reference")
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[int(out.request_id)] = out.outputs[0].token_ids
    return [done[i] for i in range(len(PROMPTS))]


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun (part of torch) is not on PATH nor next to this Python")
def test_torchrun_two_nodes_on_loopback_equal_tp1(tmp_path):
    path = save_checkpoint(build_hf_model("llama"), tmp_path / "ckpt")
    port = free_loopback_port()
    launch = ["-m", "paged.step06_tensor_parallel.torchrun_entry", "--model", str(path), "--dtype", "float64",
              "--attention-backend", "reference", "--block-size", "4", "--num-blocks", "64",
              "--max-tokens", "8", "--ignore-eos"]
    prompts = [a for p in PROMPTS for a in ("--prompt-ids", " ".join(map(str, p)))]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs, logs = [], []
    for node in (0, 1):
        cmd = [TORCHRUN, "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node}",
               "--master-addr=127.0.0.1", f"--master-port={port}", *launch, *(prompts if node == 0 else [])]
        out, err = open(tmp_path / f"node{node}.out", "w+"), open(tmp_path / f"node{node}.err", "w+")
        logs.append((out, err))
        procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT, env=env, start_new_session=True))
    try:
        codes = [p.wait(timeout=LAUNCH_TIMEOUT_S) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in procs:  # whatever happened, nothing outlives the test
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    text = []
    for out, err in logs:
        out.seek(0), err.seek(0)
        text.append((out.read(), err.read()))
        out.close(), err.close()
    tails = "\n".join(f"--- node {i} stderr ---\n{e[-3000:]}" for i, (_, e) in enumerate(text))
    assert codes is not None, f"torchrun did not finish within {LAUNCH_TIMEOUT_S} s\n{tails}"
    assert codes == [0, 0], tails
    lines = [json.loads(line) for line in text[0][0].splitlines() if line.startswith("{")]
    assert [line["prompt"] for line in lines] == PROMPTS
    assert [line["token_ids"] for line in lines] == _tp1(path)


UNGUARDED = """
import torch
from paged import LLM, SamplingParams
print("main module ran", flush=True)
with LLM(model={path!r}, dtype="float64", tensor_parallel_size=2, num_blocks=32, swap_space=0,
         attention_backend="reference") as llm:
    out = llm.generate([[5, 9, 14]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    print("tokens", out[0].outputs[0].token_ids, flush=True)
"""


def test_unguarded_main_module_runs_once_with_spawned_workers(tmp_path):
    """``python -m module`` whose entry code has no ``if __name__ == "__main__":`` guard (like a server's
    ``__main__.py``): spawned workers must not run it again (it would start a second engine in each)."""
    path = save_checkpoint(build_hf_model("llama"), tmp_path / "ckpt")
    (tmp_path / "unguarded_entry.py").write_text(UNGUARDED.format(path=str(path)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    done = subprocess.run([sys.executable, "-m", "unguarded_entry"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=LAUNCH_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("main module ran") == 1, done.stdout
    assert "tokens [" in done.stdout
