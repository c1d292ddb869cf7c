"""A run's evaluation after an epoch: the validation split (model and EMA), the best weights kept, the elastic
prefixes, and once, after the last epoch, the test split and the task's report of it.

[`RunEvaluator`][tkvision.engine.run_eval.RunEvaluator] is the stage the trainer builds from the parts it reads
(the data, the task, the device and precision, the run's folder); its `epoch` returns the row's evaluation columns.
What is measured and which columns it makes is the task's (``tkvision.engine.tasks.Task``: ``evaluate``,
``columns``, ``score``, ``test_columns``, ``report``), on the run's device, preprocessing and precision (`net`).
"""
import os
from typing import Any, Callable, Dict, Iterable, Optional

import torch

from ..data import dataset_classes
from .checkpoint import keep_best, model_for_checkpoint
from .distributed import Processes
from .loss import TrainTask
from .run_data import RunData
from .state import TrainState
from .tasks import EvalContext

__all__ = ['RunEvaluator']


class RunEvaluator:
    """The evaluation of a run (module docstring).

    Args:
        data: the run's loaders and preprocessing.
        task: the training step (its task: what it evaluates; and the elastic prefixes to report).
        processes: this process among the job's: its device, its precision (the plan's ``autocast_dtype``) and
            whether it is rank 0 (it writes ``best.safetensors`` and the task's report).
        seed: the run's seed (an MAE's fixed evaluation masks).
        model_name: the model's registry name (the best weights' metadata).
        best_path: the run's ``best.safetensors`` (written by rank 0, read by every rank at the end).
        path: the run log's path of a file of the run's folder (``tkvision.engine.runlog.RunLog.path``), where the
            task's report of the final evaluation goes.
    """

    def __init__(
            self,
            data: RunData,
            task: TrainTask,
            processes: Processes,
            seed: int,
            model_name: str,
            best_path: str,
            path: Optional[Callable[[str], str]] = None,
    ):
        self.data, self.step, self.task = data, task, task.task
        self.seed, self.model_name, self.best_path, self.path = seed, model_name, best_path, path
        self.main = processes.main
        self.context = EvalContext(processes.device, data.preprocess, processes.plan.autocast_dtype, seed)
        self.device = processes.device

    def epoch(
            self,
            state: TrainState,
            epoch: int,
            last_epoch: bool,
    ) -> dict:
        """The evaluation columns of epoch ``epoch``'s row: the model (and the EMA model) on the validation split
        (the task's ``columns``), ``best.safetensors`` saved when either beats the best
        (``tkvision.engine.checkpoint.keep_best`` by the task's ``best`` and ``score``), `prefixes` on the
        validation split, and after the last epoch (``last_epoch``) `test` and the task's report.

        Returns:
            the columns (a classifier's ``top1, top5, val_loss, val_skipped[, ema_top1, ema_top5]``, a masked
            autoencoder's ``val_loss, val_skipped[, ema_val_loss]``), with the prefixes' and the test split's.
        """
        loader = self.data.val_loader
        models = [('model', state.net, state.model)] + ([('ema', state.ema.module, state.ema.module)]
                                                          if state.ema else [])
        results = {source: self.net(net, loader) for source, net, _ in models}
        metric, mode = self.task.best
        candidates = [(source, self.task.score(results[source]), model) for source, _, model in models]
        metadata = dict(model=self.model_name, epoch=epoch, task=self.task.name)
        state.best = keep_best(state.best, candidates, metric, mode, self.best_path if self.main else None, metadata)
        row = self.task.columns(results['model'])
        if 'ema' in results:
            row.update(self.task.columns(results['ema'], 'ema'))
        row.update(self.prefixes(state, loader))
        if last_epoch:
            test, final = self.test(state, epoch)
            row.update(test)
            self.report(final or results['model'], 'test' if final else 'validation')
        return row

    def net(
            self,
            net: torch.nn.Module,
            loader: Iterable,
    ) -> Dict[str, Any]:
        """The task's evaluation of ``net`` on ``loader`` with the run's device, preprocessing, precision and seed."""
        return self.task.evaluate(net, loader, self.context)

    def prefixes(
            self,
            state: TrainState,
            loader: Iterable,
            split: str = '',
    ) -> dict:
        """An elastic run's model at each of its ``elastic_fractions`` below 1 on ``loader`` (``TrainTask.prefix``):
        the task's prefix columns (``{'top1@0.25': ...}``, a masked autoencoder's ``{'val_loss@0.25': ...}``), keys
        prefixed by ``split`` (``'test_'``); ``{}`` for a run that is not elastic."""
        out = {}
        for fraction in self.step.eval_fractions:
            with self.step.prefix(state.model, fraction):
                out.update(self.task.prefix_columns(fraction, self.net(state.net, loader), split))
        return out

    def test(self, state: TrainState, epoch: int) -> tuple:
        """The test split's columns of the model (and the EMA model), evaluated once, after the last epoch ``epoch``,
        when the validation split is carved from train (``val_split_fraction`` > 0; nothing was chosen on these
        images), and those of the weights saved as ``best.safetensors`` (the model's or the EMA's, of whichever epoch
        validated best), so that the figure printed beside that file is its own. Nothing without a test split.

        Returns:
            ``(columns, result)``: the task's test columns (a classifier's ``test_top1, test_top5[, ema_test_top1][,
            best_test_top1]`` in percent, a masked autoencoder's ``test_loss``...; no best column when
            ``best.safetensors`` is another folder's: a run resumed from another run's checkpoint), and the model's
            evaluation (None when nothing was evaluated).
        """
        if not self.data.has_test_split:
            return {}, None
        loader = self.data.test_loader()
        main = self.net(state.net, loader)
        out = dict(self.task.test_columns(main))
        results = {'model': main}
        if state.ema:
            results['ema'] = self.net(state.ema.module, loader)
            out.update(self.task.test_columns(results['ema'], 'ema'))
        if state.best.get('epoch') == epoch:  # the best weights are this epoch's: one of the figures above
            best = results['ema' if state.best.get('source') == 'ema' else 'model']
            out.update(self.task.test_columns(best, 'best'))
        elif os.path.isfile(self.best_path):  # (a run resumed into a new folder keeps its best weights in the old one)
            weights, _ = model_for_checkpoint(dict(state.config_record), self.best_path)
            out.update(self.task.test_columns(self.net(weights.to(self.device), loader), 'best'))
        return {**out, **self.prefixes(state, loader, 'test_')}, main

    def report(self, result: Dict[str, Any], split: str) -> None:
        """The task's files of the final evaluation ``result`` on ``split`` (rank 0; a classifier's per-class top-1
        and confusion matrix)."""
        if self.main and self.path is not None:
            classes = dataset_classes(self.data.train_ds) or {}
            names = sorted(classes, key=lambda name: classes[name])
            self.task.report(result, names, self.path, split)
