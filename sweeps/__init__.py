"""Optuna sweeps over the ablation harness.

``python -m sweeps.run sweep=<name> [sweep.n_trials=N] [hydra overrides]`` runs (or joins, or resumes) the
Optuna study described by ``conf/sweep/<name>.yaml``. Every trial is one ``ablations.train.train`` run recorded
in MLflow; see :mod:`sweeps.study` for one worker (and the module of each of its steps) and :mod:`sweeps.space`
for the search-space format.
"""
