"""The shape of the house (DEVELOPERS.md, "Layout"), as tested claims: no import cycle, imports written
inside functions included; the library never imports the experiment drivers, the command lines or the
studies; no private name crosses a module; lines within 120 characters; functions a reader can hold in
their head; modules of a readable size (both limits smell detectors, not targets)."""
import ast
import re
import os

import pytest

from .helpers import ROOT

PACKAGE = os.path.join(ROOT, 'tkvision')
#: The edge of the package: experiment drivers and command lines. The library never imports them.
EDGE = ('tkvision.experiments', 'tkvision.cli')
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450
#: Modules clearer long, each with why.
LONG_MODULES = {
    'tkvision.models.tokenformer_vit': "timm's model-file order in one file (paper docstring, model, checkpoint "
                                       'filter, pretrained cfgs, entrypoints), as timm\'s vision_transformer.py',
    'tkvision.models.mae': "MAE's decoder, masking, loss and builder in one file, as MAE's models_mae.py, with "
                           'every signature of several parameters one per line',
    'tkvision.layers.pattention': 'the layer with its Θ registry: a new normalisation is one register_score_norm '
                                  'call beside the layer that reads it (the module docstring\'s table)',
}
#: Functions clearer long, each with why.
LONG_FUNCTIONS = {
    ('tkvision.models.tokenformer_vit', '__init__'): "the model's constructor reads top to bottom as the "
                                                     "architecture (timm's VisionTransformer.__init__ is longer)",
}
MAX_LINE = 120
#: Where the line limit and the private-name rule apply: the package, the studies and the tools.
SOURCES = ('tkvision', 'studies', 'tools')


def _modules() -> dict:
    """``{dotted module name: path}`` of every module of the package (``__init__`` as the package)."""
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith('.py'):
                rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].split(os.sep)
                name = '.'.join(rel[:-1] if rel[-1] == '__init__' else rel)
                out[name] = os.path.join(folder, f)
    return out


