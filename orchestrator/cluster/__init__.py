"""The Ray side every command shares: start or join Ray (``session``), where a worker group's
ranks run (``placement``), the one TorchTrainer runner (``workers``) and taking back what an
ended group held (``reclaim``). Import the module you need; this face imports nothing."""
