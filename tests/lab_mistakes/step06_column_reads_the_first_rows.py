"""Lab 06 with one mistake: every rank reads the first ``n / W`` rows of a part, not its own."""

from paged.step06_tensor_parallel.sharding import row_reads  # noqa: F401


def column_reads(parts, rank, world_size):
    w = world_size
    return [(ck, row // w, n // w, (slice(0, n // w),)) for ck, row, n in parts]  # the mistake: rank ignored