def _imports(name: str, path: str, modules: dict) -> set:
    """The package's modules that ``name`` imports anywhere in its file (module level or inside
    functions); ``from P import x`` counts as importing ``P.x`` when that is a module, else ``P``."""
    is_package = path.endswith('__init__.py')
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = name.split('.')
                anchor = parts if is_package else parts[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = '.'.join(anchor + ([base] if base else []))
            targets = [f'{base}.{alias.name}' if f'{base}.{alias.name}' in modules else base for alias in node.names]
        for t in targets:
            while t and t not in modules:  # `import tkvision.a.b.c` of an attribute: its module
                t = t.rpartition('.')[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> dict:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _is_package_edge(importer: str, imported: str) -> bool:
    """A package's ``__init__`` re-exporting its own submodule, and that submodule importing a
    sibling through the package: the parent-child edges Python itself creates, not a design cycle."""
    return imported.startswith(importer + '.') or importer.startswith(imported + '.')


def test_the_import_graph_has_no_cycle_counting_imports_inside_functions():
    graph = {m: {t for t in targets if not _is_package_edge(m, t)} for m, targets in _graph().items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    """The checker itself: a two-module and a three-module cycle are found, a chain is not."""
    assert _cycles({'a': {'b'}, 'b': {'a'}, 'c': set()}) == [['a', 'b']]
    assert _cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == [['a', 'b', 'c']]
    assert _cycles({'a': {'b'}, 'b': {'c'}, 'c': set()}) == []


def test_the_library_never_imports_the_experiments_or_the_command_lines():
    offenders = {m: sorted(t for t in targets if t.startswith(EDGE))
                 for m, targets in _graph().items() if m != 'tkvision' and not m.startswith(EDGE)}
    assert {m: t for m, t in offenders.items() if t} == {}


def _python_files() -> list:
    return sorted(os.path.join(folder, f) for top in SOURCES for folder, _, files in os.walk(os.path.join(ROOT, top))
                  for f in files if f.endswith('.py'))


def test_the_library_never_imports_the_studies():
    """``studies/`` imports tkvision like any user code; nothing in the package imports a study (the wheel
    does not ship them)."""
    offenders = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(open(path).read())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ''] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f'{name}: {n}' for n in names if n == 'studies' or n.startswith('studies.')]
    assert offenders == []


def _private_imports(path: str) -> list:
    """``from X import _name`` where X is a module of ours (relative, ``tkvision.*`` or ``studies.*``), and a
    private module (``_helpers``) imported from outside its own package."""
    found = []
    package = os.path.relpath(os.path.dirname(path), ROOT).replace(os.sep, '.')
    for node in ast.walk(ast.parse(open(path).read())):
        if not isinstance(node, ast.ImportFrom):
            continue
        ours = node.level > 0 or (node.module or '').split('.')[0] in ('tkvision', 'studies')
        if not ours:
            continue
        found += [f'{path}:{node.lineno} {a.name}' for a in node.names
                  if a.name.startswith('_') and not a.name.startswith('__')]
        module = node.module or ''
        parts = module.split('.')
        private = [i for i, p in enumerate(parts) if p.startswith('_') and not p.startswith('__')]
        if private and (node.level > 1 or (node.level == 0 and not package.startswith('.'.join(parts[:private[0]])))):
            found.append(f'{path}:{node.lineno} {module}')
    return found


def test_no_private_name_is_imported_across_modules():
    """What two modules share is public in one of them (``tkvision.models.input_shape``, not
    ``tkvision.models._helpers.input_shape``; ``benchmark.synchronize``, not ``_sync``)."""
    found = [f for path in _python_files() for f in _private_imports(path)]
    assert found == []


def test_lines_are_within_120_characters():
    long = [f'{os.path.relpath(path, ROOT)}:{i}' for path in _python_files()
            for i, line in enumerate(open(path).read().splitlines(), 1) if len(line) > MAX_LINE]
    assert long == [], f'{len(long)} lines over {MAX_LINE} characters'


def test_the_import_parser_sees_imports_inside_functions(tmp_path):
    """``_imports`` reads an import written inside a function (how the earlier cycles were hidden)."""
    path = tmp_path / 'mod.py'
    path.write_text('def f():\n    from ..data import loader\n    from .checkpoint import x\n')
    modules = {'tkvision.engine.mod': str(path), 'tkvision.data': '', 'tkvision.data.loader': '',
               'tkvision.engine.checkpoint': ''}
    assert _imports('tkvision.engine.mod', str(path), modules) == {'tkvision.data.loader', 'tkvision.engine.checkpoint'}


@pytest.mark.parametrize('name', sorted(_modules()))
def test_functions_and_modules_are_a_readable_size(name):
    """Smell detectors: a function over 60 lines or a module over 450 asks whether it does one job (never
    fold statements to pass them); the few clearer long are named above with why."""
    path = _modules()[name]
    source = open(path).read()
    assert name in LONG_MODULES or len(source.splitlines()) <= MAX_MODULE_LINES, f'{path}: split it by concern'
    # the body from its first statement: a long signature written one argument per line is not a long function
    long = [(node.name, node.end_lineno - node.body[0].lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (name, node.name) not in LONG_FUNCTIONS
            and node.end_lineno - node.body[0].lineno + 1 > MAX_FUNCTION_LINES]
    assert long == [], f'{path}: functions over {MAX_FUNCTION_LINES} lines'


def _self_comparisons(source: str) -> list:
    """Assertions that cannot fail: ``x == x``, or ``and`` / ``or`` inside a comparison helper's
    operands (``assert_close(a, f() and a)`` compares ``a`` with itself)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        name = getattr(getattr(node, 'func', None), 'attr', getattr(getattr(node, 'func', None), 'id', ''))
        if isinstance(node, ast.Call) and name in ('assert_close', 'allclose', 'equal', 'array_equal'):
            found += [ast.unparse(node) for arg in node.args if isinstance(arg, ast.BoolOp)]
        if (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)
                and ast.unparse(node.left) == ast.unparse(node.comparators[0])):
            found.append(ast.unparse(node))
    return found


def test_no_assertion_compares_a_value_with_itself():
    assert _self_comparisons('torch.testing.assert_close(m(x), other.load_state_dict(s) and m(x))')  # the checker
    tests = os.path.join(ROOT, 'tests')
    found = {f: _self_comparisons(open(os.path.join(tests, f)).read()) for f in os.listdir(tests) if f.endswith('.py')}
    assert {f: v for f, v in found.items() if v} == {}


def test_the_makefile_pins_satisfy_setup_cfgs_ranges_and_the_lowest_bounds_are_read():
    """The Makefile pins torch / torchvision; setup.cfg keeps ranges; CI installs setup.cfg's lower
    bounds of timm and friends (``make test-lowest-deps``): they must agree."""
    import configparser
    import re
    import sys
    from packaging.requirements import Requirement
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, 'setup.cfg'))
    ranges = {Requirement(line).name.lower(): Requirement(line).specifier
              for line in cfg['options']['install_requires'].split('\n') if line.strip()}
    pins = re.search(r'^TORCH_PINS := (.+)$', open(os.path.join(ROOT, 'Makefile')).read(), re.M).group(1).split()
    for pin in pins:
        name, version = pin.split('==')
        assert version in ranges[name.lower()], f'Makefile pins {pin} outside setup.cfg {ranges[name.lower()]}'
    sys.path.insert(0, os.path.join(ROOT, 'tools'))
    from lowest_requirements import lowest
    assert lowest(['timm', 'pyyaml']) == [f"timm=={str(ranges['timm']).lstrip('>=')}",
                                           f"pyyaml=={str(ranges['pyyaml']).lstrip('>=')}"]


def test_every_test_the_reliability_page_names_exists():
    """docs/reliability.md maps each promise to tests: a renamed or deleted test fails here, not silently."""
    import glob
    import re
    doc = open(os.path.join(ROOT, 'docs', 'reliability.md')).read()
    files = glob.glob(os.path.join(ROOT, 'tests', 'test_*.py'))
    source = ''.join(open(f).read() for f in files)
    stems = {os.path.basename(f)[:-3] for f in files}
    named = set(re.findall(r'(test_[a-z0-9_]+?)(?:_\.\.\.|\.py|`|\b)', doc))
    missing = [n for n in sorted(named) if n not in stems and f'def {n}' not in source
               and not any(f'def {n}' in line for line in source.splitlines())]
    assert named and missing == []


def test_the_whole_config_travels_no_further_than_the_edge():
    """Validated once at the edge into typed sections, the config reaches each stage as the section it uses:
    followed call by call through a tiny run (``tools/config_trail.py``), counting every call that hands on the
    config, a section of it (typed or a mapping) or an object that keeps one (the run's context, data, loss, clock
    and state), it is handed on at most 100 times and comes back to a module it had left at most 40: a guard
    against the config spreading through the engine, not a goal (97 and 36 today: the device plan takes the model
    section's ``compile`` at process set-up, the model a run trains is built before the state that holds it, a
    partial mapping is merged with the defaults, and the run's input files are hashed). The run's
    context keeps the few run values the trainer reads, not the run section; the state keeps no section but the
    flat record it writes into each checkpoint, and each call with it counts; the optimizer's part
    (``RunOptim``) keeps the optim and growth sections it rebuilds from. A guard: the goal is at most 41
    hand-offs."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('config_trail', os.path.join(ROOT, 'tools', 'config_trail.py'))
    config_trail = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(config_trail)
    trail = config_trail.trail()
    assert trail['handoffs'] <= 100 and trail['returns'] <= 40, trail
    assert any(e[4] == '_start' for e in trail['edges'])  # the probe sees the trail: it is not empty by accident


def _public_functions():
    """``(module path, function node)`` of every public function and public method (``__init__`` included) of a
    public class in a public module of the package."""
    for name, path in sorted(_modules().items()):
        if any(part.startswith('_') for part in name.split('.')):
            continue
        for node in ast.parse(open(path).read()).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith('_'):
                yield path, node
            elif isinstance(node, ast.ClassDef) and not node.name.startswith('_'):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef) and (not sub.name.startswith('_') or sub.name == '__init__'):
                        yield path, sub


def _parameters(fn: ast.FunctionDef) -> list:
    a = fn.args
    every = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]
    return [p for p in every if p.arg not in ('self', 'cls')]


def test_the_public_api_is_typed_one_parameter_per_line():
    """timm's style, held by this rule rather than by eye (ruff's annotation rules cannot exempt private helpers):
    every public function and method annotates each parameter and (``__init__`` aside) its return, and one with
    four parameters or more writes one per line."""
    untyped, crowded = [], []
    for path, fn in _public_functions():
        where = f'{os.path.relpath(path, ROOT)}:{fn.lineno} {fn.name}'
        params = _parameters(fn)
        missing = [p.arg for p in params if p.annotation is None]
        if missing or (fn.returns is None and fn.name != '__init__'):
            untyped.append(f'{where} {missing or "return"}')
        if len(params) >= 4 and len({p.lineno for p in params}) != len(params):
            crowded.append(where)
    assert untyped == [] and crowded == [], (untyped, crowded)


def test_the_typing_rule_catches_an_untyped_or_crowded_signature(tmp_path):
    fn = ast.parse('def f(a, b: int, c: int, d: int) -> None: pass').body[0]
    assert [p.arg for p in _parameters(fn) if p.annotation is None] == ['a']
    assert len({p.lineno for p in _parameters(fn)}) == 1  # four parameters on one line


_IGNORE = re.compile(r'#\s*type:\s*ignore(\[[\w\-, ]+\])?(.*)$')


def _unexplained_ignores(lines: list, where: str) -> list:
    """``where:line`` of every ``# type: ignore`` in ``lines`` without an error code, or without a reason (a
    comment after it, or on the line above)."""
    bad = []
    for i, line in enumerate(lines):
        match = _IGNORE.search(line)
        if not match:
            continue
        reason = match.group(2).strip(' #') or (lines[i - 1].strip().startswith('#') if i else '')
        if not match.group(1) or not reason:
            bad.append(f'{where}:{i + 1}')
    return bad


def test_every_type_ignore_names_its_error_code_and_why():
    """The type checker's level is pyproject.toml's, with no blanket ignore: no file or module is excluded, and
    each ``# type: ignore[code]`` says why on its line or the line above."""
    with open(os.path.join(ROOT, 'pyproject.toml')) as f:
        mypy = f.read().split('[tool.mypy]', 1)[1]
    assert 'ignore_errors' not in mypy and 'disable_error_code' not in mypy and 'exclude' not in mypy
    bad = []
    for name, path in _modules().items():
        with open(path) as f:
            bad += _unexplained_ignores(f.read().splitlines(), os.path.relpath(path, ROOT))
    assert bad == []


def test_the_ignore_rule_catches_a_bare_or_unexplained_ignore():
    lines = ['x = f()  # type: ignore', 'y = g()  # type: ignore[arg-type]', '# why', 'z = h()  # type: ignore[index]',
             'w = k()  # type: ignore[misc]  # because']
    assert _unexplained_ignores(lines, 'f') == ['f:1', 'f:2']
