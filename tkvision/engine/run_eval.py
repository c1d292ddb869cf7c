"""A run's evaluation after an epoch: the validation split (model and EMA), the best weights kept, the elastic
prefixes, and once, after the last epoch, the test split.

[`evaluate_epoch`][tkvision.engine.run_eval.evaluate_epoch] is the stage the trainer calls; it returns the row's
evaluation columns. Each figure comes from ``tkvision.engine.evaluate`` (top-1 / top-5 and loss, or for
``task: mae`` the reconstruction loss with the run's fixed masks) on the run's device, preprocessing and
precision (`evaluate_net`).
"""
import os
from typing import Iterable

import torch

from ..data import has_test_split
from ..growth import elastic
from .checkpoint import BEST_WEIGHTS, keep_best, model_for_checkpoint
from .context import RunContext
from .evaluate import evaluate, evaluate_mae
from .state import TrainState

__all__ = ['evaluate_epoch', 'evaluate_net', 'evaluate_prefixes', 'evaluate_test']


def evaluate_epoch(
        run: RunContext,
        state: TrainState,
        epoch: int,
        last_epoch: bool,
) -> dict:
    """The evaluation columns of epoch ``epoch``'s row: the model (and the EMA model) on the validation split,
    ``best.safetensors`` saved when either beats the best (``tkvision.engine.checkpoint.keep_best``: highest
    top-1, or lowest MAE validation loss), `evaluate_prefixes` on the validation split, and after the last epoch
    (``last_epoch``) `evaluate_test`.

    Returns:
        ``dict(top1, top5, val_loss, val_skipped[, ema_top1, ema_top5])``; for ``task: mae``
        ``dict(val_loss, val_skipped[, ema_val_loss])`` (reconstruction loss, the same masks every time); with
        the prefixes' and the test split's columns.
    """
    mae = run.task == 'mae'
    models = [('model', state.net, state.model)] + ([('ema', state.ema.module, state.ema.module)] if state.ema else [])
    results = {source: evaluate_net(run, net, run.data.val_loader) for source, net, _ in models}
    metric, mode = ('val_loss', 'min') if mae else ('top1', 'max')
    candidates = [(source, results[source]['loss' if mae else 'top1'], model) for source, _, model in models]
    metadata = dict(model=run.model_name, epoch=epoch, **(dict(task='mae') if mae else {}))
    state.best = keep_best(state.best, candidates, metric, mode,
                           os.path.join(run.out, BEST_WEIGHTS) if run.main else None, metadata)
    main = results['model']
    row = (dict(val_loss=main['loss'], val_skipped=main['skipped']) if mae else
           dict(top1=main['top1'], top5=main['top5'], val_loss=main['loss'], val_skipped=main['skipped']))
    if 'ema' in results:
        row.update(dict(ema_val_loss=results['ema']['loss']) if mae else
                   dict(ema_top1=results['ema']['top1'], ema_top5=results['ema']['top5']))
    row.update(evaluate_prefixes(run, state, run.data.val_loader))
    if last_epoch:
        row.update(evaluate_test(run, state, epoch))
    return row


def evaluate_net(
        run: RunContext,
        net: torch.nn.Module,
        loader: Iterable,
) -> dict:
    """``tkvision.engine.evaluate.evaluate`` (``task: mae``: ``evaluate_mae``, with the run's fixed masks) of
    ``net`` on ``loader`` with the run's device, preprocessing and precision."""
    device, preprocess, amp = run.processes.device, run.data.preprocess, run.amp
    if run.task == 'mae':
        return evaluate_mae(net, loader, device, preprocess, amp, run.seed)
    return evaluate(net, loader, device, preprocess, amp)


def evaluate_prefixes(
        run: RunContext,
        state: TrainState,
        loader: Iterable,
        split: str = '',
) -> dict:
    """An elastic run's model at each of its ``elastic_fractions`` below 1 on ``loader``
    (``tkvision.growth.elastic.prefix``): top-1, ``{'top1@0.25': ..., ...}``, or for ``task: mae`` the
    reconstruction loss (the same masks every time), ``{'val_loss@0.25': ...}``; keys prefixed by ``split``
    (``'test_'``); ``{}`` for a run that is not elastic."""
    out, settings = {}, run.loss.elastic
    for fraction in sorted(set(settings.elastic_fractions)):
        if fraction < 1:
            with elastic.prefix(state.model, fraction, settings.elastic_tau, settings.elastic_nesting):
                result = evaluate_net(run, state.net, loader)
            if run.task == 'mae':
                out[f'{split}val_loss@{fraction:g}'] = result['loss']
            else:
                out[f'{split}top1@{fraction:g}'] = result['top1']
    return out


def evaluate_test(run: RunContext, state: TrainState, epoch: int) -> dict:
    """The test split's top-1 / top-5 of the model (and the EMA model), evaluated once, after the last
    epoch ``epoch``, when the validation split is carved from train (``val_split_fraction`` > 0; nothing was
    chosen on these images), and the test top-1 of the weights saved as ``best.safetensors`` (the model's or
    the EMA's, of whichever epoch validated best), so that the figure printed beside that file is its own.
    Returns ``{}`` without a test split, or for ``task: mae``.

    Returns:
        ``dict(test_top1, test_top5[, ema_test_top1][, best_test_top1])`` in percent (no ``best_test_top1`` when
        ``best.safetensors`` is another folder's: a run resumed from another run's checkpoint).
    """
    if run.task == 'mae' or not has_test_split(run.data.data):
        return {}
    loader = run.data.test_loader()
    main = evaluate_net(run, state.net, loader)
    out = dict(test_top1=main['top1'], test_top5=main['top5'])
    if state.ema:
        out['ema_test_top1'] = evaluate_net(run, state.ema.module, loader)['top1']
    best_path = os.path.join(run.out, BEST_WEIGHTS)
    if state.best.get('epoch') == epoch:  # the best weights are this epoch's: one of the figures above
        out['best_test_top1'] = out['ema_test_top1' if state.best.get('source') == 'ema' else 'test_top1']
    elif os.path.isfile(best_path):  # (a run resumed into a new folder keeps its best weights in the old one)
        best, _ = model_for_checkpoint(dict(state.config_record), best_path)
        out['best_test_top1'] = evaluate_net(run, best.to(run.processes.device), loader)['top1']
    return {**out, **evaluate_prefixes(run, state, loader, 'test_')}
