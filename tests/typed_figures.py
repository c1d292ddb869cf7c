"""Figures typed by hand into what a reader reads: the README, every hand-written page under docs/, the configs'
headers and the docstrings the site's API page renders.

A measured figure belongs in a results file and reaches a page through a ``value``, ``compare`` or ``table`` marker
(tools/render_docs.py), which a test holds equal to the file. Anything else that looks like a figure must be listed in
``tests/typed_figures.csv`` by its **context** (an excerpt of the text around it, so the same string elsewhere on the
page is not covered) with its source: a setting, a paper's table, a closed form. `loose_figures` lists the rest.

What counts as a figure (`FIGURE`): a decimal (``0.61``, ``.61``), a number with thousands separators (``1,334``), a
whole number followed by ``%``, ``img/s`` or ``-fold`` or joined to ``x`` / ``×`` (``61 %``, ``2x``; ``4 x 4``, a
shape, is not one), and a figure in words (``sixty percent``, ``three times``, ``twice the``, ``half as``,
``doubling``). Inside code spans and fenced
blocks too: there a value given to a key, an option or a call, or a column's suffix (``key_std: 0.1``,
``--lr 0.002``, ``prefix(model, 0.5)``, ``top1@0.25``) is a setting and not counted, a figure elsewhere in the code (an output line) is.
In a config's header a figure equal to a number the config sets is its own setting (`settings_spared`).
Not counted anywhere (`SETTING_PHRASES`): the project's fixed "95% interval", a count of images (the data splits of
docs/data.md), section numbers (§4.3), dates, versions and arXiv identifiers.
"""
import csv
import dataclasses
import functools
import glob
import importlib
import inspect
import os
import re
from typing import Dict, Iterator, List, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIST_FILE = os.path.join(ROOT, 'tests', 'typed_figures.csv')

#: Pages under docs/ that a command writes from its results file (not typed by hand), with that command.
GENERATED = {
    'docs/bench/': 'python tools/benchmark.py ... --out docs/bench/<name> (and the GPU checks, tools/check_gpu.py)',
    'docs/growth/report': 'python -m studies.growth.report (docs/growth.md names each command)',
    'docs/growth/tau/report.md': 'python -m studies.growth.report (docs/growth.md names each command)',
    'docs/growth/validation/report.md': 'python -m studies.growth.report (docs/growth.md names each command)',
    'docs/ringformer/results.md': 'tkvision-sweep --collect (docs/ringformer.md names the command)',
    'docs/ablations/': 'tkvision-sweep --collect (docs/ablations.md names the command)',
    'docs/reference/config.md': 'python tools/render_reference.py (held by tests/test_docs.py)',
    'docs/reference/commands.md': 'python tools/render_reference.py (held by tests/test_docs.py)',
    'docs/changelog.md': "CHANGELOG.md, included: history, whose figures are the record of what a change measured",
}

_NUMBER_WORD = (r'(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty|forty|'
                r'fifty|sixty|seventy|eighty|ninety|a hundred|hundred)')
#: A figure (the module docstring says which forms).
FIGURE = re.compile(
    r'(?<![\w.,/-])(?:'
    r'\d+(?:\.\d+)?e[-+]?\d+\b'
    r'|\d+(?:\.\d+)?\s?[-–]\s?\d+(?:\.\d+)?(?=\s?[%x×]|\s?(?:img/s|ms|s|min|minutes|h|hours|times|percent|points)\b)'
    r'|\d+,\d{1,2}(?=\s?[x×%])'
    r'|\d{1,3}(?:,\d{3})+(?:\.\d+)?'
    r'|\d*\.\d+(?!\.?\d)'
    r'|\d+(?=\s?%)'
    r'|\d+(?=[x×](?!\w))'
    r'|\d+(?=\s?(?:img/s|-fold))'
    r'|\d+(?=\s(?:times|percent|per cent|(?:percentage\s)?points?)\b)'
    r'|\d+(?=\s?(?:ms|s|seconds?|min|minutes?|h|hours?)\b)'
    r')'
    r'|\ba (?:third|quarter|fifth|tenth)(?=\s+(?:of|as|the|more|less|fewer|epoch|point)\b|-)|\bhalf an?\b'
    rf'|\b{_NUMBER_WORD}(?:[- ](?:percent|per cent|times|fold)\b|-fold)'
    r'|\b(?:twice|half|double|triple)\s+(?:as|the)\b|\bdoubl(?:es|ed|ing)\b|\bhalv(?:es|ed|ing)\b', re.I)
#: Phrases whose numbers are not measurements: a value named by its setting (``lr 2e-3``, ``eps 1e-6``), the
#: project's interval rule, counts of images (the data splits).
SETTING_PHRASES = re.compile(r'\b(?:lr|blr|eps|ε|std)\s?[=:·*]?\s?\d[\d.]*(?:e-?\d+)?|95\s?% interval|(?<![\d.,])\b\d[\d,]*(?:[\s-][A-Za-z-]+){0,3}?[\s-](?:images?|JPEGs)\b')
#: In code: a value (or a list of values) given to a key, an option or a call is a setting.
_CODE_SETTING = re.compile(r'(?:[\w.@]+\s*[:=]\s*|--[\w-]+[ =]|[(,]|\w@)\s*[\[{(]?(?:[-+]?[\d.]+(?:e-?\d+)?\s*'
                           r'(?:,\s*)?)+[\]})]?')
