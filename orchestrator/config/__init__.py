"""What a user hands commtune, read and checked once, before Ray starts: the config's schema
and presets (``schema``), every input check (``inputs``, ``bounds``, ``model_overrides``,
``address``, ``storage_url``), where the Optuna study lives (``study_storage``) and best.yaml's
entry per world size (``size_entries``). A mistake is a ``ConfigError`` naming the key and the
fix. Import the module you need; this face imports nothing."""
