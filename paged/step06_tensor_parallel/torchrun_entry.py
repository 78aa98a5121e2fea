"""``python -m paged.step06_tensor_parallel.torchrun_entry``: tensor parallelism across machines, started by torchrun.

``torch.distributed`` is what takes the engine past one machine: the driver
(rank 0: scheduler, block manager, shard 0, sampling) and the workers meet at
``MASTER_ADDR:MASTER_PORT`` instead of being spawned by the driver. Start the
same command on every machine, each with its ``--node-rank``::

    # machine A: node 0 holds rank 0
    torchrun --nnodes=2 --nproc-per-node=1 --node-rank=0 --master-addr=A --master-port=29500 \\
        -m paged.step06_tensor_parallel.torchrun_entry --model /models/opt-125m --prompt "Hello" --max-tokens 32
    # machine B: node 1
    torchrun --nnodes=2 --nproc-per-node=1 --node-rank=1 --master-addr=A --master-port=29500 \\
        -m paged.step06_tensor_parallel.torchrun_entry --model /models/opt-125m

Every machine needs the checkpoint at the same path (each rank reads only its
slices of it). With ``--device cuda`` rank r uses GPU ``LOCAL_RANK`` and the
activations travel over NCCL; with ``--device cpu``, over gloo. Rank 0 prints
one JSON line per prompt (``prompt``, ``token_ids``, ``text``), then stops
every worker; a worker exits 0 after that stop and 1 after an error, which it
also leaves in the rendezvous store so that rank 0's error names its rank.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta

ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paged.step06_tensor_parallel.torchrun_entry",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint folder (the same path on every machine)")
    p.add_argument("--prompt", action="append", default=[], help="a text prompt (repeatable; rank 0 only)")
    p.add_argument("--prompt-ids", action="append", default=[],
                   help="a prompt as space-separated token ids (repeatable; rank 0 only)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16 or float64")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--attention-backend", choices=["reference", "blockwise", "cpu", "cuda"], default=None)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any one collective may wait")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    missing = [v for v in ENV if not os.environ.get(v)]
    if missing:
        sys.exit(f"error: {', '.join(missing)} not set: start this module with torchrun (see --help)")
    from paged.step06_tensor_parallel.sharded_model import DEFAULT_INIT_TIMEOUT

    timeout = timedelta(seconds=args.timeout)
    if int(os.environ["RANK"]) != 0:  # a worker: obey rank 0 until it says stop
        from paged.step06_tensor_parallel.worker_loop import torchrun_worker

        return torchrun_worker(args.model, args.dtype, args.device, timeout, DEFAULT_INIT_TIMEOUT)

    from paged.step06_tensor_parallel import LLM, SamplingParams

    prompts = list(args.prompt) + [[int(t) for t in p.split()] for p in args.prompt_ids]
    if not prompts:
        sys.exit("error: rank 0 needs at least one --prompt or --prompt-ids")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = f"cuda:{local}" if args.device == "cuda" else "cpu"
    engine_args = {"block_size": args.block_size, "num_blocks": args.num_blocks,
                   "attention_backend": args.attention_backend}
    with LLM(args.model, dtype=args.dtype, device=device, launcher="torchrun",
             tensor_parallel_size=int(os.environ["WORLD_SIZE"]), **engine_args) as llm:
        params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed,
                                ignore_eos=args.ignore_eos)
        for prompt, out in zip(prompts, llm.generate(prompts, params, use_tqdm=False)):
            done = out.outputs[0]
            print(json.dumps({"prompt": prompt, "token_ids": done.token_ids, "text": done.text}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
