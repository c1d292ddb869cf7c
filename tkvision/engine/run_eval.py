"""A run's evaluation after an epoch: the validation split (model and EMA), the best weights kept, the elastic
prefixes, and once, after the last epoch, the test split.

[`RunEvaluator`][tkvision.engine.run_eval.RunEvaluator] is the stage the trainer builds from the parts it reads
(the data, the task, the device and precision, the run's folder); its `epoch` returns the row's evaluation columns.
Each figure comes from ``tkvision.engine.evaluate`` (top-1 / top-5 and loss, or for ``task: mae`` the
reconstruction loss with the run's fixed masks) on the run's device, preprocessing and precision (`net`).
"""
import os
from typing import Iterable

import torch

from .checkpoint import keep_best, model_for_checkpoint
from .distributed import Processes
from .evaluate import evaluate, evaluate_mae
from .loss import TrainTask
from .run_data import RunData
from .state import TrainState

__all__ = ['RunEvaluator']


class RunEvaluator:
    """The evaluation of a run (module docstring).

    Args:
        data: the run's loaders and preprocessing.
        task: the training task (what it evaluates, and the elastic prefixes to report).
        processes: this process among the job's: its device, its precision (the plan's ``autocast_dtype``) and
            whether it is rank 0 (it writes ``best.safetensors``).
        seed: the run's seed (an MAE's fixed evaluation masks).
        model_name: the model's registry name (the best weights' metadata).
        best_path: the run's ``best.safetensors`` (written by rank 0, read by every rank at the end).
    """

    def __init__(
            self,
            data: RunData,
            task: TrainTask,
            processes: Processes,
            seed: int,
            model_name: str,
            best_path: str,
    ):
        self.data, self.task, self.seed, self.model_name, self.best_path = data, task, seed, model_name, best_path
        self.device, self.dtype, self.main = processes.device, processes.plan.autocast_dtype, processes.main
        self.mae = task.task.reconstructs

    def epoch(
            self,
            state: TrainState,
            epoch: int,
            last_epoch: bool,
    ) -> dict:
        """The evaluation columns of epoch ``epoch``'s row: the model (and the EMA model) on the validation split,
        ``best.safetensors`` saved when either beats the best (``tkvision.engine.checkpoint.keep_best``: highest
        top-1, or lowest MAE validation loss), `prefixes` on the validation split, and after the last epoch
        (``last_epoch``) `test`.

        Returns:
            ``dict(top1, top5, val_loss, val_skipped[, ema_top1, ema_top5])``; for ``task: mae``
            ``dict(val_loss, val_skipped[, ema_val_loss])`` (reconstruction loss, the same masks every time); with
            the prefixes' and the test split's columns.
        """
        mae, loader = self.mae, self.data.val_loader
        models = [('model', state.net, state.model)] + ([('ema', state.ema.module, state.ema.module)]
                                                          if state.ema else [])
        results = {source: self.net(net, loader) for source, net, _ in models}
        metric, mode = self.task.task.best
        candidates = [(source, results[source]['loss' if mae else 'top1'], model) for source, _, model in models]
        metadata = dict(model=self.model_name, epoch=epoch, **(dict(task=self.task.task.name) if mae else {}))
        state.best = keep_best(state.best, candidates, metric, mode, self.best_path if self.main else None, metadata)
        main = results['model']
        row = (dict(val_loss=main['loss'], val_skipped=main['skipped']) if mae else
               dict(top1=main['top1'], top5=main['top5'], val_loss=main['loss'], val_skipped=main['skipped']))
        if 'ema' in results:
            row.update(dict(ema_val_loss=results['ema']['loss']) if mae else
                       dict(ema_top1=results['ema']['top1'], ema_top5=results['ema']['top5']))
        row.update(self.prefixes(state, loader))
        if last_epoch:
            row.update(self.test(state, epoch))
        return row

    def net(
            self,
            net: torch.nn.Module,
            loader: Iterable,
    ) -> dict:
        """``tkvision.engine.evaluate.evaluate`` (``task: mae``: ``evaluate_mae``, with the run's fixed masks) of
        ``net`` on ``loader`` with the run's device, preprocessing and precision."""
        if self.mae:
            return evaluate_mae(net, loader, self.device, self.data.preprocess, self.dtype, self.seed)
        return evaluate(net, loader, self.device, self.data.preprocess, self.dtype)

    def prefixes(
            self,
            state: TrainState,
            loader: Iterable,
            split: str = '',
    ) -> dict:
        """An elastic run's model at each of its ``elastic_fractions`` below 1 on ``loader``
        (``TrainTask.prefix``): top-1, ``{'top1@0.25': ..., ...}``, or for ``task: mae`` the reconstruction loss
        (the same masks every time), ``{'val_loss@0.25': ...}``; keys prefixed by ``split`` (``'test_'``); ``{}``
        for a run that is not elastic."""
        out = {}
        for fraction in self.task.eval_fractions:
            with self.task.prefix(state.model, fraction):
                result = self.net(state.net, loader)
            if self.mae:
                out[f'{split}val_loss@{fraction:g}'] = result['loss']
            else:
                out[f'{split}top1@{fraction:g}'] = result['top1']
        return out

    def test(self, state: TrainState, epoch: int) -> dict:
        """The test split's top-1 / top-5 of the model (and the EMA model), evaluated once, after the last
        epoch ``epoch``, when the validation split is carved from train (``val_split_fraction`` > 0; nothing was
        chosen on these images), and the test top-1 of the weights saved as ``best.safetensors`` (the model's or
        the EMA's, of whichever epoch validated best), so that the figure printed beside that file is its own.
        Returns ``{}`` without a test split, or for ``task: mae``.

        Returns:
            ``dict(test_top1, test_top5[, ema_test_top1][, best_test_top1])`` in percent (no ``best_test_top1``
            when ``best.safetensors`` is another folder's: a run resumed from another run's checkpoint).
        """
        if self.mae or not self.data.has_test_split:
            return {}
        loader = self.data.test_loader()
        main = self.net(state.net, loader)
        out = dict(test_top1=main['top1'], test_top5=main['top5'])
        if state.ema:
            out['ema_test_top1'] = self.net(state.ema.module, loader)['top1']
        if state.best.get('epoch') == epoch:  # the best weights are this epoch's: one of the figures above
            out['best_test_top1'] = out['ema_test_top1' if state.best.get('source') == 'ema' else 'test_top1']
        elif os.path.isfile(self.best_path):  # (a run resumed into a new folder keeps its best weights in the old one)
            best, _ = model_for_checkpoint(dict(state.config_record), self.best_path)
            out['best_test_top1'] = self.net(best.to(self.device), loader)['top1']
        return {**out, **self.prefixes(state, loader, 'test_')}
