"""The engine of step04: sequence groups that share blocks (paper §4.4).

One request may now own several sequences:

* **Parallel sampling** (``n``, ``best_of``): the prompt is computed once by
  the first sequence; the others are forks of it, mapping the same prompt
  blocks. Each sample draws from its own generator, seeded by
  ``sample_seed(request seed, i)``, so sample ``i`` equals an independent
  ``n=1`` run with that seed. With ``best_of > n`` the ``n`` samples with the
  highest cumulative log-probability are returned.
* **Beam search** (``use_beam_search``, width ``best_of``): see ``beam.py``;
  surviving candidates fork, dropped ones are freed.
* **Prefix caching**: a prompt's cached full blocks are mapped, not computed.

Copy-on-write pairs gathered from every table while planning go into the
plan's ``blocks_to_copy``. Greedy, sampled and beam requests share one batch.

Extends: ``paged.step03_attention.Engine`` with this step's scheduler (step03's
loop over a ``SharingKVManager`` with ``SequenceGroups`` decoding:
``scheduler.py``) and runner (``SharingModelRunner``: block copies, fan-out).
"""

from __future__ import annotations

from paged.step03_attention import Engine
from paged.errors import RequestError
from paged.step04_sharing import snapshot
from paged.step04_sharing.runner import SharingModelRunner
from paged.step04_sharing.scheduler import build_scheduler
from paged.step04_sharing.snapshot_html import snapshot_html

MAX_BEST_OF = 64  # most sequences in one group (n, best_of, beam width)


class SharingEngine(Engine):
    """``Engine`` over a ``SharingKVManager``: forks, copy-on-write, beam search, prefix caching.

    Args:
        enable_prefix_caching: reuse cached full prompt blocks (default on).
        **kwargs (object): as ``paged.step03_attention.Engine``.
    """

    runner_class = SharingModelRunner

    def __init__(self, model, *, enable_prefix_caching: bool = True, **kwargs) -> None:
        self.enable_prefix_caching = enable_prefix_caching
        super().__init__(model, **kwargs)

    def _make_scheduler(self, num_blocks: int, free_order):
        return build_scheduler(num_blocks, self.block_size, enable_prefix_caching=self.enable_prefix_caching,
                               free_order=free_order, **self._scheduler_args())

    def _batch_invariant(self, requested: bool | None) -> bool:
        """With the prefix cache on, per-token attention unless asked otherwise: a prompt
        served from the cache computes only its tail, and must get the bits a whole
        prefill gets (docs/step04_sharing.md, what "transparent" means in bfloat16)."""
        return self.enable_prefix_caching if requested is None else requested

    def kv_snapshot(self, max_cells: int = snapshot.DEFAULT_MAX_CELLS) -> dict:
        """The KV cache as plain data: pools, owners, queues, tables (``snapshot.take_snapshot``)."""
        return snapshot.take_snapshot(self, max_cells)

    def _repr_html_(self) -> str:
        """Jupyter shows an engine as the picture of its KV cache (``snapshot_html``)."""
        return snapshot_html(self.kv_snapshot())

    # -- requests -------------------------------------------------------------
    def _check_group(self, params) -> None:
        """Groups are allowed: up to ``MAX_BEST_OF`` sequences, and no more than one iteration
        runs (``max_num_seqs``: a group runs whole); beams are deterministic."""
        bound = min(MAX_BEST_OF, self.max_num_seqs)
        if params.best_of > bound:
            why = "" if bound == MAX_BEST_OF else " (max_num_seqs: a group runs whole in one iteration)"
            field = "n" if params.n > bound else "best_of"  # the one the request set past the bound
            raise RequestError(f"{field} must be <= {bound}{why}, got {getattr(params, field)}",
                               param=field, bound=bound)
        if params.use_beam_search and params.temperature != 0:
            raise RequestError("beam search is deterministic: set temperature=0 "
                               f"(got {params.temperature})", param="temperature", bound=0)
