"""Every command-line entry point of tkvision, at the edge of the package (the library never imports
it): ``tools/*.py`` and the ``tkvision-*`` console scripts call these ``main`` functions.

- `train`: ``train`` (``tools/train.py``), ``validate``;
- `weights`: ``grow``, ``export``, ``mae_visualize``;
- `data`: ``make_shards``, ``make_subset``;
- `experiments`: ``benchmark``, ``sweep``.

Every tool answers a user's mistake (`tkvision.utils.errors.USER_ERRORS`, a bad argument) with one
line on stderr and exit status 2 (`run_cli`); ``--debug`` or ``TKVISION_DEBUG=1`` shows the traceback.
"""
from .common import device_name, non_negative_int, positive_int, run_cli, yaml_mapping

__all__ = ['run_cli', 'positive_int', 'non_negative_int', 'yaml_mapping', 'device_name']
