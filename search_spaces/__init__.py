"""Declarative search spaces and the loader that turns them into Optuna define-by-run.

A space file (``search_spaces/<name>.yaml`` shipped here, or a user's path)::

    name: nccl                          # optional; defaults to the file stem
    description: NCCL transport knobs
    when: backend == nccl               # optional: the whole space is inactive otherwise
    why_inactive: "workers use {backend}: NCCL variables are inert there"   # optional
    params:
      NCCL_BUFFSIZE: {type: pow2, low: 1048576, high: 67108864, default: 4194304}
      NCCL_MIN_NCHANNELS: {type: categorical, choices: [null, 2, 4, 8], default: null}
      NCCL_MAX_NCHANNELS: {same_as: NCCL_MIN_NCHANNELS}
      NCCL_SOCKET_NTHREADS: {type: int, low: 1, high: 16, default: 1, when: num_nodes > 1}
    constraints:
      - NCCL_NSOCKS_PERTHREAD * NCCL_SOCKET_NTHREADS <= 64

Param names are TrialPlan knobs (:data:`PLAN_KNOBS`) or environment variables with an
allowed prefix (:data:`ENV_ALLOW_PREFIXES`). Every param has a ``default``: the
library's own default, so the baseline trial changes nothing. Domain types:

- ``categorical``: ``choices``; ``null`` means "leave unset" (library default). A choice
  may be ``{value: V, when: COND, why_inactive: TEXT}``: offered only where COND, over
  context values only, holds (``allreduce:nvls`` needs ``nvswitch == true``). Values NCCL
  says can corrupt data are left out unless the context has ``unsafe_nccl``.
- ``int``: ``low``, ``high``, optional ``step``.
- ``pow2``: ``low``/``high`` powers of two; Optuna samples the exponent
  (param ``log2(NAME)``), results carry the value.
- ``bool``.
- ``divisor``: ``of`` a context value (``per_worker_batch``, ...), optional ``max``;
  keeps the global batch fixed for ``accumulation_steps``.
- ``same_as: OTHER``: not sampled, copies an earlier param of the same file.

Optional per param: ``when``, ``why_inactive`` (``{context_name}`` placeholders), ``doc``.

Conditions (``when``): clauses ``name OP value`` (OP in ``== != < <= > >=``) joined by
``and``/``or``; names (or remainders: ``world_size % 4 == 0``) are context values
(:class:`SearchContext` fields, ``per_worker_batch``, ``strategy``) or params sampled
earlier; a bare word value is a string, ``null``/``true``/``false`` are literals.
Constraints: comparisons of ``+ - *`` expressions over the file's params; sampling
restricts the range of the last-declared participant (which must be ``int`` or ``pow2``),
so no sampled trial violates one. Both are parsed with ``ast`` and a whitelist, never
``eval``.

Sampling order is ``strategy`` first, then declaration order across the loaded files.
Categorical choices never change between trials (Optuna forbids it); only int/pow2
ranges narrow, which Optuna allows.

The search's Tune searcher (``orchestrator.search.tuner.GroupSearch``) asks Optuna directly
(ask/tell) and samples each trial with ``space.suggest(trial)``; the params then hold Optuna's
names too (``log2(NCCL_BUFFSIZE)``), which :meth:`SearchSpace.env_vars` and
:meth:`SearchSpace.knobs` ignore. Enqueue the baseline with
``space.optuna_params(space.baseline())``.
"""

from ._domain import Param
from ._env import (
    ENV_ALLOW_PREFIXES,
    SpaceError,
    check_env,
    check_env_var,
    check_nccl_version,
    env_strings,
    is_env_name,
)
from ._load import load_space_file, load_spaces, shipped_space_names
from ._nccl import unreducible
from ._space import SearchSpace
from ._spec import SearchContext, SpaceSpec
from .knobs import PLAN_KNOBS, lossy_knobs

__all__ = [
    "ENV_ALLOW_PREFIXES",
    "PLAN_KNOBS",
    "Param",
    "SearchContext",
    "SearchSpace",
    "SpaceError",
    "SpaceSpec",
    "check_env",
    "check_env_var",
    "check_nccl_version",
    "env_strings",
    "is_env_name",
    "load_space_file",
    "load_spaces",
    "lossy_knobs",
    "shipped_space_names",
    "unreducible",
]
