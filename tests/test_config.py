"""Configs: inheritance, overrides, unknown keys; every shipped recipe loads."""
import csv
import glob
import os
import sys

import pytest

from tkvision.engine.config import ConfigError, load_config, parse_overrides, section
from tkvision.engine.optim import resolve_accum_steps, resolve_lr

from .helpers import ROOT


def test_base_inheritance_and_overrides(tmp_path):
    (tmp_path / 'base.yaml').write_text('epochs: 5\nlr: 0.1\ngrowth: {every_epochs: 2}\n')
    (tmp_path / 'child.yaml').write_text('_base_: base.yaml\nlr: 0.2\ngrowth: {add_tokens: {qkv: 8}}\n')
    cfg = load_config(str(tmp_path / 'child.yaml'), ['--epochs', '7', '--growth.key_init=normal'])
    assert cfg['epochs'] == 7 and cfg['lr'] == 0.2
    assert cfg['growth']['every_epochs'] == 2 and cfg['growth']['add_tokens'] == {'qkv': 8}
    assert cfg['growth']['key_init'] == 'normal' and cfg['growth']['value_init'] == 'normal'


def test_ablation_configs_change_one_thing():
    base = load_config(os.path.join(ROOT, 'configs/ablations/fashion_mnist/_base_.yaml'))
    cfg = load_config(os.path.join(ROOT, 'configs/ablations/fashion_mnist/norm_softmax.yaml'))
    assert cfg['model_kwargs'] == dict(base['model_kwargs'], score_norm='softmax')
    cfg = load_config(os.path.join(ROOT, 'configs/ablations/imagenet/ln_weight.yaml'))
    assert cfg['model'] == 'tokenformer_vit_b16' and cfg['model_kwargs'] == {'block_norm_weight': True}
    assert cfg['weight_decay'] == 0.3 and cfg['epochs'] == 300  # the MAE recipe, through two _base_ levels


def test_the_long_comparison_trains_the_long_recipe():
    """The long-recipe comparison (studies/comparison/configs/long/) restates long.yaml's training keys
    because long.yaml's model keys would merge into the ViT's; this holds the two recipes to the same keys.
    A lever config differs in its levers alone (the keys it is named after, and the token rate and decay that
    long.yaml took from the recipe chosen on validation)."""
    long = load_config(os.path.join(ROOT, 'configs', 'fashion_mnist', 'long.yaml'))
    token = {'parameter_token_lr_scale', 'parameter_token_weight_decay'}
    levers = {'tokenformer_token_lr_half_no_drop_path.yaml': {'drop_path_rate'},
              'tokenformer_token_lr_quarter_warmup5.yaml': {'warmup_epochs'},
              'tokenformer_num_tokens_96_drop_path_0_2.yaml': {'drop_path_rate'}}
    paths = glob.glob(os.path.join(ROOT, 'studies', 'comparison', 'configs', 'long', '[!_]*.yaml'))
    assert set(levers) <= {os.path.basename(p) for p in paths}
    for path in paths:
        cfg = load_config(path)
        # threads: the studies pin it for their timings; the recipe leaves it to the machine (default_threads)
        allowed = {'model', 'model_kwargs', 'output', 'threads'} | token | levers.get(os.path.basename(path), set())
        differ = {k for k in cfg if cfg[k] != long[k]} - allowed
        assert not differ, f'{path} trains another recipe than long.yaml: {sorted(differ)}'


def test_make_train_long_runs_the_recipe_chosen_on_validation():
    """``make train-long`` (configs/fashion_mnist/long.yaml) trains, key for key but its folder, the comparison's
    recipe that tools/headline.py's rule chooses on validation from docs/comparison/long/results.csv."""
    sys.path.insert(0, os.path.join(ROOT, 'tools'))
    try:
        import headline
    finally:
        sys.path.pop(0)
    with open(os.path.join(ROOT, 'docs', 'comparison', 'long', 'results.csv')) as f:
        chosen = headline.chosen_long_recipe({r['config']: r for r in csv.DictReader(f)})['config']
    long = load_config(os.path.join(ROOT, 'configs', 'fashion_mnist', 'long.yaml'))
    study = load_config(os.path.join(ROOT, 'studies', 'comparison', 'configs', 'long', chosen + '.yaml'))
    differ = {k for k in long if long[k] != study[k]} - {'output', 'threads'}  # threads: the machine's (study: pinned)
    assert not differ, f'long.yaml differs from {chosen}.yaml, the recipe chosen on validation: {sorted(differ)}'


