#!/usr/bin/env python
"""Render the measured tables of README.md and docs/ from their results files; ``--check`` fails on a stale one.

``python tools/render_docs.py`` rewrites every generated table; ``python tools/render_docs.py --check``
(``tests/test_docs.py``, in CI) exits 1 naming each table that differs from its results file.

A generated table is written between two comment lines that name its source and its columns::

    <!-- table docs/ablations/results.csv | point={config} | val top-1 (%)={top1_mean:.2f} ± {top1_std:.2f} -->
    | point | val top-1 (%) |
    |---|---|
    | norm_gelu_l2 | 86.55 ± 0.61 |
    <!-- end table -->

A figure inside a sentence is generated the same way, from the one row its filters keep::

    the TokenFormer's <!-- value docs/comparison/results.csv?config=vit_equal_width | {top1_std:.2f} -->0.04<!-- end -->

The source is a CSV file, or a JSON file with ``#key`` (``#key.sub``) naming a list of objects in it;
``?column=value`` keeps the rows whose column equals the value (several ``?`` filters: all must hold). An
inline value may also be the difference or the ratio of two such rows (``A minus B | {top1_mean:.1f}``,
``A over B | {params:.2f}``): a gap or a ratio typed by hand goes stale when a run is redone, a rendered one
does not.
A comparison of two sets of seeds phrases itself: its verb comes from the interval, never from a hand::

    16 tokens are <!-- compare docs/growth/precondition_curves.csv?tokens=16?epoch=6 vs
    docs/growth/precondition_curves.csv?tokens=8?epoch=6 | top1 | points -->ahead on the means only (...)<!-- end -->

``A vs B | column | unit``: each side keeps one row per seed; the text is
`tkvision.experiments.intervals.compare_words` of the
column's values (ahead / behind only where the 95% interval excludes 0), and where the rows carry ``machine`` or
``commit`` columns whose values differ between the sides it adds "(on different CPUs)" (the CPU model and cores
differ: `cpu_kind`), "(different code)", or both in one parenthesis; where a row's cell does not name what ran it
(``unknown``, or ``unknown (row written at <commit>)`` for a row filled in after its run), "(code not recorded)"
(or "CPUs"), since then neither "the same" nor "different" is known.
Each column is ``header={python format string over the row}``; numbers in a CSV are read as floats
(an integer-valued one as an int; one written with a leading + stays text, sign and all); an empty,
None or NaN value is shown as –. Rows keep the file's
order. Nothing else of a document changes.
"""
import argparse
import csv
import glob
import json
import math
import os
import re
import string
import sys

from tkvision.experiments.intervals import compare_words

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r'(?P<head><!-- table (?P<spec>.+?) -->\n)(?P<body>.*?)(?P<tail><!-- end table -->)', re.S)
VALUE = re.compile(r'(?P<head><!-- value (?P<spec>[^\n]+?) -->)(?P<body>[^<\n]*)(?P<tail><!-- end -->)')
COMPARE = re.compile(r'(?P<head><!-- compare (?P<spec>[^<]+?) -->)(?P<body>[^<\n]*)(?P<tail><!-- end -->)')


def _number(value: str):
    if value.startswith('+'):  # a signed difference is written as the results file spells it
        return value
    try:
        x = float(value)
    except (TypeError, ValueError):
        return value
    return int(x) if x.is_integer() and '.' not in value and 'e' not in value.lower() else x


def load_rows(source: str) -> list:
    """The rows of ``source`` (``path.csv`` or ``path.json#key``, with ``?column=value`` filters),
    path relative to the repository root; a JSON object at ``key`` is one row (a report's ``info``).

    Raises:
        FileNotFoundError: the file does not exist. KeyError: the JSON key does not.
        SpecError: the key holds something other than a list of rows (objects).
    """
    path, *filters = source.split('?')
    path, _, key = path.partition('#')
    with open(os.path.join(ROOT, path)) as f:
        if path.endswith('.json'):
            rows = json.load(f)
            for part in filter(None, key.split('.')):
                if not isinstance(rows, dict):
                    raise SpecError(f'{source}: {path} holds {type(rows).__name__} where the key {part!r} needs an '
                                    'object; regenerate the file with the command that wrote it')
                rows = rows[part]
            rows = [rows] if isinstance(rows, dict) else rows
        else:
            rows = [{k: _number(v) for k, v in r.items()} for r in csv.DictReader(f)]
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        found = type(rows).__name__ if not isinstance(rows, list) else 'a list holding ' + ', '.join(
            sorted({type(r).__name__ for r in rows if not isinstance(r, dict)}))
        raise SpecError(f'{source} holds {found} where the table needs a list of rows (objects of column: value); '
                        'regenerate the file with the command that wrote it')
    for flt in filters:
        column, _, value = flt.partition('=')
        rows = [r for r in rows if str(r.get(column)) == value]
    return rows


