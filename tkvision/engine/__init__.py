"""The training engine: config (:mod:`.config`, sections and rules), the run's state (:mod:`.state`),
the epoch loop (:mod:`.loop`), the run (:mod:`.trainer`), evaluation (:mod:`.evaluate`), optimizer
and schedules (:mod:`.optim`), run directories (:mod:`.rundir`), processes and devices
(:mod:`.distributed`), checkpoints (:mod:`.checkpoint`, the one owner of what a run writes), sharing
(:mod:`.export`) and the pictures a run draws (:mod:`.plotting`, :mod:`.reconstruction`)."""
from .checkpoint import load_fitting_weights, model_for_checkpoint
from .config import load_config, section
from .evaluate import evaluate, evaluate_mae
from .trainer import train

__all__ = ['load_config', 'section', 'train', 'evaluate', 'evaluate_mae', 'load_fitting_weights',
           'model_for_checkpoint']
