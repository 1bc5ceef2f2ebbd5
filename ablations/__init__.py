"""Training harness: Hydra-composed Lightning runs of modules.gpt.GPT, recorded in MLflow.

Entry points: ``python -m ablations.run`` (CLI), :func:`ablations.train.train` (the single code path),
``python -m ablations.generate`` (sample from a recorded run).
"""