class _Formatter(string.Formatter):
    """``str.format`` that shows a figure a row lacks (absent, empty, None, NaN) as – whatever its format
    spec; a column no row of the source has is a typo in the spec and raises KeyError."""

    def __init__(self, columns: set):
        super().__init__()
        self.columns = columns

    def get_value(self, key, args, kwargs):
        if key not in kwargs and key in self.columns:
            return None
        return super().get_value(key, args, kwargs)

    def format_field(self, value, format_spec):
        if value in ('', None) or (isinstance(value, float) and math.isnan(value)):
            return '–'
        return super().format_field(value, format_spec)


def render(spec: str) -> str:
    """The markdown table of one block's ``spec`` (``source | header=format | ...``)."""
    source, *columns = [c.strip() for c in spec.split(' | ')]
    headers, formats = zip(*(c.split('=', 1) for c in columns))
    lines = ['| ' + ' | '.join(headers) + ' |', '|' + '---|' * len(headers)]
    rows = load_rows(source)
    formatter = _Formatter({k for row in rows for k in row})
    for row in rows:
        lines.append('| ' + ' | '.join(formatter.format(fmt, **row) for fmt in formats) + ' |')
    return '\n'.join(lines) + '\n'


#: Two sources joined by one of these words give one row: their numeric columns combined. The word counts only
#: before a second source (a path to a .csv or .json file), so a filter value may hold it ("one cosine over the
#: chain"), as it may hold ' / ' or ' - ' (a profile category does).
OPERATORS = {'minus': lambda a, b: a - b, 'over': lambda a, b: a / b}
_OPERATOR = re.compile(r'\s(minus|over)\s+(?=[\w./-]+\.(?:csv|json)(?:[#?\s]|$))')


def _one_row(source: str) -> dict:
    """The one row ``source`` keeps; for ``A minus B`` or ``A over B`` (`OPERATORS`) the row of the numeric
    columns both rows have, each combined (a gap between two runs, a ratio).

    Raises:
        SpecError: a side whose filters keep no row or more than one (the message says how many).
    """
    joined = _OPERATOR.search(source)
    if joined:
        left, right = _one_row(source[:joined.start()].strip()), _one_row(source[joined.end():].strip())
        combine = OPERATORS[joined.group(1)]
        return {k: combine(v, right[k]) for k, v in left.items() if _is_number(v) and _is_number(right.get(k))}
    rows = load_rows(source)
    if len(rows) != 1:
        raise SpecError(f'{source} has {len(rows)} rows that match; an inline value needs filters that keep one')
    return rows[0]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def render_value(spec: str) -> str:
    """The one figure of an inline ``spec`` (``source?filters | format``, or ``A minus B | format`` for the
    difference of two rows' columns, ``A over B`` for their ratio).

    Raises:
        SpecError: the filters keep no row or more than one (the message says how many).
    """
    source, fmt = [c.strip() for c in spec.split(' | ', 1)]
    row = _one_row(source)
    return _Formatter(set(row)).format(fmt, **row)


def cpu_kind(machine: str) -> str:
    """The CPU model and core count a points file's ``machine`` names (what "on different CPUs" compares), however
    the row was written: ``'AMD EPYC, 2 cores, torch 2.14.1, 1 threads'`` (`machine_info`, the threads and torch
    are not the CPU) and ``'2-core AMD EPYC VM (as its page says)'`` (a row filled from its page) are both
    ``'AMD EPYC, 2 cores'``; a GPU's line is its name."""
    filled = re.match(r'(\d+)-core (.+?) VM\b', machine)
    if filled:
        return f'{filled.group(2)}, {filled.group(1)} cores'
    parts = [part.strip() for part in machine.split(',')]
    cores = next((part for part in parts if re.fullmatch(r'\d+ cores', part)), None)
    return f'{parts[0]}, {cores}' if cores else parts[0]


