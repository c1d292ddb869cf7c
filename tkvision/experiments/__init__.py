"""Experiment drivers and analysis tools, apart from the library (which never imports them):
ablation sweeps (:mod:`.sweep`), the growth-chain experiment (:mod:`.growth_experiment`), the
benchmarks (:mod:`.benchmark`, :mod:`.data_benchmark`) and the mean attention distance
(:mod:`.attention_distance`). Their command lines are in :mod:`tkvision.cli`."""
