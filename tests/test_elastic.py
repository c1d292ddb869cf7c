"""Elastic TokenFormers (``tkvision/growth/elastic.py``, docs/elastic.md): one model run at any prefix of its
parameter tokens, trained at nested prefixes, exported at a prefix, grown with its prefixes kept."""
import itertools
import math

import pytest
import timm
import torch

from tkvision import growth
from tkvision.engine import trainer as train_mod
from tkvision.engine.config import ConfigError
from tkvision.growth import elastic
from tkvision.layers import Pattention

from .helpers import assert_same_training_state, fmnist_cfg, train_crash_resume

KW = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=24, depth=3, num_heads=3, num_tokens=16, num_classes=10)
NAFLEX = dict(img_size=32, patch_size=8, embed_dim=24, depth=3, num_heads=3, num_tokens=16, num_classes=10)


def _reference(x, keys, values, tau):
    """Eq. 4-5 in float64: GELU(x Kᵀ · τ / ‖x Kᵀ‖₂) V."""
    a = x.double() @ keys.double().t()
    z = a * (tau / a.norm(dim=-1, keepdim=True))
    return torch.nn.functional.gelu(z) @ values.double()


def test_a_prefix_is_eq5_over_the_first_k_tokens_in_float64():
    """A layer at a prefix of k tokens computes Θ(X K[:k]ᵀ) V[:k] with the full layer's τ = √n, against float64
    math; its gradient reaches only the first k rows."""
    torch.manual_seed(0)
    layer = Pattention(12, 10, 20, key_std=0.5, value_std=0.5).double()
    x = torch.randn(3, 5, 12, dtype=torch.float64)
    model = torch.nn.Sequential(layer)
    layer.kind = 'qkv'
    with elastic.prefix(model, 0.25) as counts:
        assert counts == {'0': 5}
        out = layer(x)
    tau = layer.tau.item()  # the stored τ is √20 in float32
    assert tau == pytest.approx(math.sqrt(20), rel=1e-7)
    torch.testing.assert_close(out, _reference(x, layer.key_param_tokens[:5], layer.value_param_tokens[:5], tau),
                               rtol=1e-10, atol=1e-12)
    out.sum().backward()
    assert layer.key_param_tokens.grad[5:].abs().max() == 0 and layer.key_param_tokens.grad[:5].abs().max() > 0
    assert layer.prefix_tokens is None  # restored after the block
    torch.testing.assert_close(layer(x), _reference(x, layer.key_param_tokens, layer.value_param_tokens,
                                                    layer.tau.item()), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('family, kwargs', [('tokenformer_vit_ti16', KW), ('naflexvit_tokenformer_ti16', NAFLEX)])
@pytest.mark.parametrize('prefix', [0.25, [0.25, 0.5, 1.0], {'blocks.1.ffn': 7}])
def test_an_extracted_prefix_is_the_model_timm_builds_with_its_counts_and_gives_the_same_logits(family, kwargs, prefix):
    """``extract_prefix``: a standalone model of the smaller shape; ``timm.create_model`` with the matching
    ``num_tokens_*`` (a list per block where blocks differ) loads its state dict strictly and gives the
    logits of the prefix run in place; its parameters are what ``prefix_parameters`` counts."""
    torch.manual_seed(0)
    model = timm.create_model(family, **kwargs).eval()
    x = torch.randn(2, kwargs.get('in_chans', 3), kwargs['img_size'], kwargs['img_size'])
    with torch.no_grad(), elastic.prefix(model, prefix):
        expected = model(x)
    sub = elastic.extract_prefix(model, prefix)
    built = timm.create_model(family, **{**kwargs, **elastic.prefix_model_kwargs(sub)}).eval()
    built.load_state_dict(sub.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(built(x), expected, rtol=1e-5, atol=1e-6)
    assert sum(p.numel() for p in built.parameters()) == elastic.prefix_parameters(model, prefix)
    assert elastic.prefix_model_kwargs(model)['num_tokens_qkv'] == 16  # the source model is unchanged


def test_growing_an_elastic_model_keeps_every_prefix_function():
    """New tokens come last and τ is kept: after growth, every prefix of the old sizes gives the outputs it gave
    before; growth with zero keys keeps the whole model's too."""
    torch.manual_seed(0)
    model = timm.create_model('tokenformer_vit_ti16', **KW).eval()
    x = torch.randn(2, 1, 28, 28)
    counts = [elastic.prefix_counts(model, f) for f in (0.25, 0.5, [0.25, 0.5, 1.0])]
    with torch.no_grad():
        before = [_at(model, c, x) for c in counts]
        whole = model(x)
        growth.grow(model, patch=4, qkv=8, proj=8, ffn=16)
        for c, out in zip(counts, before):
            torch.testing.assert_close(_at(model, c, x), out, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(model(x), whole, rtol=1e-5, atol=1e-6)


def _at(model, counts, x):
    with elastic.prefix(model, counts):
        return model(x)


def test_bad_prefixes_are_refused_by_name():
    model = timm.create_model('tokenformer_vit_ti16', **KW)
    with pytest.raises(ValueError, match=r'prefix must be a fraction in \(0, 1\], got 1.5'):
        elastic.set_prefix(model, 1.5)
    with pytest.raises(ValueError, match=r'one fraction per block \(3\), got 2'):
        elastic.set_prefix(model, [0.5, 1.0])
    with pytest.raises(ValueError, match="no elastic layer 'blocks.9.ffn'"):
        elastic.set_prefix(model, {'blocks.9.ffn': 3})
    with pytest.raises(ValueError, match='blocks.0.ffn: a prefix of 65 tokens; the layer has 64'):
        elastic.set_prefix(model, {'blocks.0.ffn': 65})
    with pytest.raises(ValueError, match="unknown elastic nesting 'half'"):
        elastic.set_prefix(model, 0.5, 'half')
    with pytest.raises(ValueError, match=r"got the string '0.5': pass float\('0.5'\)"):  # as a command line hands it
        elastic.set_prefix(model, '0.5')
    assert all(layer.prefix_tokens is None for layer in elastic.elastic_layers(model).values())  # nothing changed


def test_a_model_without_parameter_tokens_is_refused_not_run_whole():
    """A timm ViT has nothing to run at a prefix: ``prefix`` and ``extract_prefix`` used to run or copy the
    whole model without a word."""
    vit = timm.create_model('vit_tiny_patch16_224', img_size=28, patch_size=7, in_chans=1, depth=1, num_classes=10)
    for call in (lambda: elastic.prefix(vit, 0.5).__enter__(), lambda: elastic.extract_prefix(vit, 0.5),
                 lambda: elastic.extract_prefix(vit)):
        with pytest.raises(ValueError, match='VisionTransformer has no parameter tokens .*only a TokenFormer'):
            call()
    with elastic.prefix(vit, None):  # every token: nothing to refuse
        pass


def test_step_fractions_follow_the_sampling_rule():
    """'all': every fraction, largest first; 'random': one, uniformly; 'largest_plus_random': the largest and
    one other, uniformly (counted over 4,000 draws against 1/k each)."""
    fractions = [0.25, 0.5, 0.75, 1.0]
    g = torch.Generator().manual_seed(0)
    assert elastic.step_fractions(fractions, 'all', g) == [1.0, 0.75, 0.5, 0.25]
    draws = [tuple(elastic.step_fractions(fractions, 'largest_plus_random', g)) for _ in range(3000)]
    assert {d[0] for d in draws} == {1.0} and all(len(d) == 2 for d in draws)
    for f in (0.25, 0.5, 0.75):
        assert abs(sum(d[1] == f for d in draws) / 3000 - 1 / 3) < 0.03
    ones = [elastic.step_fractions(fractions, 'random', g) for _ in range(4000)]
    for f in fractions:
        assert abs(sum(o == [f] for o in ones) / 4000 - 1 / 4) < 0.03
    with pytest.raises(ValueError, match="unknown elastic_sampling 'some'"):
        elastic.step_fractions(fractions, 'some', g)


def test_mix_n_match_takes_the_largest_flattest_monotone_prefix_within_the_budget():
    """MatFormer's rule of thumb against a brute force over every per-block prefix: the chosen one never
    decreases with depth, fits the budget, and no monotone prefix within it has more parameters."""
    model = timm.create_model('tokenformer_vit_ti16', **KW)
    fractions = [0.25, 0.5, 1.0]
    budget = (elastic.prefix_parameters(model, 0.5) + elastic.prefix_parameters(model, 1.0)) // 2
    chosen = elastic.mix_n_match(model, fractions, budget)
    assert chosen == sorted(chosen) and elastic.prefix_parameters(model, chosen) <= budget
    every = [list(p) for p in itertools.product(fractions, repeat=3) if list(p) == sorted(p)]
    best = max(elastic.prefix_parameters(model, p) for p in every if elastic.prefix_parameters(model, p) <= budget)
    assert elastic.prefix_parameters(model, chosen) == best
    assert len(elastic.monotone_prefixes(3, fractions)) == math.comb(3 + 3 - 1, 3 - 1)
    with pytest.raises(ValueError, match='no prefix fits 10 parameters'):
        elastic.mix_n_match(model, fractions, 10)


def test_elastic_training_reports_every_prefix_and_resumes_bit_identically(tmp_path, monkeypatch):
    """Nested training (the largest prefix and one drawn per step): validation reports each fraction every
    epoch and the test split once; a run that crashes after its first checkpoint and resumes ends with the
    weights, optimizer and EMA of the uninterrupted one (the draws come from their own seeded stream)."""
    keys = dict(elastic_fractions=[0.25, 0.5, 1.0], epochs=2, model_ema=True, checkpoint_every_steps=5)
    full = train_mod.train(fmnist_cfg(tmp_path, output=str(tmp_path / 'full'), **keys))
    last = full['history'][-1]
    assert {'top1@0.25', 'top1@0.5', 'test_top1@0.25', 'test_top1@0.5'} <= set(last)
    assert all(0 <= float(last[k]) <= 100 for k in ('top1@0.25', 'test_top1@0.5'))
    train_crash_resume(monkeypatch, fmnist_cfg(tmp_path, output=str(tmp_path / 'crashed'), **keys), saves=2)
    assert_same_training_state(tmp_path / 'full' / 'last.pth', tmp_path / 'crashed' / 'last.pth')


def test_elastic_mae_training_reports_each_prefixes_reconstruction_loss(tmp_path):
    """``task: mae`` with ``elastic_fractions`` trained at the prefixes and reported nothing per prefix; each
    evaluation now gives each prefix's reconstruction loss, and a smaller prefix is a different model."""
    run = train_mod.train(fmnist_cfg(tmp_path, task='mae', decoder=dict(embed_dim=16, depth=1, num_heads=2),
                                     elastic_fractions=[0.25, 1.0], epochs=1, train_subset=256, val_subset=128))
    last = run['history'][-1]
    assert {'val_loss', 'val_loss@0.25'} <= set(last) and 'top1@0.25' not in last
    assert 0 < float(last['val_loss@0.25']) < 10 and float(last['val_loss@0.25']) != float(last['val_loss'])


def test_elastic_training_after_growth_trains_the_grown_models_prefixes(tmp_path):
    """Growth and nested training together: the fractions are of the grown counts after the step, so
    continued nested training makes the larger model elastic (each prefix reported after growth)."""
    g = dict(every_epochs=1, add_tokens=dict(qkv=8, proj=8, ffn=16))
    run = train_mod.train(fmnist_cfg(tmp_path, epochs=2, growth=g, elastic_fractions=[0.5, 1.0]))
    assert growth.token_counts(run['model']) == dict(patch=16, qkv=24, proj=24, ffn=80)
    assert [('top1@0.5' in r) for r in run['history']] == [True, True]


def test_elastic_keys_are_checked_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match=r'elastic_fractions must be a list of fractions in \(0, 1\]'):
        train_mod.train(fmnist_cfg(tmp_path, elastic_fractions=[0.5, 2]))
    with pytest.raises(ConfigError, match="elastic_sampling must be one of 'all', 'random', 'largest_plus_random'"):
        train_mod.train(fmnist_cfg(tmp_path, elastic_fractions=[0.5], elastic_sampling='every'))
    vit = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=2)
    with pytest.raises(ConfigError, match='elastic_fractions needs a model with parameter tokens'):
        train_mod.train(fmnist_cfg(tmp_path, model='vit_tiny_patch16_224', model_kwargs=vit, elastic_fractions=[0.5]))


def test_the_elastic_study_reports_every_config_it_trains():
    """Each quick-recipe config of ``studies/elastic/configs`` is read by the report (as a twin or an elastic
    method), so no trained run is silently left out of docs/elastic/results.csv; each names a config on disk."""
    import glob
    import os

    from studies.elastic import elastic_study as study
    on_disk = {os.path.basename(p)[:-5] for p in glob.glob(os.path.join(study.CONFIGS, '[!_]*.yaml'))}
    reported = set(study.TWINS.values()) | set(study.DISTILLED_TWINS.values()) | set(study.ELASTIC)
    assert reported == on_disk


def test_the_elastic_report_takes_gaps_to_the_twins_mean_and_compute_to_the_largest():
    """``results.csv`` arithmetic on hand-made points: a prefix's gap is its seed mean minus its twin's seed
    mean (validation), compute is a ratio to the largest TokenFormer alone, the MatFormer ViT (other sizes)
    gets no gap, and the last row is the four sizes trained separately."""
    from studies.elastic import elastic_study as study
    points = []
    for seed, (twin, el) in enumerate([(86.0, 85.0), (87.0, 85.5)]):
        for fraction, name in study.TWINS.items():
            points.append(dict(method='independent', config=name, seed=seed, prefix=fraction, params=10,
                               top1=twin + fraction, test_top1=0.0))
            points.append(dict(method='elastic', config='elastic', seed=seed, prefix=fraction, params=10,
                               top1=el + fraction, test_top1=0.0))
        points.append(dict(method='matformer_vit', config='matformer_vit', seed=seed, prefix=0.5, params=12,
                           top1=90.0, test_top1=0.0))
    compute = {'tokenformer_tokens_18': 1.0, 'tokenformer_tokens_36': 2.0, 'tokenformer_tokens_54': 3.0,
               'tokenformer_tokens_72': 4.0, 'elastic': 6.0, 'matformer_vit': 5.0}
    rows = {(r['method'], r['prefix']): r for r in study.summarize(points, compute)}
    elastic_half = rows[('elastic', 0.5)]
    assert elastic_half['top1_mean'] == 85.75 and elastic_half['seeds'] == 2
    assert elastic_half['gap_to_twin'] == pytest.approx(85.75 - 87.0)   # (85.5 + 86.0) / 2 - (86.5 + 87.5) / 2
    assert elastic_half['compute_vs_largest'] == 1.5 and rows[('independent', 0.25)]['compute_vs_largest'] == 0.25
    assert rows[('matformer_vit', 0.5)]['gap_to_twin'] is None
    assert rows[('independent', 'all')]['compute_vs_largest'] == 2.5   # (1 + 2 + 3 + 4) / 4
    # the gap's 95% interval by hand: Welch's se and degrees of freedom from the sample variances, t's quantile
    var_el, var_twin = 0.125, 0.5  # sample variances of (85.5, 86.0) and (86.5, 87.5)
    se = (var_el / 2 + var_twin / 2) ** 0.5
    df = (var_el / 2 + var_twin / 2) ** 2 / ((var_el / 2) ** 2 + (var_twin / 2) ** 2)  # 1.47
    from scipy import stats
    half = stats.t.ppf(0.975, df) * se
    assert (elastic_half['gap_low'], elastic_half['gap_high']) == (round(-1.25 - half, 2), round(-1.25 + half, 2))
    assert half > 1.0  # two seeds a side cannot place a gap within 0.3
    one_seed = study.gap_interval([86.0], [86.5, 87.5, 87.0])
    assert one_seed[0] == -1.0 and one_seed[2] - one_seed[1] == pytest.approx(
        2 * stats.t.ppf(0.975, 2) * 0.5 * (1 + 1 / 3) ** 0.5, abs=0.011)


def test_the_long_elastic_run_is_set_against_long_runs_on_file_of_its_sizes():
    """The long-recipe elastic config trains the 128-token long config at the prefixes its twins have, and each
    twin is a long comparison config on disk with that many tokens."""
    import os

    from studies.elastic import elastic_study as study
    from tkvision.engine.config import load_config
    elastic_cfg = load_config(study.LONG_CONFIG)
    assert elastic_cfg['elastic_fractions'] == list(study.LONG_TWINS)
    long_configs = os.path.join(os.path.dirname(study.CONFIGS), '..', 'comparison', 'configs', 'long')
    for fraction, name in study.LONG_TWINS.items():
        twin = load_config(os.path.join(long_configs, f'{name}.yaml'))
        assert twin['model_kwargs']['num_tokens'] == fraction * elastic_cfg['model_kwargs']['num_tokens']
        assert twin['epochs'] == elastic_cfg['epochs']


def test_the_long_report_sets_each_prefix_against_its_twins_mean(tmp_path, monkeypatch):
    """``long.csv`` arithmetic on a hand-made finished run and twins' rows: each prefix's figures are the
    run's last metrics row at that prefix, its parameters those of the model timm builds at the prefix's
    counts, the gap its top-1 minus the twin's seed mean, compute a ratio to the whole-size twin's."""
    import json

    from studies.elastic import elastic_study as study
    (tmp_path / 'result.json').write_text(json.dumps({}))
    (tmp_path / 'metrics.csv').write_text('epoch,top1,top1@0.5625,top1@0.75,test_top1,test_top1@0.5625,test_top1@0.75\n'
                                          '1,10,9,8,7,6,5\n2,91.5,90.25,91.0,90.5,89.75,90.0\n')
    twins = {name: dict(params=0, seeds=3, top1_mean=90.0 + i, test_top1_mean=89.0 + i, train_tflops=2.0 * (i + 1))
             for i, name in enumerate(study.LONG_TWINS.values())}
    monkeypatch.setattr(study, 'training_compute', lambda cfg: 10e12)
    model = timm.create_model('tokenformer_vit_ti16', **KW)
    rows = {r['prefix']: r for r in study.long_rows(str(tmp_path), {}, model, twins)}
    assert [rows[f]['top1'] for f in study.LONG_TWINS] == [90.25, 91.0, 91.5]
    assert [rows[f]['test_top1'] for f in study.LONG_TWINS] == [89.75, 90.0, 90.5]
    assert [rows[f]['gap_to_twin'] for f in study.LONG_TWINS] == [0.25, 0.0, -0.5]
    assert [rows[f]['test_gap_to_twin'] for f in study.LONG_TWINS] == [0.75, 0.0, -0.5]
    assert [rows[f]['tokens'] for f in study.LONG_TWINS] == [9, 12, 16]
    built = timm.create_model('tokenformer_vit_ti16', **{**KW, 'num_tokens': 9})
    assert rows[0.5625]['params'] == sum(p.numel() for p in built.parameters())
    assert rows[1.0]['compute_vs_largest'] == round(10 / 6, 3)
    assert rows[0.5625]['twin_compute_vs_largest'] == round(2 / 6, 3)
    assert rows['all']['compute_vs_largest'] == 2.0   # (2 + 4 + 6) / 6


def test_the_long_report_names_an_unfinished_run_and_a_missing_twin(tmp_path):
    from studies.elastic import elastic_study as study
    from tkvision.utils.errors import UsageError
    twins = tmp_path / 'results.csv'
    twins.write_text('config,params\ntokenformer_num_tokens_96,1\n')
    with pytest.raises(UsageError, match='tokenformer_token_lr_quarter, tokenformer_num_tokens_128'):
        study.report_long(str(tmp_path), 0, str(twins), str(tmp_path / 'out'))
    with pytest.raises(UsageError, match='seed 0 has not finished.*elastic_128.yaml'):
        study.report_long(str(tmp_path), 0, study.LONG_RESULTS, str(tmp_path / 'out'))


def test_an_earlier_points_file_reads_back_as_the_report_wrote_it(tmp_path):
    """``report --keep-points``: the rows of an earlier ``points.csv`` come back with their numbers (a per-block
    Mix'n'Match prefix stays a string), and a file without the report's columns is refused by name."""
    from studies.elastic import elastic_study as study
    rows = [dict(method='elastic', config='elastic', seed=1, prefix=0.25, params=171388, top1=85.81, test_top1=84.53,
                 machine='AMD EPYC, 2 cores', commit='abc1234'),
            dict(method='mix_n_match', config='elastic', seed=0, prefix='0.5 0.5 1', params=422830, top1=86.9,
                 test_top1=85.6, machine='unknown', commit='unknown')]
    study._write_csv(rows, str(tmp_path / 'points.csv'), study.POINT_COLUMNS)
    assert study.read_points(str(tmp_path / 'points.csv')) == rows
    # a file from before the machine and commit columns reads as 'unknown'
    (tmp_path / 'older.csv').write_text('method,config,seed,prefix,params,top1,test_top1\nelastic,elastic,1,0.25,171388,'
                                        '85.81,84.53\n')
    assert study.read_points(str(tmp_path / 'older.csv'))[0] == dict(rows[0], machine='unknown', commit='unknown')
    (tmp_path / 'other.csv').write_text('config,seed\nx,0\n')
    with pytest.raises(Exception, match="lacks the columns"):
        study.read_points(str(tmp_path / 'other.csv'))
    (tmp_path / 'utf16.csv').write_text((tmp_path / 'points.csv').read_text(), encoding='utf-16')
    with pytest.raises(Exception, match=r'--keep-points .*utf16\.csv is not UTF-8 text'):  # was UnicodeDecodeError
        study.read_points(str(tmp_path / 'utf16.csv'))


def test_a_per_layer_prefix_the_model_cannot_be_built_with_is_refused_by_name():
    """``{'blocks.0.attn.q': 4}`` left k and v at 16 tokens, and the copy described itself as ``num_tokens_qkv: 16``
    (the last layer of the block won), so timm built a model its weights did not fit. The model takes one count per
    kind and block: such a prefix is refused naming both layers; q, k and v together describe themselves."""
    torch.manual_seed(0)
    m = timm.create_model('tokenformer_vit_ti16', **KW).eval()
    with pytest.raises(ValueError, match=r'blocks\.0\.attn\.q has 4 tokens and blocks\.0\.attn\.k 16'):
        elastic.extract_prefix(m, {'blocks.0.attn.q': 4})
    qkv = {f'blocks.0.attn.{p}': 4 for p in 'qkv'}
    small = elastic.extract_prefix(m, qkv)
    kwargs = elastic.prefix_model_kwargs(small)
    assert kwargs['num_tokens_qkv'] == [4, 16, 16]  # one per block
    built = timm.create_model('tokenformer_vit_ti16', **{**KW, **kwargs}).eval()
    built.load_state_dict(small.state_dict())  # strict: every shape fits
    x = torch.randn(2, KW.get('in_chans', 3), KW['img_size'], KW['img_size'])
    with torch.no_grad(), elastic.prefix(m, qkv):
        torch.testing.assert_close(built(x), m(x), rtol=1e-5, atol=1e-6)
