"""commtune's driver side: configuration, the search CLI and its outputs.

Users touch few names: ``load_config`` / ``Config`` to build a configuration and
``python -m orchestrator.search`` to run a search.
"""

from orchestrator.config import Config, ConfigError, load_config

__all__ = ["Config", "ConfigError", "load_config"]
