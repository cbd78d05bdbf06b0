"""What a configuration runs and what it costs, before it runs: the ``TrialPlan`` built from a
config (``from_config``; the plan itself is ``train_fns.plan``) and the alpha-beta cost model
that prices its traffic (``costmodel``). Import the module you need; this face imports
nothing."""