@pytest.mark.parametrize('recipe, measured', [
    ('quick', 'studies/cifar10/configs/quick/levers/token_lr_quarter.yaml'),
    ('long', 'studies/cifar10/configs/long/tokenformer_p4.yaml')])
def test_a_cifar10_recipe_trains_what_its_header_measured(recipe, measured):
    """configs/cifar10/{quick,long}.yaml quote the figures of a studies config in their headers; the recipe must
    train that config key for key but its folder and threads, or the figures belong to another recipe (the long
    recipe inherits the quick one's keys, so a default changed in quick.yaml moves it too)."""
    cfg = load_config(os.path.join(ROOT, 'configs', 'cifar10', recipe + '.yaml'))
    study = load_config(os.path.join(ROOT, measured))
    differ = {k for k in set(cfg) | set(study) if cfg.get(k) != study.get(k)} - {'output', 'threads'}
    assert not differ, f'configs/cifar10/{recipe}.yaml differs from {measured}, whose runs its header quotes: ' \
        f'{sorted(differ)}'


def test_unknown_key_is_named(tmp_path):
    (tmp_path / 'bad.yaml').write_text('epochs: 5\nlearning_rate: 0.1\n')
    with pytest.raises(ConfigError, match="unknown config key 'learning_rate' in .*bad.yaml"):
        load_config(str(tmp_path / 'bad.yaml'))
    with pytest.raises(ConfigError, match="unknown config key 'epoch' in command line"):
        load_config(None, ['--epoch', '3'])
    with pytest.raises(ConfigError, match="'every' in command line:growth"):
        load_config(None, ['--growth.every', '3'])


def test_override_parsing_and_errors():
    assert parse_overrides(['--lr', '1e-3', '--opt-betas', '[0.9, 0.95]', '--amp', 'null']) == \
        {'lr': 1e-3, 'opt_betas': [0.9, 0.95], 'amp': None}
    with pytest.raises(ConfigError, match='no value'):
        parse_overrides(['--lr'])
    with pytest.raises(ConfigError, match='expected --key'):
        parse_overrides(['lr', '3'])
    with pytest.raises(ConfigError, match='amp'):
        load_config(None, ['--amp', 'fp8'])


def test_lr_scaling_and_accumulation():
    cfg = load_config(os.path.join(ROOT, 'configs/imagenet/tokenformer_vit_b16.yaml'))
    optim, batch = section(cfg, 'optim'), cfg['batch_size']
    assert resolve_accum_steps(optim, batch, 8) == 4 and resolve_accum_steps(optim, batch, 32) == 1
    assert resolve_lr(optim, batch, 8) == pytest.approx(1.6e-3)  # MAE: blr 1e-4 * 4096 / 256
    with pytest.raises(ConfigError, match='multiple'):
        resolve_accum_steps(optim, batch, 3)


@pytest.mark.parametrize('path', sorted(glob.glob(os.path.join(ROOT, 'configs/**/*.yaml'), recursive=True)))
def test_every_shipped_config_loads_and_builds_its_model(path):
    """Every shipped config, shared bases included, loads, resolves its data keys and builds its model
    (MAE around its encoder for ``task: mae``) on the meta device (no memory); a Fashion-MNIST config's
    model takes Fashion-MNIST's images. A shared base that names no model (its points do) is inherited
    by some config of its folder."""
    import torch
    import yaml

    from tkvision.engine.config import model_for_config, resolve_run_config
    from tkvision.engine.trainer import check_model_input
    with open(path) as f:
        raw = yaml.safe_load(f)
    cfg = resolve_run_config(load_config(path))
    if 'model' not in raw and os.path.basename(path).startswith('_'):
        folder, name = os.path.dirname(path), os.path.basename(path)
        children = [p for p in glob.glob(os.path.join(folder, '*.yaml'))
                    if (yaml.safe_load(open(p)) or {}).get('_base_') == name]
        assert children, f'{path} names no model and no config of its folder inherits it'
        return
    with torch.device('meta'):
        model = model_for_config(cfg)
    assert sum(p.numel() for p in model.parameters()) > 0 and cfg.optim.epochs > 0
    check_model_input(model, cfg.model.model, cfg.data)  # raises ConfigError naming both shapes


