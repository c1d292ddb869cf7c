"""Every generated table in README.md and docs/ equals its results file (tools/render_docs.py): a
figure changed in a results file and not in the docs, or typed into a table by hand, fails CI."""
import importlib.util
import subprocess
import sys

from .helpers import ROOT


def _render_docs():
    spec = importlib.util.spec_from_file_location('render_docs', f'{ROOT}/tools/render_docs.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_table_equals_its_results_file():
    res = subprocess.run([sys.executable, 'tools/render_docs.py', '--check'], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_a_table_typed_by_hand_is_caught(tmp_path):
    """The check can fail: a table whose figure differs from its CSV by one digit is reported stale,
    and rendering restores the file's figure."""
    docs = _render_docs()
    source = tmp_path / 'r.csv'
    source.write_text('config,top1_mean,seeds\nnorm_gelu_l2,86.554,0 1 2\n')
    spec = f'{source} | point={{config}} | top-1={{top1_mean:.2f}} | seeds={{seeds}}'
    good = f'<!-- table {spec} -->\n| point | top-1 | seeds |\n|---|---|---|\n| norm_gelu_l2 | 86.55 | 0 1 2 |\n<!-- end table -->'
    assert docs.update(good) == (good, [])
    edited = good.replace('86.55', '86.56')
    new, stale = docs.update('intro\n' + edited + '\nafter\n')
    assert stale == [spec] and new == 'intro\n' + good + '\nafter\n'
