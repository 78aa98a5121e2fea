"""Every tolerance the tests use, in one place (STYLE §4).

Bitwise tests use ``torch.equal`` and need no entry here. A toleranced test
names the constant it uses, and the comment says why that much reordering error
is expected.
"""

# float64 paths that reorder a softmax (online softmax, block-wise sums):
# the error is a few ulps of the largest partial sum.
FLOAT64 = dict(rtol=1e-10, atol=1e-12)

# float32 paths that reorder the arithmetic (C++ kernel, block-wise in float32).
FLOAT32 = dict(rtol=1e-5, atol=1e-5)

# bfloat16 inputs with float32 accumulation: compare against a float32 oracle
# over the same bfloat16 values; the output is rounded to bfloat16 once.
BFLOAT16 = dict(rtol=1.6e-2, atol=1e-2)

# Whole-model logits in float64 against Hugging Face transformers: same math,
# different operation order (fused projections, other reduction orders).
LOGITS_FLOAT64 = dict(rtol=1e-9, atol=1e-9)
