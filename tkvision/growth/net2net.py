"""Net2Net widening of a plain timm ViT's MLPs (Chen et al. 2016, https://arxiv.org/abs/1511.05641;
the baseline of the TokenFormer paper's §4.3 and Eq. 14).

[`net2net_widen`][tkvision.growth.net2net.net2net_widen] widens the MLP hidden layer without changing the function:
new hidden units copy existing ones (fc1 rows duplicated) and each copied unit's outgoing fc2 column is split among
its copies. It lets a ``growth.schedule`` with ``to: {mlp_hidden: N}`` run for a ViT, the baseline of
``docs/growth.md``.
"""
from typing import Optional

import torch
from timm.layers import Mlp
from timm.utils import unwrap_model

__all__ = ['mlps', 'net2net_widen']


def mlps(model: torch.nn.Module) -> dict:
    """``{name: timm Mlp}`` of ``model`` (wrappers peeled with timm's ``unwrap_model``)."""
    return {n: m for n, m in unwrap_model(model).named_modules() if isinstance(m, Mlp)}


def net2net_widen(
        model: torch.nn.Module,
        mlp_hidden: int,
        split: str = 'random',
        plan: Optional[dict] = None,
) -> dict:
    """Widen every timm ``Mlp`` (fc1 -> act -> fc2) of ``model`` to ``mlp_hidden`` units, in place,
    keeping the function (Net2WiderNet, Chen et al. 2016; paper Eq. 14, §4.3).

    For hidden size h -> H, unit j < h stays and unit j >= h copies a unit g(j) drawn uniformly from
    [0, h) (torch's global RNG): fc1's row and bias of g(j) are duplicated, and fc2's column of each
    copied unit k is shared among its copies with weights summing to 1, so
    ``fc2(act(fc1(x)))`` is unchanged (x: ``[..., in_features]``).

    Args:
        model: a module holding timm ``Mlp`` blocks (a timm ViT, ``vit_*``), or DDP / compiled one.
        mlp_hidden: the new hidden size H (>= the current h).
        split: ``'even'``: each copy gets 1/c of the column (Net2Net's form; the copies then stay
            identical under training unless noise is added); ``'random'`` (default): random shares
            (uniform in [0.5, 1.5], normalised to sum 1 per unit), still exact, and the copies get
            different gradients, which breaks their symmetry.
        plan: the return value of an earlier call, to widen another copy of the model (an EMA
            copy) with the same units and shares.

    Returns:
        ``{mlp name: (source unit index [H], share [H])}``: the plan.

    Raises:
        ValueError: no timm ``Mlp`` in the model, an ``Mlp`` with a hidden norm (not
            function-preserving here), or ``mlp_hidden`` smaller than a current hidden size.
    """
    layers = mlps(model)
    if not layers:
        raise ValueError('net2net_widen needs timm Mlp blocks (fc1 -> act -> fc2), e.g. a timm vit_*; found none')
    if split not in ('even', 'random'):
        raise ValueError(f"split must be 'even' or 'random', got {split!r}")
    plan = dict(plan or {})
    for name, mlp in layers.items():
        h = mlp.fc1.out_features
        if mlp_hidden < h:
            raise ValueError(f'{name}: mlp_hidden {mlp_hidden} is smaller than the current hidden size {h}')
        if not isinstance(mlp.norm, torch.nn.Identity):
            raise ValueError(f'{name}: an Mlp with a hidden norm cannot be widened function-preservingly here')
        if name not in plan:
            if mlp_hidden == h:
                continue
            device = mlp.fc1.weight.device
            idx = torch.cat([torch.arange(h), torch.randint(h, (mlp_hidden - h,))]).to(device)
            r = (torch.rand(mlp_hidden) + 0.5 if split == 'random' else torch.ones(mlp_hidden)).to(device)
            total = torch.zeros(h, device=device).index_add_(0, idx, r)
            plan[name] = (idx, r / total[idx])
        idx, share = plan[name]
        with torch.no_grad():
            fc1 = torch.nn.Linear(mlp.fc1.in_features, len(idx), bias=mlp.fc1.bias is not None).to(mlp.fc1.weight)
            fc1.weight.copy_(mlp.fc1.weight[idx])
            if fc1.bias is not None:
                fc1.bias.copy_(mlp.fc1.bias[idx])
            fc2 = torch.nn.Linear(len(idx), mlp.fc2.out_features, bias=mlp.fc2.bias is not None).to(mlp.fc2.weight)
            fc2.weight.copy_(mlp.fc2.weight[:, idx] * share)
        fc2.bias = mlp.fc2.bias  # unchanged: the same parameter (its optimizer state stays valid)
        mlp.fc1, mlp.fc2 = fc1, fc2
    return plan
