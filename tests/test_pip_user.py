"""A pip user's first contact: the recipes in the wheel, and the rough edges a new user met,
each with a test that failed before."""
import glob
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

from tkvision.engine.config import load_config
from tkvision.engine.recipes import RECIPES_DIR, list_recipes
from tkvision.utils.errors import ConfigError

from .helpers import ROOT

FMNIST_TINY = ['--train_subset', '256', '--val_subset', '128', '--epochs', '1', '--batch_size', '64',
               '--threads', '1', '--progress', 'false',
               '--model_kwargs', '{img_size: 28, patch_size: 7, in_chans: 1, embed_dim: 16, depth: 1, num_heads: 1, '
               'num_tokens: 8}']


def _fresh_venv_with_wheel(tmp_path) -> str:
    """Build this checkout's wheel (no build isolation: nothing is downloaded) and install it, without
    its dependencies, into a new virtual environment that sees this interpreter's packages behind its
    own (a .pth line), so ``tkvision`` can only come from the wheel. Returns the venv's bin folder."""
    wheels = tmp_path / 'wheels'
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation', '-w', str(wheels),
                    ROOT], check=True, capture_output=True, cwd=tmp_path)
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    subprocess.run([sys.executable, '-m', 'pip', '--python', str(venv / 'bin' / 'python'), 'install', '-q',
                    '--no-deps', '--no-compile', *glob.glob(str(wheels / 'tkvision-*.whl'))], check=True,
                   capture_output=True)
    site = glob.glob(str(venv / 'lib' / 'python*' / 'site-packages'))[0]
    deps = [p for p in sys.path if p.endswith('site-packages')]  # torch, timm, ... (a .pth's folders come last)
    with open(os.path.join(site, 'zz_test_dependencies.pth'), 'w') as f:
        f.write('\n'.join(deps) + '\n')
    return str(venv / 'bin')


def test_the_wheel_holds_the_library_and_recipes_not_the_studies(tmp_path):
    """``pip wheel .`` lists the package and its recipes only: no module of ``studies/`` (by file name, so a
    study copied back into the package is caught too) and no study config (by its contents)."""
    import zipfile
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation', '-w',
                    str(tmp_path), ROOT], check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = glob.glob(str(tmp_path / 'tkvision-*.whl'))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        shipped_yaml = {z.read(n) for n in names if n.endswith('.yaml')}
    assert {n.split('/')[0] for n in names} == {'tkvision', os.path.basename(wheel).split('-py')[0] + '.dist-info'}
    assert any(n.startswith('tkvision/configs/imagenet/') for n in names)  # the recipes are there
    study_modules = {os.path.basename(p) for p in glob.glob(f'{ROOT}/studies/*/*.py')} - {'__init__.py'}
    assert study_modules and not study_modules & {os.path.basename(n) for n in names}
    study_configs = glob.glob(f'{ROOT}/studies/*/configs/**/*.yaml', recursive=True)
    assert study_configs and not [p for p in study_configs if open(p, 'rb').read() in shipped_yaml]