_TABLE = re.compile(r'<!-- table (?P<spec>.*?) -->.*?<!-- end table -->', re.S)
_VALUE = re.compile(r'<!-- (?:value|compare) .*? -->.*?<!-- end -->', re.S)


def _table_headers(match: 're.Match[str]') -> str:
    """A rendered table as ``{value}`` and the headers its marker types (``header=format`` after the source): a
    header is typed by hand, its cells are rendered."""
    headers = [column.split('=', 1)[0] for column in match.group('spec').split(' | ')[1:]]
    return '{value} ' + ' | '.join(headers) + ' | '


@functools.lru_cache(maxsize=None)
def readable_text(text: str) -> str:
    """``text`` as the check reads it: rendered markers as ``{value}``, comments and link targets gone, settings in
    code gone, section numbers, dates, versions (``Slurm 22.05``) and arXiv identifiers gone, whitespace collapsed to single spaces."""
    text = _VALUE.sub('{value}', _TABLE.sub(_table_headers, text))
    text = re.sub(r'<!--.*?-->', ' ', text, flags=re.S)
    text = re.sub(r'\]\([^)]*\)', ']', text)
    text = re.sub(r'```.*?```|``[^`]+``|`[^`\n]*`', lambda m: _CODE_SETTING.sub('{setting}', m.group(0)), text,
                  flags=re.S)
    text = re.sub(r'(?:§|\b(?:Section|Sec\.|Eq\.|App\.))\s?\d+(?:\.\d+)*|\b(?:Slurm|Python|CUDA) \d+\.\d+\b'
                  r'|\b\d{4}-\d{2}-\d{2}\b|\b\d{4}\.\d{4,5}\b|\bv?\d+\.\d+\.\d+(?:[.+]\w+)*\b', '{id}', text)
    return ' '.join(text.split())


def figures(text: str) -> List[Tuple[str, int, int]]:
    """The figures of ``readable_text`` output ``text``: ``(figure, start, end)``."""
    spared = [m.span() for m in SETTING_PHRASES.finditer(text)]
    return [(m.group(0), *m.span()) for m in FIGURE.finditer(text)
            if not any(a <= m.start() < b for a, b in spared)]


def _docstrings(dotted: str) -> Iterator[Tuple[str, str]]:
    """``(name, docstring)`` of what the API page's ``::: dotted`` renders: the object's docstring and, for a module
    or a class, those of the public members it defines."""
    module_name, obj = dotted, None
    while obj is None:
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError:
            module_name = module_name.rpartition('.')[0]
    for name in dotted[len(module_name):].split('.')[1:]:
        obj = getattr(obj, name)
    todo = [(dotted, obj)]
    while todo:
        name, current = todo.pop(0)
        if current.__doc__:
            yield name, inspect.cleandoc(current.__doc__)
        if inspect.ismodule(current):
            todo += [(f'{name}.{k}', v) for k, v in vars(current).items() if not k.startswith('_') and
                     (inspect.isclass(v) or inspect.isfunction(v)) and v.__module__ == current.__name__]
        elif inspect.isclass(current):
            todo += [(f'{name}.{k}', v) for k, v in vars(current).items() if not k.startswith('_') and
                     inspect.isfunction(v)]


