"""commtune's driver side: the configuration and six commands.

Each command runs as ``python -m orchestrator.<command>``:

- ``search``: tune a real DDP/FSDP run on Ray and write the best config (``--dry-run`` ranks
  the candidates with the cost model instead);
- ``train``: train a tuned config elastically, with exact resume;
- ``probe``: sweep all-reduce, all-gather and reduce-scatter bandwidth;
- ``doctor``: diagnose a run from its files;
- ``report``: one self-contained HTML page that explains a run;
- ``submit``: run a search or training on a cluster as a Ray job, follow it, fetch its outputs.

From Python, users touch few names: ``load_config`` / ``Config`` to build a configuration.
"""

from orchestrator.config.schema import Config, ConfigError, load_config

__all__ = ["Config", "ConfigError", "load_config"]