@pytest.mark.slow
def test_the_wheel_ships_the_recipes_and_runs_one_from_outside_the_repository(tmp_path):
    """``pip wheel .`` held the package only: a pip user had no recipe to run. Now the wheel's
    ``tkvision-train --config fashion_mnist/quick`` trains from a folder with no checkout, and
    ``--list-recipes`` lists the ImageNet recipes too."""
    bin_dir = _fresh_venv_with_wheel(tmp_path)
    outside = tmp_path / 'elsewhere'
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    where = subprocess.run([f'{bin_dir}/python', '-c', 'import tkvision; print(tkvision.__file__)'], cwd=outside,
                           env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(tmp_path / 'venv')), where  # the wheel's copy, not this checkout's
    listing = subprocess.run([f'{bin_dir}/tkvision-train', '--list-recipes'], cwd=outside, env=env,
                             capture_output=True, text=True, check=True).stdout
    assert 'imagenet/tokenformer_vit_b16 ' in listing
    run = subprocess.run([f'{bin_dir}/tkvision-train', '--config', 'fashion_mnist/quick', '--output', 'run', *FMNIST_TINY],
                         cwd=outside, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert 'final validation top-1' in run.stdout
    assert os.path.isfile(outside / 'run' / 'last.safetensors')


def test_a_shipped_recipe_is_found_by_name_when_no_such_file_exists(tmp_path, monkeypatch):
    """``--config imagenet/tokenformer_vit_b16`` (no file of that name here) reads the shipped recipe, the
    same config as its file path; a name that is neither says how to list the recipes."""
    monkeypatch.chdir(tmp_path)
    by_path = load_config(os.path.join(RECIPES_DIR, 'imagenet', 'tokenformer_vit_b16.yaml'))
    for name in ('imagenet/tokenformer_vit_b16', 'imagenet/tokenformer_vit_b16.yaml',
                 'configs/imagenet/tokenformer_vit_b16.yaml'):
        assert load_config(name) == by_path, name
    assert by_path['model'] == 'tokenformer_vit_b16'
    with pytest.raises(ConfigError, match=r'config file not found: imagenet/nope .*--list-recipes'):
        load_config('imagenet/nope')
    mine = tmp_path / 'imagenet'  # a file of the user's own wins over a shipped recipe of the same name
    mine.mkdir()
    (mine / 'tokenformer_vit_b16.yaml').write_text('epochs: 3\n')
    assert load_config('imagenet/tokenformer_vit_b16.yaml')['epochs'] == 3


def test_list_recipes_names_each_recipe_with_what_it_reproduces_and_its_figures():
    """Every YAML file but the shared bases, with its header's first sentence and its target sentences."""
    recipes = {r['name']: r for r in list_recipes()}
    on_disk = {os.path.relpath(p, RECIPES_DIR)[:-5] for p in glob.glob(os.path.join(RECIPES_DIR, '**', '*.yaml'),
                                                                        recursive=True)
               if not os.path.basename(p).startswith('_')}
    assert set(recipes) == on_disk
    quick = recipes['fashion_mnist/quick']
    assert quick['summary'] == "Fashion-MNIST quick recipe: the README's main job."
    assert quick['figures'].startswith('Expected: >= 85% test top-1 in <= 10 min')
    # the measured figures are inline values (tools/render_docs.py): listed without their markers
    assert re.search(r'Latest measured .*: \d+\.\d\d% test top-1', quick['figures']) and '<!--' not in quick['figures']
    out = subprocess.run([sys.executable, 'tools/train.py', '--list-recipes'], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert 'fashion_mnist/quick ' in out
    assert f'{len(recipes)} recipes in' in out


def test_more_threads_than_cores_warns_naming_the_core_count(monkeypatch):
    """``--threads 999`` on 2 cores ran about 30x slower without a word."""
    from tkvision.engine.distributed import ProcessConfig
    from tkvision.engine.distributed import setup_threads
    before = torch.get_num_threads()
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1})
    monkeypatch.delenv('LOCAL_WORLD_SIZE', raising=False)
    try:
        with pytest.warns(UserWarning, match=r'threads: 999 is more than the 2 cores .*set threads: 2'):
            setup_threads(ProcessConfig(threads=999))
        with warnings.catch_warnings():
            warnings.simplefilter('error')  # within the cores: no warning
            setup_threads(ProcessConfig(threads=2))
            setup_threads(ProcessConfig(threads=None))
    finally:
        torch.set_num_threads(before)


def test_render_docs_names_the_file_line_and_columns_of_a_misspelt_column(tmp_path):
    """``render_docs.py --check`` with a misspelt column ended in a raw ``KeyError: 'train_minutez'``."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('render_docs', os.path.join(ROOT, 'tools', 'render_docs.py'))
    docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs)
    source = tmp_path / 'r.csv'
    source.write_text('name,train_minutes\nquick,10.7\n')
    text = f'intro\n\n<!-- table {source} | run={{name}} | min={{train_minutez:.1f}} -->\n<!-- end table -->\n'
    with pytest.raises(docs.SpecError) as e:
        docs.update(text, 'README.md')
    assert str(e.value) == (f"README.md:3: column 'train_minutez' is not in {source} (its columns: name, "
                            "train_minutes)")
    with pytest.raises(docs.SpecError, match=r'README.md:3: results file .*nope.csv not found'):
        docs.update(text.replace(str(source), str(tmp_path / 'nope.csv')), 'README.md')


def test_the_timm_script_shim_without_arguments_says_the_usage_and_what_is_missing():
    """It said "no script is not a file"."""
    res = subprocess.run([sys.executable, '-m', 'tkvision.cli.timm_script'], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    assert lines[0] == 'usage: python -m tkvision.cli.timm_script path/to/timm_script.py [its arguments]'
    assert lines[1].startswith('the path of the timm script to run is missing')
    assert 'is not a file' not in res.stderr