def test_every_study_config_resolves_and_its_model_takes_its_images():
    """A study's config (``studies/*/configs``, run by the command in its header) resolves, bases included, and its
    model takes its data's images, before anyone spends a run on it: a misspelt key or a model of the wrong input
    size is named here, not hours into a sweep."""
    import torch

    import studies.elastic.matformer_vit  # noqa: F401  (the elastic study's baseline, registered as its driver does)
    from tkvision.engine.config import model_for_config, resolve_run_config
    from tkvision.engine.trainer import check_model_input
    failed = []
    for path in sorted(glob.glob(os.path.join(ROOT, 'studies', '*', 'configs', '**', '[!_]*.yaml'), recursive=True)):
        try:
            cfg = resolve_run_config(load_config(path))
            with torch.device('meta'):
                check_model_input(model_for_config(cfg), cfg.model.model, cfg.data)
        except ConfigError as e:
            failed.append(f'{os.path.relpath(path, ROOT)}: {e}')
    assert failed == []


def _leaf_keys(mapping, prefix=''):
    """Dotted keys of a config's leaves (free mappings, empty in the defaults, are leaves)."""
    out = set()
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            out |= _leaf_keys(value, f'{prefix}{key}.')
        else:
            out.add(prefix + key)
    return out


def test_the_rules_and_the_defaults_name_the_same_keys():
    from tkvision.engine.config import DEFAULTS, RULES
    assert set(RULES) == _leaf_keys(DEFAULTS)


def test_the_sections_partition_the_keys_and_each_builder_gets_its_own():
    from tkvision.engine.config import DEFAULTS, SECTIONS, section
    keys = [k for keys in SECTIONS.values() for k in keys]
    assert len(keys) == len(set(keys)) and set(keys) == set(DEFAULTS)
    cfg = load_config(None, dict(lr=3e-3, batch_size=32, growth=dict(every_epochs=2)))
    assert section(cfg, 'optim').lr == 3e-3 and not hasattr(section(cfg, 'optim'), 'batch_size')
    assert section(cfg, 'data').batch_size == 32 and section(cfg, 'growth').every_epochs == 2


