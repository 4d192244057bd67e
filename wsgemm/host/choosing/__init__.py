"""The choosing room: which compiled kernel ``backend="auto"`` runs a problem with on Hopper.

* ``menu``: the sm90 menu of kernel configs (``MENU``, ``entry``, ``menu_variants``);
* ``table``: the table measured on a GPU and its nearest-problem lookup (``data/``);
* ``cost``: the cost model, a predicted time for every candidate (``data/cost/``);
* ``rules``: the rules, the table's correction and the model's verdict: ``choose`` and
  ``candidates``;
* ``wording``: the answer in words (``explain``, ``describe``);
* ``autotune`` and ``tuning``: ``WSGEMM_AUTOTUNE``, the tuned-choice store per GPU model and the
  timing loop (the caller passes how to launch a candidate);
* ``route_choice``: where no table measured the kernel ``auto`` runs (off Hopper), that kernel
  or torch.matmul: a default, or a race kept in the same store.

The names other rooms use are here. Importing the room imports neither torch nor the DSL: the
policy runs in processes that never load them (the timing imports torch when it times).
"""

from . import route_choice
from .autotune import (
    ENV_AUTOTUNE,
    STORE,
    AutotuneWarning,
    TunedStore,
    bucket,
    remember,
    tuned_choice,
)
from .autotune import asked as autotune_asked
from .autotune import environment as autotune_environment
from .cost import (
    GATED_SMALL_MAX_ROWS,
    GATED_SMALL_TILE,
    GatedRoads,
    cost_model_for,
    dgated_kernel_entry,
    gated_kernel_entry,
    gated_roads,
    gated_swap_tile_n,
)
from .menu import M_QUANTUM, MENU, MenuEntry, entry, m_block, menu_variants
from .route_choice import RouteDecision
from .rules import (
    ENV_BATCH_INVARIANT,
    ENV_TABLE,
    EPILOGUE_MOVE,
    Choice,
    batch_invariant_requested,
    candidates,
    choose,
    dgated_entry,
    fits,
    ranked_candidates,
    split_candidates,
    split_in_cluster,
    with_epilogue,
)
from .table import TABLE_SCHEMA, Table, load_table
from .tuning import time_cuda, tune
from .wording import describe, explain

__all__ = [
    "ENV_AUTOTUNE",
    "ENV_BATCH_INVARIANT",
    "EPILOGUE_MOVE",
    "ENV_TABLE",
    "GATED_SMALL_MAX_ROWS",
    "GATED_SMALL_TILE",
    "MENU",
    "M_QUANTUM",
    "STORE",
    "TABLE_SCHEMA",
    "AutotuneWarning",
    "Choice",
    "GatedRoads",
    "MenuEntry",
    "RouteDecision",
    "Table",
    "TunedStore",
    "autotune_asked",
    "autotune_environment",
    "batch_invariant_requested",
    "bucket",
    "candidates",
    "choose",
    "dgated_entry",
    "cost_model_for",
    "dgated_kernel_entry",
    "gated_kernel_entry",
    "gated_roads",
    "gated_swap_tile_n",
    "ranked_candidates",
    "describe",
    "entry",
    "explain",
    "fits",
    "load_table",
    "m_block",
    "menu_variants",
    "remember",
    "route_choice",
    "split_candidates",
    "split_in_cluster",
    "with_epilogue",
    "time_cuda",
    "tune",
    "tuned_choice",
]
