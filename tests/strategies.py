"""Hypothesis strategies shared by every step's tests (docs/architecture.md).

Sequence lengths always include the edges that break paged code: 0, 1, and
multiples of the block size plus or minus one. Free lists are shuffled so no
test can pass only because physical blocks come out in order.
"""

from hypothesis import strategies as st

BLOCK_SIZES = [1, 2, 4, 8, 16, 32]

block_sizes = st.sampled_from(BLOCK_SIZES)


@st.composite
def seq_lens(draw, block_size: int, max_blocks: int = 6, min_len: int = 0):
    """A length drawn from the edges (0, 1, k*B - 1, k*B, k*B + 1) or anywhere."""
    k = draw(st.integers(1, max_blocks))
    edge = [0, 1, k * block_size - 1, k * block_size, k * block_size + 1]
    n = draw(st.one_of(st.sampled_from(edge), st.integers(0, max_blocks * block_size)))
    return max(n, min_len)


@st.composite
def gqa_heads(draw):
    """(H, H_kv) with H a multiple of H_kv: MHA, GQA and MQA."""
    h_kv = draw(st.sampled_from([1, 2, 4]))
    group = draw(st.sampled_from([1, 2, 4]))
    return h_kv * group, h_kv


head_dims = st.sampled_from([8, 16, 32, 64, 128])


@st.composite
def shuffled_free_list(draw, num_blocks: int):
    """A permutation of ``range(num_blocks)``: the allocator's initial free order."""
    return draw(st.permutations(list(range(num_blocks))))


@st.composite
def length_traces(draw, max_prompt: int = 40, max_output: int = 40, max_requests: int = 12):
    """A short list of ``(prompt_len, output_len)`` pairs, both >= 1 (step01 waste)."""
    pairs = st.tuples(st.integers(1, max_prompt), st.integers(1, max_output))
    return draw(st.lists(pairs, min_size=1, max_size=max_requests))

# Head dims of real models beyond the powers of two (Phi-2 80, Qwen-1.8B 96...):
# the C++ kernel specializes each, so its tests draw them too.
model_head_dims = st.sampled_from([64, 80, 96, 128])
