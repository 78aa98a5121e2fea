"""Every tolerance the tests use, in one place (docs/architecture.md, levels of equality).

Bitwise tests use ``torch.equal`` and need no entry here. A toleranced test
names the constant it uses, and the comment says why that much reordering error
is expected.
"""

# float64 paths that reorder a softmax (online softmax, block-wise sums):
# the error is a few ulps of the largest partial sum.
FLOAT64 = dict(rtol=1e-10, atol=1e-12)

# float32 paths that reorder the arithmetic (C++ kernel, block-wise in float32).
FLOAT32 = dict(rtol=1e-5, atol=1e-5)

# Whole-model logits in float64 against Hugging Face transformers: same math,
# different operation order (fused projections, other reduction orders).
LOGITS_FLOAT64 = dict(rtol=1e-9, atol=1e-9)

# Waste shares are integer slot counts divided by one common total: their sum
# differs from 1 by float rounding of four divisions only.
SHARES_SUM = dict(rel_tol=1e-12, abs_tol=0.0)

# Synthetic length traces (20 000 requests): the mean is the paper's up to
# sampling noise (~1%) and the redraw of pairs longer than max_len, which trims
# the log-normal's tail (~2% low for ShareGPT's outputs).
TRACE_MEAN_RTOL = 0.05

# Whole-model logits in float64 against transformers as shipped: its RMSNorm
# rounds the float64 residual stream to float32 at each of the 2L + 1 norms
# (see tests/hf_models.py), a relative error of ~6e-8 each; measured ~1e-6 on
# logits of size ~5 for the tiny 2-layer models.
LOGITS_FLOAT64_VS_HF_FLOAT32_RMSNORM = dict(rtol=1e-5, atol=1e-5)

# CUDA paged attention (csrc/cuda) against the float64 oracle over the same
# rounded inputs: float32 accumulation in another order (per warp, per
# partition), expf, then one rounding of the output to the storage dtype, whose
# half-ulp is 2^-24 (float32), 2^-11 (float16), 2^-8 (bfloat16) relative.
CUDA_FLOAT32 = dict(rtol=1e-5, atol=1e-5)
CUDA_FLOAT16 = dict(rtol=2e-3, atol=2e-3)
CUDA_BFLOAT16 = dict(rtol=1.6e-2, atol=1e-2)

# C++ CPU attention kernels in float32 against the float32 oracle over long
# contexts (the prefill tests attend up to 160 keys per query, at scores of
# tens): each output sums up to n products of values up to ~4 in another order
# than SDPA, an error up to ~n * 2^-24 * 4 = 4e-5 in the worst case on top of
# the oracle's own; measured 1.2e-5 on an output of 4e-3, where FLOAT32's atol
# of 1e-5 is too tight.
CPU_ATTENTION_FLOAT32 = dict(rtol=1e-5, atol=5e-5)

# C++ CPU kernel in bfloat16 against the float32 oracle over the same bfloat16
# values: float32 accumulation (errors ~1e-6), then one round-to-nearest of the
# output to bfloat16, at most half an ulp = 2^-8 relative. Measured: 0.98 x 2^-8.
CPU_BFLOAT16 = dict(rtol=2**-8, atol=1e-5)

# Chi-square goodness of fit of the sampler's draws (fixed seeds, so the
# outcome is deterministic): the significance level a correct sampler would
# fail at with a fresh seed. 1e-3 keeps a false alarm rare if someone changes
# the seeds, while a wrong distribution (temperature ignored, top-p mass
# renormalised wrongly) drives the p-value below 1e-10 at 20 000 draws.
SAMPLER_CHI2_ALPHA = 1e-3

# The bundled demo model (tests/test_demo_model.py).
# The card's subset loss was computed in float32 on the training machine; another BLAS or
# thread count reorders the sums, which moves a mean cross-entropy by ~1e-6 nats. 1e-3
# nats is far below any real change of the weights or the data (one training step moves
# it by more) and far above reordering noise.
HELDOUT_LOSS_MARGIN = 1e-3

# Significance the parse-rate comparison must reach (one-sided Fisher exact test).
PARSE_RATE_P_MAX = 1e-3

# Fused CPU ops (csrc/cpu/fused_ops.cpp) against their eager formulas in
# bfloat16: the same float32 arithmetic except the order of RMSNorm's sum of
# squares or the exp of SiLU (each ~1e-7 relative), which can move a value
# across a bfloat16 rounding boundary: one ulp, 2^-7 relative, at most.
FUSED_BFLOAT16 = dict(rtol=2**-7, atol=1e-6)

# A whole float32 LLaMA forward pass (the tests' tiny 2-layer model), fused ops
# vs eager: float32 reorderings (~1e-7 relative per op) carried through the
# layers and the LM head; measured 5.7e-6 on logits up to 5.
FUSED_MODEL_FLOAT32 = dict(rtol=1e-5, atol=1e-5)

# Prefill attention in bfloat16 (SDPA's fused CPU kernel) against the float32
# oracle over the same bfloat16 inputs: the kernel rounds the softmax
# probabilities to bfloat16 before multiplying by V (2^-8 relative each), so an
# output of values ~1 can move by a few 1e-3. Measured: 4.5e-3.
PREFILL_BFLOAT16 = dict(rtol=1.6e-2, atol=1e-2)

# Whole-model logits in float32 against transformers in float32 (tests/models/test_families.py): the
# same math in another order (fused q/k/v and gate/up GEMMs, SDPA against eager attention), ~1e-7
# relative per operation through 2-3 layers and the LM head. Measured at most 1.4e-5 on logits up to
# 10 (Gemma 3's tiny model); a missing window, norm or soft-cap moves them by 1e-1 or more.
LOGITS_FLOAT32 = dict(rtol=1e-5, atol=5e-5)

# A tc tbf bandwidth cap measured through the link (tests/step06_tensor_parallel/test_link_faults.py):
# the bucket starts full (32 KB: 0.26 Mbit more in the first instant of a 0.5 s transfer at 10 Mbit/s,
# ~5 %), and the receiver times from its first to its last arrival, which drops one chunk's time.
TBF_RATE_RTOL = 0.10