def render_compare(spec: str) -> str:
    """The words of a ``compare`` marker's ``spec`` (``A vs B | column | unit``, or ``... | short`` for the verb and
    the gap alone; the module docstring). Where both sides record ``machine`` or ``commit`` and they differ, a
    parenthesis says so (a side that records neither, or ``unknown``, is not compared).

    Raises:
        SpecError: a spec that is not of that form, a side that keeps no row, a column a row lacks, or a value that
            is no finite number (each named, with the file).
    """
    fields = [c.strip() for c in ' '.join(spec.split()).split(' | ')]
    if len(fields) not in (3, 4) or (len(fields) == 4 and fields[3] != 'short') or fields[0].count(' vs ') != 1:
        raise SpecError(f"a compare spec is 'A vs B | column | unit' (or with '| short'), got {spec!r}")
    names = [side.strip() for side in fields[0].split(' vs ')]
    column, unit, short = fields[1], fields[2], len(fields) == 4
    values = []
    for name in names:
        rows = load_rows(name)
        if not rows:
            raise SpecError(f'{name} keeps no row; a comparison needs one row per seed a side')
        if any(column not in r for r in rows):
            raise SpecError(f'{name} has no column {column!r} (its columns: {", ".join(rows[0])})')
        side = [_finite(r[column], name, column) for r in rows]
        values.append((rows, side))
    words = compare_words(values[0][1], values[1][1], unit, short=short)
    return words + ('' if short else _provenance_words([rows for rows, _ in values]))


def recorded(value: object) -> bool:
    """Whether a points file's ``machine`` or ``commit`` cell names what ran its row: not empty, not ``unknown`` and
    not ``unknown (row written at <commit>)``, the cell of a row filled in after its run (docs/comparison.md)."""
    text = str(value if value is not None else '').strip()
    return bool(text) and not text.startswith('unknown')


def provenance_split(sides: list) -> tuple:
    """``(differ, unknown)``: the keys of ``('machine', 'commit')`` whose recorded values differ between the two
    sides' rows (a machine compared by `cpu_kind`), and those where a row that has the column does not name what ran
    it (`recorded`), since then neither "the same" nor "different" is known. A key neither side has is in neither."""
    differ, unknown = [], []
    for key, kind in (('machine', cpu_kind), ('commit', str)):
        cells = [[r[key] for r in rows if key in r] for rows in sides]
        if not any(cells):
            continue
        if not all(cells) or not all(recorded(cell) for side in cells for cell in side):
            unknown.append(key)
        elif {kind(str(c)) for c in cells[0]} != {kind(str(c)) for c in cells[1]}:
            differ.append(key)
    return differ, unknown


def _provenance_words(sides: list) -> str:
    """``' (on different CPUs, different code)'`` or the part that applies, then ``'code not recorded'``
    (``'CPUs ...'``) for what `provenance_split` finds unknown; ``''`` when both sides agree or carry no such
    column."""
    differ, unknown = provenance_split(sides)
    apart = [{'machine': 'on different CPUs', 'commit': 'different code'}[key] for key in differ]
    if unknown:
        apart.append(f"{' and '.join(WHAT[key] for key in unknown)} not recorded")
    return f" ({', '.join(apart)})" if apart else ''


#: How a sentence names what a provenance key records.
WHAT = {'machine': 'CPUs', 'commit': 'code'}


def _finite(value: str, name: str, column: str) -> float:
    """A compare marker's number, refusing one that is not a finite number (a failed seed's row)."""
    try:
        number = float(value)
    except ValueError:
        raise SpecError(f'{name}: {column} {value!r} is not a number') from None
    if not math.isfinite(number):
        raise SpecError(f'{name}: {column} is {value} (a failed seed?): remove its row or rerun it')
    return number


