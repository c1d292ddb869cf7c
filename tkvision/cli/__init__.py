"""Every command-line entry point of tkvision, at the edge of the package (the library never imports
it): ``tools/*.py`` and the ``tkvision-*`` console scripts call these ``main`` functions.

- :mod:`.train`: ``train`` (``tools/train.py``), ``validate``;
- :mod:`.weights`: ``grow``, ``export``, ``mae_visualize``;
- :mod:`.data`: ``make_shards``, ``make_subset``;
- :mod:`.experiments`: ``benchmark``, ``sweep``, ``growth_experiment``, ``attention_distance``.

Every tool answers a user's mistake (:data:`tkvision.utils.errors.USER_ERRORS`) with one line on
stderr and exit status 2 (:func:`run_cli`); ``--debug`` shows the traceback.
"""
from .common import run_cli

__all__ = ['run_cli']
