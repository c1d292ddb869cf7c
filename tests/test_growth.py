"""Progressive scaling (paper §3.3, Eq. 12-13, Appendix B): exact where the math allows, everywhere it is used."""
import os
import subprocess
import sys

import pytest
import timm
import torch
from safetensors.torch import load_file

from tkvision import growth
from tkvision.layers import SCORE_NORMS
from tkvision.engine import trainer as train_mod
from tkvision.engine.checkpoint import save_weights
from tkvision.utils.errors import WeightsMismatchError

from .helpers import ROOT, TINY_FMNIST, assert_same_training_state, fmnist_cfg, train_crash_resume


def tiny(score_norm='l2_norm_gelu', **kw):
    torch.manual_seed(0)
    args = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_tokens=16, num_classes=5)
    return timm.create_model('tokenformer_vit_ti16', score_norm=score_norm, **dict(args, **kw)).eval()


@pytest.mark.parametrize('score_norm', [n for n, entry in SCORE_NORMS.items() if entry.zero_key_exact])
def test_grown_model_computes_the_same_function(score_norm):
    m = tiny(score_norm)
    x = torch.randn(4, 3, 32, 32)
    before = m(x)
    growth.grow(m, patch=8, qkv=16, proj=8, ffn=64)
    assert growth.token_counts(m) == dict(patch=24, qkv=32, proj=24, ffn=128)
    assert m.num_tokens_qkv == 32
    assert (m(x) - before).abs().max().item() <= 1e-6


def test_softmax_growth_warns_and_random_keys_change_output():
    m = tiny('softmax')
    with pytest.warns(UserWarning, match='softmax'):
        growth.grow(m, qkv=4)
    m = tiny()
    x = torch.randn(2, 3, 32, 32)
    before = m(x)
    growth.grow(m, ffn=16, key_init='normal')  # the public code's init: not function-preserving
    assert (m(x) - before).abs().max().item() > 1e-4


def test_grow_to_variant_and_copy():
    with torch.device('meta'):
        small = timm.create_model('tokenformer_vit_b16_matched')
        big = growth.grow(small, to='tokenformer_vit_b16', copy=True)
    assert growth.token_counts(small) == dict(patch=576, qkv=576, proj=576, ffn=2304)
    assert growth.token_counts(big) == growth.target_counts('tokenformer_vit_b16') == \
        dict(patch=768, qkv=768, proj=768, ffn=3072)
    with pytest.raises(ValueError, match='fewer tokens'):
        growth.grow(big, to='tokenformer_vit_b16_matched')


def test_optimizer_moments_of_old_tokens_survive():
    m = tiny().train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    layer = m.blocks[0].ffn
    old_k = layer.key_param_tokens
    saved = {k: v.clone() for k, v in opt.state[old_k].items()}
    growth.grow(m, ffn=16)
    growth.grow_optimizer_state(opt, {old_k: layer.key_param_tokens})
    st = opt.state[layer.key_param_tokens]
    assert st['exp_avg'].shape == (80, 32)
    assert torch.equal(st['exp_avg'][:64], saved['exp_avg']) and torch.equal(st['exp_avg_sq'][:64], saved['exp_avg_sq'])
    assert st['exp_avg'][64:].abs().sum() == 0 and st['step'] == saved['step']
    assert any(p is layer.key_param_tokens for g in opt.param_groups for p in g['params'])
    assert old_k not in opt.state


def test_load_small_checkpoint_into_big_model(tmp_path):
    small = tiny()
    x = torch.randn(2, 3, 32, 32)
    big = tiny(num_tokens_ffn=100)
    for _, (kind, layer) in growth.pattention_layers(big).items():
        layer.keys.data.zero_()  # zero keys for the rows the checkpoint does not fill
    report = growth.load_grown_state_dict(big, small.state_dict())
    assert report['blocks.0.ffn.key_param_tokens'] == (64, 100)
    assert big.blocks[0].ffn.tau.item() == small.blocks[0].ffn.tau.item() == 8.0  # the checkpoint's tau
    assert (big(x) - small(x)).abs().max().item() <= 1e-6
    wrong = tiny(embed_dim=48)
    with pytest.raises(WeightsMismatchError, match='pos_embed'):
        growth.load_grown_state_dict(wrong, small.state_dict())