def documents() -> list:
    """README.md, DEVELOPERS.md, every markdown file under docs/, and every config (a header's measured figure is an
    inline value too)."""
    configs = [p for pattern in ('tkvision/configs/**/*.yaml', 'studies/*/configs/**/*.yaml')
               for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)]
    pages = sorted(glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True))
    return [os.path.join(ROOT, 'README.md'), os.path.join(ROOT, 'DEVELOPERS.md')] + pages + sorted(configs)


class SpecError(ValueError):
    """A table spec that cannot be rendered: a column or JSON key its results file lacks, or no such file."""


def _render_block(spec: str, where: str, render=render) -> str:
    """``render(spec)`` (a table or an inline value), its failures as one `SpecError` line naming
    ``where`` (file:line of the spec), what is missing and, for a missing column, the columns the results
    file has."""
    try:
        return render(spec)
    except FileNotFoundError as e:
        raise SpecError(f'{where}: results file {e.filename} not found (table spec: {spec})') from None
    except SpecError as e:
        raise SpecError(f'{where}: {e}') from None
    except (ValueError, csv.Error) as e:  # a results file that does not parse (truncated JSON, a broken CSV)
        source = spec.split(' | ')[0].split('?')[0].split('#')[0]
        raise SpecError(f'{where}: results file {source} is not readable: {" ".join(str(e).split())}; regenerate it '
                        'with the command that wrote it') from None
    except KeyError as e:
        source = spec.split(' | ')[0]
        try:
            columns = ', '.join(dict.fromkeys(k for row in load_rows(source) for k in row)) or 'no rows'
        except KeyError:  # the JSON key itself is missing: there are no columns to list
            raise SpecError(f'{where}: {source} has no key {e.args[0]!r}') from None
        raise SpecError(f'{where}: column {e.args[0]!r} is not in {source} (its columns: {columns})') from None


def update(text: str, path: str = '<text>') -> tuple:
    """``(new text, [specs of the tables that changed])``; ``path`` names the document in errors.

    Raises:
        SpecError: a spec names a column, key or file that does not exist (one line: file, line, columns).
    """
    stale = []

    def replacer(render_one):
        def replace(m):
            line = text.count('\n', 0, m.start()) + 1
            body = _render_block(m.group('spec'), f'{path}:{line}', render_one)
            if body != m.group('body'):
                stale.append(m.group('spec'))
            return m.group('head') + body + m.group('tail')
        return replace

    text = BLOCK.sub(replacer(render), text)
    text = COMPARE.sub(replacer(render_compare), text)
    return VALUE.sub(replacer(render_value), text), stale


def write_generated(outputs: dict, check: bool, command: str) -> int:
    """Write each ``{path: text}`` whose file differs (atomically), or with ``check`` only report it;
    returns 1 when ``check`` found a stale file, else 0. Shared by the tools that derive results files
    (``summarize_runs.py``, ``model_table.py``); ``command`` is what the message tells the user to run."""
    stale = 0
    for path, text in outputs.items():
        if os.path.exists(path) and open(path).read() == text:
            continue
        stale += 1
        print(f"{os.path.relpath(path, ROOT)}: " + (f'stale: run {command}' if check else 'updated'))
        if not check:
            with open(path + '.tmp', 'w') as f:
                f.write(text)
            os.replace(path + '.tmp', path)
    return 1 if stale and check else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--check', action='store_true', help='change nothing; exit 1 if a table is stale')
    args = ap.parse_args(argv)
    failed = 0
    for path in documents():
        with open(path) as f:
            text = f.read()
        try:
            new, stale = update(text, os.path.relpath(path, ROOT))
        except SpecError as e:
            print(f'render_docs: {e}', file=sys.stderr)
            return 2
        for spec in stale:
            print(f"{os.path.relpath(path, ROOT)}: table from {spec.split(' | ')[0]} is "
                  + ('stale: run python tools/render_docs.py' if args.check else 'updated'))
        if stale and not args.check:
            with open(path + '.tmp', 'w') as f:
                f.write(new)
            os.replace(path + '.tmp', path)
        failed += bool(stale)
    return 1 if failed and args.check else 0


if __name__ == '__main__':
    from tkvision.cli import run_cli  # the rule every command shares: a user error is one line, exit 2
    sys.exit(run_cli(main))
