"""The optimizer levers on parameter tokens: ``parameter_token_weight_decay`` and
``parameter_token_lr_scale`` reach exactly the Pattentions' key / value tokens, through timm's optimizer and
scheduler, and leave everything else (and the default groups) as timm makes them."""
import pytest
import timm
import torch

from tkvision.engine.config import ConfigError, load_config, section
from tkvision.engine.optim import build_optimizer, build_scheduler
from tkvision.layers import Pattention

TINY = dict(img_size=16, patch_size=8, in_chans=1, embed_dim=8, depth=1, num_heads=2, num_tokens=4, num_classes=3)


def _optim(**overrides):
    return section(load_config(None, dict(opt='adamw', weight_decay=0.05, warmup_epochs=0, epochs=1, **overrides)), 'optim')


def _tokens(model):
    return {id(p) for m in model.modules() if isinstance(m, Pattention) for p in (m.keys, m.value_param_tokens)}


def test_defaults_keep_timms_groups():
    model = timm.create_model('tokenformer_vit_ti16', **TINY)
    ours = build_optimizer(model, _optim(), lr=1e-3)
    timms = timm.optim.create_optimizer_v2(model, opt='adamw', lr=1e-3, weight_decay=0.05)
    assert [[id(p) for p in g['params']] for g in ours.param_groups] == \
        [[id(p) for p in g['params']] for g in timms.param_groups]


def test_parameter_tokens_get_their_decay_and_lr_in_an_adamw_step():
    """One AdamW step by hand (float64): a parameter token moves by lr·s·(sign-like Adam step + wd'·p),
    any other weight by lr·(… + wd·p); the schedule sets the tokens' lr to s times the others'."""
    torch.manual_seed(0)
    model = timm.create_model('tokenformer_vit_ti16', **TINY).double()
    optimizer = build_optimizer(model, _optim(parameter_token_weight_decay=0.0, parameter_token_lr_scale=0.5), lr=0.1)
    build_scheduler(optimizer, _optim(), None, lr=0.1, updates_per_epoch=10)  # sets each group's lr for update 0
    tokens = _tokens(model)
    assert all(all(id(p) in tokens for p in g['params']) == (g.get('lr_scale') == 0.5) for g in optimizer.param_groups)
    assert {g['lr'] for g in optimizer.param_groups if g.get('lr_scale') == 0.5} == {0.05}
    key, head = model.blocks[0].ffn.key_param_tokens, model.head.weight
    before = {n: p.detach().clone() for n, p in (('key', key), ('head', head))}
    model(torch.randn(2, 1, 16, 16, dtype=torch.float64)).square().sum().backward()
    grads = {'key': key.grad.clone(), 'head': head.grad.clone()}
    optimizer.step()
    for name, param, lr, wd in (('key', key, 0.05, 0.0), ('head', head, 0.1, 0.05)):
        g, p0 = grads[name], before[name]
        adam = (0.1 * g / (1 - 0.9)) / (torch.sqrt(0.001 * g * g / (1 - 0.999)) + 1e-8)  # first step's m̂ / (√v̂ + ε)
        expected = p0 * (1 - lr * wd) - lr * adam
        torch.testing.assert_close(param.detach(), expected, rtol=1e-9, atol=1e-12, msg=name)


def test_a_bad_value_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match='parameter_token_lr_scale'):
        load_config(None, dict(parameter_token_lr_scale=0))