def test_grow_tool_and_init_from(tmp_path, capsys):
    cfg = fmnist_cfg(tmp_path, epochs=1)
    train_mod.train(cfg)
    small = os.path.join(cfg['output'], 'last.safetensors')
    grown = str(tmp_path / 'grown.safetensors')
    kwargs = str(dict(TINY_FMNIST, num_classes=10)).replace("'", '')
    p = subprocess.run([sys.executable, os.path.join(ROOT, 'tools/grow.py'), '--checkpoint', small, '--model',
                        'tokenformer_vit_ti16', '--model-kwargs', kwargs, '--add-qkv', '16', '--add-ffn', '64',
                        '--out', grown], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert 'qkv        16 ->     32' in p.stdout
    w = load_file(grown)
    assert w['blocks.0.attn.q.key_param_tokens'].shape == (32, 32) and w['blocks.0.ffn.value_param_tokens'].shape == (128, 32)
    assert w['blocks.0.attn.q.key_param_tokens'][16:].abs().sum() == 0
    # the grown file evaluates exactly like the small one ...
    m_small = timm.create_model('tokenformer_vit_ti16', pretrained=True, pretrained_cfg_overlay=dict(file=small),
                                num_classes=10, **TINY_FMNIST).eval()
    big_kwargs = dict(TINY_FMNIST, num_tokens_qkv=32, num_tokens_ffn=128)
    m_big = timm.create_model('tokenformer_vit_ti16', pretrained=True, pretrained_cfg_overlay=dict(file=grown),
                              num_classes=10, **big_kwargs).eval()
    x = torch.randn(3, 1, 28, 28)
    assert (m_big(x) - m_small(x)).abs().max().item() <= 1e-6
    # ... and the trainer starts from it, or from the small file directly (loaded into the first rows)
    capsys.readouterr()
    cfg2 = fmnist_cfg(tmp_path, epochs=1, model_kwargs=big_kwargs, init_from=small, output=str(tmp_path / 'big'))
    res = train_mod.train(cfg2)
    assert 'grown from init_from' in capsys.readouterr().out
    assert res['model'].blocks[0].attn.q.num_tokens == 32


def test_freeze_old_tokens_trains_only_new_tokens_and_head(tmp_path):
    small = tiny()
    path = str(tmp_path / 's.safetensors')
    save_weights(small.state_dict(), path)
    m = tiny(num_tokens_ffn=80).train()
    growth.load_grown_state_dict(m, small.state_dict())
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    growth.freeze_old_tokens(m, growth.token_counts(small), opt)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    for _ in range(3):
        m(torch.randn(4, 3, 32, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
    after = m.state_dict()
    assert torch.equal(after['blocks.0.ffn.key_param_tokens'][:64], before['blocks.0.ffn.key_param_tokens'][:64])
    assert not torch.equal(after['blocks.0.ffn.value_param_tokens'][64:], before['blocks.0.ffn.value_param_tokens'][64:])
    assert torch.equal(after['blocks.0.attn.q.value_param_tokens'], before['blocks.0.attn.q.value_param_tokens'])
    assert torch.equal(after['pos_embed'], before['pos_embed'])
    assert not torch.equal(after['head.weight'], before['head.weight'])


def test_growth_during_training_and_resume_across_it(tmp_path, monkeypatch):
    """Grow at every epoch end; crash after the epoch-2 checkpoint; resume; same weights as without the crash."""
    g = dict(every_epochs=1, add_tokens=dict(qkv=8, ffn=16), until_epoch=3)
    full = train_mod.train(fmnist_cfg(tmp_path, epochs=3, output=str(tmp_path / 'full'), growth=g, model_ema=True))
    assert growth.token_counts(full['model']) == dict(patch=16, qkv=32, proj=16, ffn=96)  # grew after epochs 1, 2
    assert [r.get('tokens') for r in full['history']] == [112, 136, 160]  # tokens summed over kinds, per epoch

    cfg = fmnist_cfg(tmp_path, epochs=3, output=str(tmp_path / 'crashed'), growth=g, model_ema=True)
    train_crash_resume(monkeypatch, cfg, saves=2)
    assert_same_training_state(tmp_path / 'full' / 'last.pth', tmp_path / 'crashed' / 'last.pth')  # EMA, optimizer too


def test_unknown_growth_kind_is_named(tmp_path):
    from tkvision.engine.config import ConfigError
    with pytest.raises(ConfigError, match="unknown token kind 'mlp'"):
        train_mod.train(fmnist_cfg(tmp_path, growth=dict(every_epochs=1, add_tokens=dict(mlp=8))))


def test_grow_training_state_remaps_optimizer_and_ema(tiny_kwargs):
    """Growth in the middle of training: the optimizer trains the new tensors, keeps the old rows'
    moments and starts the new rows at zero; the EMA grows alike and takes the new rows from the model."""
    from timm.utils import ModelEmaV3
    torch.manual_seed(0)
    model = timm.create_model('tokenformer_vit_ti16', **tiny_kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ema = ModelEmaV3(model, decay=0.5)
    for _ in range(2):
        model(torch.randn(2, 3, 32, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
        ema.update(model)
    q_before = model.blocks[0].attn.q.key_param_tokens
    moments = opt.state[q_before]['exp_avg'].clone()
    ema_old = ema.module.blocks[0].attn.q.key_param_tokens.detach().clone()
    counts = growth.grow_training_state(model, opt, ema.module, qkv=4, ffn=8)
    q = model.blocks[0].attn.q
    assert counts['qkv'] == 20 and counts['ffn'] == 72 and growth.token_counts(ema.module) == counts
    assert any(p is q.key_param_tokens for g in opt.param_groups for p in g['params'])
    assert not any(p is q_before for g in opt.param_groups for p in g['params'])
    state = opt.state[q.key_param_tokens]
    assert torch.equal(state['exp_avg'][:16], moments) and not state['exp_avg'][16:].any()
    ema_q = ema.module.blocks[0].attn.q
    assert torch.equal(ema_q.key_param_tokens[:16], ema_old)
    assert torch.equal(ema_q.value_param_tokens[16:], q.value_param_tokens[16:])
    model(torch.randn(2, 3, 32, 32)).sum().backward()  # and the grown model keeps training
    opt.step()


def test_growth_reads_each_pattentions_kind_not_its_module_name():
    """A family whose modules have other names (here ``stem``, ``mix``, ``mlp``) grows by the kinds its
    builder set; a Pattention without a kind is named in the error."""
    from tkvision.layers import Pattention

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = Pattention(8, 8, 4, kind='patch')
            self.mix = torch.nn.ModuleList([Pattention(8, 8, 4, kind='qkv') for _ in range(3)])
            self.mlp = Pattention(8, 8, 16, kind='ffn')

        def forward(self, x):
            x = self.stem(x)
            return self.mlp(sum(m(x) for m in self.mix))

    torch.manual_seed(0)
    m = Odd().eval()
    x = torch.randn(3, 8)
    before = m(x)
    growth.grow(m, qkv=4, ffn=8)
    assert growth.token_counts(m) == dict(patch=4, qkv=8, ffn=24)
    assert (m(x) - before).abs().max().item() <= 1e-6
    m.extra = Pattention(8, 8, 4)
    with pytest.raises(ValueError, match='Pattention extra has no kind'):
        growth.token_counts(m)


def test_the_checkpoint_filter_is_found_by_the_models_attribute():
    """adapt_state_dict applies ``model.checkpoint_filter`` of any model that has one (not by module
    lookup), and leaves other models' weights as they are."""
    from tkvision.models import adapt_state_dict

    class Renamed(torch.nn.Linear):
        def checkpoint_filter(self, state_dict):
            return {k.replace('old_', ''): v for k, v in state_dict.items()}

    w = dict(old_weight=torch.ones(2, 2), old_bias=torch.zeros(2))
    assert set(adapt_state_dict(Renamed(2, 2), w)) == {'weight', 'bias'}
    assert set(adapt_state_dict(torch.nn.Linear(2, 2), w)) == {'old_weight', 'old_bias'}


@pytest.mark.parametrize('beta2', [0.999, 0.95])
def test_first_updates_of_a_grown_row_follow_adams_closed_form(beta2):
    """A row appended with zero moments while the step count is kept: with a constant gradient g, its
    j-th update is lr * [(1 - b1^j) / (1 - b1^t)] / (sqrt[(1 - b2^j) / (1 - b2^t)] + eps), t the step count.
    With b2 = 0.999 (AdamW's default, the Fashion-MNIST runs) that is 3-6x a settled row's step for
    hundreds of updates; with b2 = 0.95 (the ImageNet recipes) it starts below one step (docs/growth.md)."""
    lr, b1, eps, k = 1e-3, 0.9, 1e-8, 312  # the Fashion-MNIST chain's first step: 2 epochs x 156 updates
    old = torch.nn.Parameter(torch.zeros(2, 1, dtype=torch.float64))
    opt = torch.optim.AdamW([old], lr=lr, betas=(b1, beta2), eps=eps, weight_decay=0.0)
    for _ in range(k):  # the old rows train k steps
        old.grad = torch.ones_like(old)
        opt.step()
    new = torch.nn.Parameter(torch.cat([old.detach(), torch.zeros(1, 1, dtype=torch.float64)]))
    growth.grow_optimizer_state(opt, {old: new})
    ratios, expected = [], []
    for j in range(1, 6):
        before = new.detach().clone()
        new.grad = torch.ones_like(new)
        opt.step()
        t = k + j
        closed = lr * ((1 - b1 ** j) / (1 - b1 ** t)) / (((1 - beta2 ** j) / (1 - beta2 ** t)) ** 0.5 + eps)
        expected.append(closed)
        ratios.append((before - new.detach())[2, 0].item())
    torch.testing.assert_close(torch.tensor(ratios, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64),
                               rtol=1e-9, atol=0)
    # in units of a settled row's step (~lr), over the first 50 updates
    steps = [((1 - b1 ** j) / (1 - b1 ** (k + j))) / ((1 - beta2 ** j) / (1 - beta2 ** (k + j))) ** 0.5
             for j in range(1, 51)]
    if beta2 == 0.999:
        assert 1.5 < steps[0] < 2.0 and 3.0 < max(steps) < 3.6, steps  # larger than a regular step, not smaller
    else:
        assert steps[0] < 0.5 and max(steps) < 1.1, steps  # small first updates: the old claim holds here only