def test_typed_sections_are_frozen_all_the_way_down_and_give_the_flat_config_back():
    """A part cannot change what it was handed (a field, a list, a mapping), and ``to_dict`` is the flat
    config the file and the command line said, key for key."""
    import dataclasses

    from tkvision.engine.config import TrainConfig
    cfg = load_config(None, {'model_kwargs': {'num_tokens': 8}, 'elastic_fractions': [0.5, 1.0],
                             'growth': {'schedule': [{'at_epoch': 2, 'to': {'ffn': 16}}]}, 'epochs': 4})
    config = TrainConfig.from_dict(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.optim.lr = 1.0
    with pytest.raises(TypeError):
        config.model.model_kwargs['num_tokens'] = 9
    with pytest.raises(TypeError):
        config.growth.schedule[0]['at_epoch'] = 3
    assert config.loss.elastic_fractions == (0.5, 1.0) and config.mae.decoder.embed_dim == 512
    assert config.to_dict() == cfg and list(config.to_dict()) == list(cfg)


def test_a_typed_config_is_validated_at_the_edge_like_a_flat_one():
    """``train()`` takes a flat config or a ``TrainConfig``; both pass the same one check at the edge, so a typed
    config built by hand with a bad value is refused naming the key, before any work."""
    import dataclasses

    from tkvision.engine.config import TrainConfig, resolve_run_config
    cfg = load_config(None, dict(lr=3e-3, epochs=2))
    assert resolve_run_config(TrainConfig.from_dict(cfg)) == resolve_run_config(cfg)
    config = TrainConfig.from_dict(cfg)
    bad = dataclasses.replace(config, optim=dataclasses.replace(config.optim, lr=-1.0))
    with pytest.raises(ConfigError, match='^lr must be a number > 0'):
        resolve_run_config(bad)
    assert resolve_run_config(cfg).data.mean == (0.2860,)  # the model's data keys filled in at the edge


def test_every_config_field_has_a_type_and_a_docstring():
    """docs/reference/config.md reads each key's meaning from the docstring under its field, wherever its section
    is declared."""
    import ast
    import dataclasses
    import inspect

    from tkvision.engine.build import DecoderConfig
    from tkvision.engine.config import SECTION_CLASSES, TrainConfig
    classes = [*SECTION_CLASSES.values(), DecoderConfig, TrainConfig]
    documented = set()
    for cls in classes:
        node = ast.parse(inspect.getsource(cls)).body[0]
        for field, doc in zip(node.body, node.body[1:]):
            if isinstance(field, ast.AnnAssign) and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
                documented.add(f'{node.name}.{field.target.id}')
    every = {f'{cls.__name__}.{f.name}' for cls in classes for f in dataclasses.fields(cls)}
    assert every - documented == set()


def test_a_renamed_key_still_reads_in_files_overrides_and_checkpoints(tmp_path):
    """``freeze_old_tokens`` (top level) is ``freeze_loaded_tokens`` now: one name per concept."""
    from tkvision.engine.config import config_changes
    path = tmp_path / 'old.yaml'
    path.write_text('init_from: w.safetensors\nfreeze_old_tokens: true\n')
    assert load_config(str(path))['freeze_loaded_tokens'] is True
    assert load_config(None, ['--init_from', 'w.safetensors', '--freeze_old_tokens', 'true'])['freeze_loaded_tokens']
    old = {k: v for k, v in load_config(None).items() if k != 'freeze_loaded_tokens'}
    old['freeze_old_tokens'] = False  # a checkpoint's config of the earlier release
    assert config_changes(old, load_config(None)) == ([], [])


def test_derive_seed_is_the_one_seed_derivation():
    """Seeds depend on what they name only, stay in range, and neighbours are unrelated (not seed + i)."""
    from tkvision.utils.seeding import derive_seed
    seeds = [derive_seed(0, 0, i) for i in range(1000)]
    assert seeds == [derive_seed(0, 0, i) for i in range(1000)] and all(0 <= s < 2 ** 32 for s in seeds)
    assert len(set(seeds)) == 1000 and sum(b - a == 1 for a, b in zip(seeds, seeds[1:])) == 0
    assert all(0 <= derive_seed('step', 0, 1, i, bits=31) < 2 ** 31 for i in range(100))
    assert derive_seed('growth', 0, 2) != derive_seed('growth', 1, 2) != derive_seed('growth', 0, 3)
    for bits in (0, 33):
        with pytest.raises(ValueError, match='bits'):
            derive_seed(0, bits=bits)


def test_a_rule_stores_a_value_as_its_type_not_as_its_words_say():
    """``key()``'s rule carries the type a value is stored as (``Rule.coerce``): an integer rule stores ``300.0`` as
    ``300``; a rule whose message merely begins with "an integer" changes nothing (coercion reads the type, not the
    words of a message)."""
    from tkvision.utils.config_fields import integer, rule
    stored = integer(1).normalize(300.0)
    assert stored == 300 and type(stored) is int and integer(1, null=True).normalize(None) is None
    assert rule(lambda v: True, 'an integer, or a fraction of the epochs').normalize(0.5) == 0.5
    cfg = load_config(None, ['--epochs', '300.0'])
    assert cfg['epochs'] == 300 and type(cfg['epochs']) is int


def test_validation_returns_a_normalised_copy_and_leaves_its_input_as_it_was():
    """``validate_config`` checks a config and returns it normalised (integer keys as ints, growth steps placed at
    their epochs and filled, NaFlex lengths as ints) without rewriting the mapping it was given."""
    import copy

    from tkvision.engine.config import DEFAULTS, merge, validate_config
    given = merge(DEFAULTS, dict(epochs=10.0, growth=dict(schedule=[dict(at_fraction=0.5, to={'ffn': 8})])))
    before = copy.deepcopy(given)
    out = validate_config(given)
    assert given == before  # untouched: still 10.0 and at_fraction
    assert type(out['epochs']) is int and out['growth']['schedule'] == [
        dict(at_epoch=5, to={'ffn': 8}, warmup_epochs=0.0, lr_scale=1.0)]


def test_the_growth_schedule_is_checked_beside_its_section():
    """The growth section's own checks live with ``GrowthConfig`` (``tkvision.engine.optim.check_growth``): a step
    placed past the run, an unknown key and a warmup longer than its stage are each named."""
    from tkvision.engine.optim import check_growth
    growth = load_config(None)['growth']
    assert check_growth(growth, 10, 1.0) == growth
    with pytest.raises(ConfigError, match=r'growth.schedule\[0\].at_epoch must be an integer in 1 .. 9'):
        check_growth(dict(growth, schedule=[dict(at_epoch=12, to={'ffn': 8})]), 10, 1.0)
    with pytest.raises(ConfigError, match=r"growth.schedule\[0\]: unknown key 'at'"):
        check_growth(dict(growth, schedule=[dict(at=3, to={'ffn': 8})]), 10, 1.0)
    with pytest.raises(ConfigError, match=r'growth.schedule\[0\].warmup_epochs must be >= 0 and shorter'):
        check_growth(dict(growth, schedule=[dict(at_epoch=8, to={'ffn': 8}, warmup_epochs=3)]), 10, 1.0)


def test_a_data_source_fixes_its_images_and_its_split():
    """What a source fixes of its images and its carved validation split is the source's
    (``DataSource.image_settings``, ``DataSource.val_split_fraction``): a registered source resolves the null data
    keys from them as Fashion-MNIST does, no name compared; the model check reads them too."""
    import dataclasses

    import torch

    from tkvision.data import DataConfig, resolve_data_cfg
    from tkvision.data.registry import _SOURCES, DataSource, register_data_source
    from tkvision.engine.build import create_model
    from tkvision.engine.trainer import check_model_input
    settings = dict(img_size=12, mean=[0.5, 0.5], std=[0.25, 0.25], crop_pct=1.0, interpolation='bilinear')
    register_data_source('two_channel', DataSource(lambda *a: None, needs_data_dir=False, num_classes=3, channels=2,
                                                   image_settings=settings, val_split_fraction=0.25))
    try:
        data = resolve_data_cfg(DataConfig(dataset='two_channel'), 'tokenformer_vit_ti16', {})
        assert (data.img_size, data.mean, data.std, data.val_split_fraction) == (12, (0.5, 0.5), (0.25, 0.25), 0.25)
        with torch.device('meta'):
            fits = create_model('tokenformer_vit_ti16', img_size=12, patch_size=4, in_chans=2, num_tokens=8)
            wrong = create_model('tokenformer_vit_ti16', img_size=16, patch_size=4, in_chans=2, num_tokens=8)
        check_model_input(fits, 'tokenformer_vit_ti16', data)
        with pytest.raises(ConfigError, match=r"takes 16 x 16 px images and the data section makes them 12 x 12"):
            check_model_input(wrong, 'tokenformer_vit_ti16', data)
        fashion = resolve_data_cfg(DataConfig(), 'tokenformer_vit_ti16', {'img_size': 28})
        assert fashion.val_split_fraction == pytest.approx(1 / 6) and fashion.mean == (0.2860,)
        assert dataclasses.replace(data, val_split_fraction=0.0).val_split_fraction == 0.0
    finally:
        _SOURCES.pop('two_channel')


def test_evaluation_runs_in_the_precision_of_the_device_plan():
    """Evaluation autocasts as training does: the dtype of the run's device plan (``DevicePlan.autocast_dtype``),
    not a second reading of the ``amp`` key; the evaluator of a bf16 plan evaluates under bf16 autocast."""
    import torch

    from tkvision.engine.distributed import Processes, device_plan
    from tkvision.engine.evaluate import evaluate
    from tkvision.engine.run_eval import RunEvaluator
    seen: list = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.get_autocast_dtype('cpu') if torch.is_autocast_enabled('cpu') else None)
            return torch.zeros(len(x), 3)
    loader = [(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.long), [])]
    from types import SimpleNamespace

    from tkvision.engine.tasks import TASKS
    plan = device_plan('cpu', amp='bf16')
    evaluator = RunEvaluator(SimpleNamespace(preprocess=lambda x: x.float()), SimpleNamespace(task=TASKS['classify']),
                             Processes(0, 1, plan), 0, 'probe', 'unused')
    assert evaluator.context.autocast_dtype is torch.bfloat16 is plan.autocast_dtype
    evaluate(Probe(), loader, 'cpu', lambda x: x.float(), evaluator.context.autocast_dtype)
    evaluate(Probe(), loader, 'cpu', lambda x: x.float(), device_plan('cpu').autocast_dtype)
    assert seen == [torch.bfloat16, None]