@functools.lru_cache(maxsize=None)
def config_values(path: str) -> Set[float]:
    """Every number a config sets, its bases' and the defaults included (`tkvision.engine.config.load_config`): a
    figure in its header equal to one of them is that config's own setting."""
    from tkvision.engine.config import load_config
    found: Set[float] = set()
    todo: list = [load_config(path)]
    while todo:
        value = todo.pop()
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            todo += [getattr(value, f.name) for f in dataclasses.fields(value)]
        elif isinstance(value, dict):
            todo += list(value.values())
        elif isinstance(value, (list, tuple)):
            todo += list(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.add(float(value))
    return found


#: Fractions in words, as the numbers a config sets (``a quarter of the learning rate``: 0.25).
_FRACTIONS = {'a third': 1 / 3, 'a quarter': 0.25, 'a fifth': 0.2, 'a tenth': 0.1, 'half a': 0.5, 'half an': 0.5}


def settings_spared(where: str, text: str, found: List[Tuple[str, int, int]]) -> List[Tuple[str, int, int]]:
    """``found`` less, in a config's header, the figures that equal a number the config sets (`config_values`), a
    ratio or a share (``2x``, ``61 %``) excepted."""
    if not where.endswith('.yaml'):
        return found
    values = config_values(os.path.join(ROOT, where))
    kept = []
    for figure, start, end in found:
        try:
            number = _FRACTIONS.get(figure.lower(), None) or float(figure.replace(',', ''))
        except ValueError:
            number = None
        # "2x", "61 %", "2 points": a ratio or a difference, never a setting's value
        ratio = re.match(r'\s?[x×%]|\s(?:points?|percent|times)\b', text[end:end + 10])
        if number is None or ratio or number not in values:
            kept.append((figure, start, end))
    return kept


def _comments(path: str) -> str:
    """The comment text of a YAML file: every line's text after ``#`` (the header, and the comments below it)."""
    found = []
    for line in open(path, encoding='utf-8'):
        if line.lstrip().startswith('#'):
            found.append(line.lstrip()[1:])
        elif ' #' in line:
            found.append(line.split(' #', 1)[1])
    return ''.join(found)


def _public_modules() -> Iterator[str]:
    """Every module of the ``tkvision`` package, by dotted name (what a reader opens with ``help``)."""
    package = os.path.join(ROOT, 'tkvision')
    for path in sorted(glob.glob(os.path.join(package, '**', '*.py'), recursive=True)):
        dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
        yield dotted[:-len('.__init__')] if dotted.endswith('.__init__') else dotted


def documents(root: str = ROOT) -> Dict[str, str]:
    """`_documents`, read once per process (a copy: a test may plant text in it)."""
    return dict(_documents(root))


@functools.lru_cache(maxsize=None)
def _documents(root: str) -> Dict[str, str]:
    """What the check reads: ``{where: text}`` for the README, DEVELOPERS.md, every hand-written page under docs/
    (`GENERATED` excepted), mkdocs.yml and the Makefile, every config's comments (its header and the comments below
    it) and every public docstring of the package (on the API page or not)."""
    found = {}
    for name in ('README.md', 'DEVELOPERS.md', 'mkdocs.yml', 'Makefile'):
        found[name] = open(os.path.join(root, name), encoding='utf-8').read()
    for path in sorted(glob.glob(os.path.join(root, 'docs', '**', '*.md'), recursive=True)):
        page = os.path.relpath(path, root)
        if not page.startswith(tuple(GENERATED)):
            found[page] = open(path, encoding='utf-8').read()
    for pattern in ('tkvision/configs/**/*.yaml', 'studies/*/configs/**/*.yaml'):
        for path in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
            found[os.path.relpath(path, root)] = _comments(path)
    for dotted in _public_modules():
        for name, doc in _docstrings(dotted):
            found.setdefault(f'docstring {name}', doc)
    return found


def listed(path: str = LIST_FILE) -> List[Dict[str, str]]:
    """The rows of ``tests/typed_figures.csv``: ``where``, ``context``, ``source``."""
    with open(path, encoding='utf-8', newline='') as f:
        return list(csv.DictReader(f))


def loose_figures(docs: Dict[str, str], rows: List[Dict[str, str]]) -> Tuple[List[str], List[str]]:
    """``(loose, stale)``: ``'where: figure in "context"'`` for each figure no listed context covers, and each listed
    row whose context is no longer in its text (remove it)."""
    return loose_in(docs, rows, _page_loose)


def loose_in(docs: Dict[str, str], rows: List[Dict[str, str]], page) -> Tuple[List[str], List[str]]:
    """``(loose, stale)`` over every page of ``docs``: ``page(where, text, contexts)`` gives one page's, from the
    contexts listed for it in ``rows``; a listed page that is not in ``docs`` makes its rows stale. The figures'
    check and the comparative words' (``tests/typed_words.py``) share it."""
    loose, stale = [], []
    by_where: Dict[str, List[str]] = {}
    for row in rows:
        by_where.setdefault(row['where'], []).append(' '.join(row['context'].split()))
    for where, text in docs.items():
        page_loose, page_stale = page(where, text, tuple(by_where.get(where, ())))
        loose += page_loose
        stale += page_stale
    stale += [f'{where}: "{c}" (no such page)' for where, contexts in by_where.items() if where not in docs
              for c in contexts]
    return loose, stale


def covered_spans(where: str, text: str, contexts: Tuple[str, ...]) -> Tuple[List[Tuple[int, int]], List[str]]:
    """The spans of ``text`` the listed ``contexts`` cover, and ``'where: "context"'`` for each not found."""
    covered, stale = [], []
    for context in contexts:
        spans = [(m.start(), m.start() + len(context)) for m in re.finditer(re.escape(context), text)]
        if not spans:
            stale.append(f'{where}: "{context}"')
        covered += spans
    return covered, stale


@functools.lru_cache(maxsize=None)
def _page_loose(where: str, text: str, contexts: Tuple[str, ...]) -> Tuple[List[str], List[str]]:
    """`loose_figures` of one page (cached: a test that plants a sentence in one page re-reads only that one)."""
    text = readable_text(text)
    covered, stale = covered_spans(where, text, contexts)
    loose = []
    for figure, start, end in settings_spared(where, text, figures(text)):
        if not any(a <= start and end <= b for a, b in covered):
            loose.append(f'{where}: {figure} in "{text[max(0, start - 50):end + 25]}"')
    return loose, stale
