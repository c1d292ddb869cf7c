"""The training engine: config (`config`, sections and rules), the run's state (`state`),
the epoch loop (`loop`), the run (`trainer`), evaluation (`evaluate`), optimizer
and schedules (`optim`), run directories (`rundir`), processes and devices
(`distributed`), checkpoints (`checkpoint`, the one owner of what a run writes), sharing
(`export`) and the pictures a run draws (`plotting`, `reconstruction`)."""
from .checkpoint import load_fitting_weights, model_for_checkpoint
from .config import load_config, section
from .evaluate import evaluate, evaluate_mae
from .trainer import train

__all__ = ['load_config', 'section', 'train', 'evaluate', 'evaluate_mae', 'load_fitting_weights',
           'model_for_checkpoint']
