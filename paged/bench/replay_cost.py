"""The clock of the replay: what one engine iteration costs on the paper's hardware.

``python -m paged.bench replay`` runs the real step05 scheduler, block manager
and preemption code with a stand-in model (``replay_engine``); this module
says how long each iteration would have taken on a GPU serving the paper's
model, from the iteration's ``StepPlan`` alone. It is a roofline model in the
spirit of LLM-serving simulators such as Vidur: every term is a number of
bytes moved or FLOPs computed, divided by a public peak rate.

One iteration of ``N`` tensor-parallel GPUs (each holds ``1 / N`` of the
weights and of every token's K/V) costs::

    overhead                                   host work + kernel launches
    + max(weight bytes / HBM,  2 x params x T / tensor peak)          linear layers
    + max(KV read / (HBM x attention efficiency) + KV written / HBM,
          4 x layers x hidden x attention pairs / tensor peak)         attention
    + all-reduce bytes / NVLink                                        N > 1 only
    + swapped bytes / PCIe + 2 x copied bytes / HBM                    memory operations

with every byte and FLOP count divided by ``N``. ``T`` is the iteration's
tokens; the KV read is every scheduled sequence's whole context (a sequence
reads its blocks even where they are shared with its siblings); attention
pairs count, per sequence, each new query token against the tokens up to it.

Where the numbers come from:

* **Peaks** (``GPUS``): NVIDIA's data sheets (A100: 1,555 GB/s HBM2 for the
  40 GB part, 2,039 GB/s for the 80 GB SXM part, 312 TFLOPS dense FP16 tensor
  cores, PCIe 4.0 x16 at 32 GB/s, NVLink 3 at 300 GB/s each way; H100 SXM:
  3.35 TB/s, 989 TFLOPS dense FP16, PCIe 5.0 x16 at 64 GB/s, NVLink 4 at
  450 GB/s each way; H200: 141 GB at 4.8 TB/s, H100's compute).
* **Attention efficiency**: the paper's Figure 18a measures its paged
  attention kernel at about 225 us for a batch of 32 sequences of 256 tokens
  (taken as one layer of OPT-13B, 40 heads of 128, on the A100-40GB). Those sequences' keys and
  values are 32 x 256 x 2 x 5120 x 2 bytes = 168 MB, which take 108 us at the
  HBM peak: the kernel streams K/V at ``ATTENTION_EFFICIENCY`` = 0.48 of the
  peak. That ratio is computed below from those numbers, not fitted.
* **Memory-bound decoding**: the paper's premise that a decode iteration
  is bound by memory bandwidth, not compute: OPT-13B's 25.7 GB take 16.5 ms
  at 1,555 GB/s whether the batch is 4 or 40, which the roofline reproduces.
* **Overhead**: ``HOST_S`` (scheduling, input preparation, sampling in
  Python: 2 ms) plus ``KERNELS_PER_LAYER`` (10) launches of ``LAUNCH_S`` (5 us,
  the usual CUDA launch latency) per layer: 4 ms for OPT-13B's 40 layers. These
  are assumptions, not measurements; the low-load check of
  ``python -m paged.bench replay`` compares the end-to-end result with the
  paper's lowest points.

What it leaves out: kernels below their peak other than attention (the
roofline is optimistic for the linear layers: real GEMMs reach 60-80 % of the
tensor peak), the attention kernel's dependence on block size (the paper's
Figure 18b shows blocks of 1-4 tokens slowing it: here a block size changes
only memory), the sampler's cost growing with the batch, the LM head being
computed only for sampled rows (it is counted for every token), all-reduce
latency, and the overlap of swaps with computation.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9
GIB = 2**30
DTYPE_BYTES = 2  # float16 weights and KV, as in the paper

# The paper's Figure 18a, its paged kernel: (batch, context) -> latency (s) of one attention call.
FIG18A_POINT = {"batch": 32, "context": 256, "latency_s": 225e-6}
HOST_S = 2e-3  # per iteration: scheduling, preparing inputs, sampling (assumed)
LAUNCH_S = 5e-6  # one CUDA kernel launch (assumed)
KERNELS_PER_LAYER = 10  # norms, projections, attention, MLP, residuals (assumed)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of GPU memory it may use
SWAP_SPACE_PER_GPU = 4 * GIB  # vLLM's default host swap space per GPU
MAX_NUM_BATCHED_TOKENS = 2560  # vLLM's default token budget of an iteration (OPT's 2048-token context)


@dataclass(frozen=True)
class GPU:
    """Peak rates of one accelerator (bytes, bytes/s, FLOP/s)."""

    name: str
    memory: int
    hbm: float
    tensor_flops: float
    pcie: float
    nvlink: float


GPUS = {
    "a100-40gb": GPU("NVIDIA A100 40GB", 40 * GIB, 1555 * GB, 312e12, 32 * GB, 300 * GB),
    "a100-80gb": GPU("NVIDIA A100 80GB SXM", 80 * GIB, 2039 * GB, 312e12, 32 * GB, 300 * GB),
    "h100": GPU("NVIDIA H100 SXM 80GB", 80 * GIB, 3350 * GB, 989e12, 64 * GB, 450 * GB),
    "h200": GPU("NVIDIA H200 SXM 141GB", 141 * GB, 4800 * GB, 989e12, 64 * GB, 450 * GB),
}


@dataclass(frozen=True)
class PaperModel:
    """The shape of one of the paper's models (dense multi-head attention, float16) and its server."""

    name: str
    num_layers: int
    hidden: int
    ffn: int
    vocab: int
    max_len: int
    gated_mlp: bool  # LLaMA's gate + up + down projections (three matrices instead of two)
    learned_positions: bool  # OPT's position embedding table
    tied_head: bool  # the LM head reuses the token embedding
    gpu: str  # the paper's server (Table 1)
    num_gpus: int

    @property
    def params(self) -> int:
        h = self.hidden
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn
        embed = self.vocab * h * (1 if self.tied_head else 2) + (self.max_len * h if self.learned_positions else 0)
        return self.num_layers * (4 * h * h + mlp) + embed

    @property
    def weight_bytes(self) -> int:
        return self.params * DTYPE_BYTES

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token in every layer (all heads, all GPUs together)."""
        return 2 * self.num_layers * self.hidden * DTYPE_BYTES


MODELS = {
    "opt-13b": PaperModel("OPT-13B", 40, 5120, 20480, 50272, 2048, False, True, True, "a100-40gb", 1),
    "opt-66b": PaperModel("OPT-66B", 64, 9216, 36864, 50272, 2048, False, True, True, "a100-40gb", 4),
    "opt-175b": PaperModel("OPT-175B", 96, 12288, 49152, 50272, 2048, False, True, True, "a100-80gb", 8),
    "llama-13b": PaperModel("LLaMA-13B", 40, 5120, 13824, 32000, 2048, True, False, False, "a100-40gb", 1),
}


def attention_efficiency(gpu: GPU) -> float:
    """Share of the HBM peak the paged attention kernel streams K/V at, from Figure 18a (OPT-13B)."""
    opt = MODELS["opt-13b"]
    p = FIG18A_POINT
    kv = p["batch"] * p["context"] * 2 * opt.hidden * DTYPE_BYTES  # one layer's keys and values
    return kv / (p["latency_s"] * GPUS["a100-40gb"].hbm)


ATTENTION_EFFICIENCY = attention_efficiency(GPUS["a100-40gb"])  # the same kernel on every GPU (assumed)


def attention_pairs(query_len: int, context_len: int) -> int:
    """(query, key) pairs of a causal chunk: ``query_len`` new tokens ending at ``context_len``."""
    first = context_len - query_len + 1  # keys seen by the chunk's first new token
    return query_len * first + query_len * (query_len - 1) // 2


@dataclass(frozen=True)
class CostModel:
    """Seconds per iteration of ``model`` on ``num_gpus`` GPUs of type ``gpu`` (module docstring).

    Args:
        model, gpu: entries of ``MODELS`` and ``GPUS``.
        num_gpus: tensor-parallel degree (the model's paper setting by default).
        block_size: tokens per KV block: bytes of a swapped or copied block.
    """

    model: PaperModel
    gpu: GPU
    num_gpus: int
    block_size: int

    @classmethod
    def build(cls, model: str, gpu: str | None = None, num_gpus: int | None = None, block_size: int = 16):
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; choose one of {sorted(MODELS)}")
        m = MODELS[model]
        gpu = gpu or m.gpu
        if gpu not in GPUS:
            raise ValueError(f"unknown gpu {gpu!r}; choose one of {sorted(GPUS)}")
        n = num_gpus or m.num_gpus
        if n < 1 or block_size < 1:
            raise ValueError(f"num_gpus and block_size must be >= 1, got {n} and {block_size}")
        return cls(m, GPUS[gpu], n, block_size)

    # -- memory ------------------------------------------------------------------
    def activation_bytes(self, tokens: int = MAX_NUM_BATCHED_TOKENS) -> int:
        """Peak activations of the largest iteration, all GPUs: per token the QKV and attention
        output (4 x hidden) and the MLP's inner width (twice: before and after the activation)."""
        return tokens * (4 * self.model.hidden + 2 * self.model.ffn) * DTYPE_BYTES

    def kv_cache_bytes(self) -> int:
        """What the GPUs leave for K/V: their usable share minus weights and activations."""
        usable = GPU_MEMORY_UTILIZATION * self.gpu.memory * self.num_gpus
        left = int(usable - self.model.weight_bytes - self.activation_bytes())
        if left <= 0:
            raise ValueError(f"{self.model.name} ({self.model.weight_bytes / GB:.1f} GB of weights) does not fit "
                             f"on {self.num_gpus} x {self.gpu.name}: use more GPUs")
        return left

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.model.kv_bytes_per_token

    def num_blocks(self) -> int:
        """KV blocks of ``block_size`` tokens the model leaves on the GPUs."""
        return self.kv_cache_bytes() // self.block_bytes

    def num_swap_blocks(self) -> int:
        """Host blocks of vLLM's default swap space (4 GiB per GPU)."""
        return SWAP_SPACE_PER_GPU * self.num_gpus // self.block_bytes

    # -- time ----------------------------------------------------------------------
    def overhead(self) -> float:
        return HOST_S + self.model.num_layers * KERNELS_PER_LAYER * LAUNCH_S

    def iteration_time(self, query_lens: list[int], context_lens: list[int], swapped_blocks: int = 0,
                       copied_blocks: int = 0) -> float:
        """Seconds of one iteration computing ``query_lens[s]`` new tokens of sequence ``s`` over its
        ``context_lens[s]`` tokens, after moving ``swapped_blocks`` over PCIe and copying
        ``copied_blocks`` in HBM; 0 for an iteration with nothing to do."""
        m, g, n = self.model, self.gpu, self.num_gpus
        moved = (swapped_blocks * self.block_bytes / g.pcie
                 + 2 * copied_blocks * self.block_bytes / g.hbm) / n
        tokens = sum(query_lens)
        if not tokens:
            return moved
        linear = max(m.weight_bytes / g.hbm, 2 * m.params * tokens / g.tensor_flops) / n
        kv_read = sum(context_lens) * m.kv_bytes_per_token
        kv_written = tokens * m.kv_bytes_per_token
        pairs = sum(attention_pairs(q, c) for q, c in zip(query_lens, context_lens))
        attention = max(kv_read / (g.hbm * ATTENTION_EFFICIENCY) + kv_written / g.hbm,
                        4 * m.num_layers * m.hidden * pairs / g.tensor_flops) / n
        # two all-reduces per layer of the iteration's activations (ring: 2 (N-1)/N of them per GPU)
        reduce = 2 * m.num_layers * 2 * (n - 1) / n * tokens * m.hidden * DTYPE_BYTES / g.nvlink
        return self.overhead() + linear + attention + reduce + moved

    def plan_time(self, plan) -> float:
        """``iteration_time`` of a ``StepPlan``."""
        swapped = len(plan.blocks_to_swap_in) + len(plan.blocks_to_swap_out)
        return self.iteration_time(plan.query_lens, plan.context_lens, swapped, len(plan.blocks_to_copy))

    def describe(self) -> str:
        m, g = self.model, self.gpu
        return (f"{m.name} ({m.params / 1e9:.2f}B params, {m.weight_bytes / GB:.1f} GB fp16) on {self.num_gpus} x "
                f"{g.name} ({g.hbm / GB:,.0f} GB/s, {g.tensor_flops / 1e12:.0f} TFLOPS): KV "
                f"{self.kv_cache_bytes() / GB:.1f} GB = {self.num_blocks()} blocks of {self.block_size} tokens "
                f"({m.kv_bytes_per_token // 1024} KiB/token); swap {self.num_swap_blocks()} host blocks; "
                f"overhead {self.overhead() * 1e3:.1f} ms/iteration, attention at {ATTENTION_EFFICIENCY:.2f} "
                f"of HBM peak")
