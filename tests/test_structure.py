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
    'tkvision.engine.trainer': "the run, as timm's train.py: every part built from its sections (the one module "
                               'that sees the whole config), the epochs, resume and the end of a run',
    'tkvision.engine.optim': 'the optimizer, its schedule (staged or re-warmed around growth), the update step and '
                             'the growth steps that rebuild them, beside the two sections they read',
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
    config, a section of it (typed or a mapping) or an object that keeps one (the run's data, optimisation, clock
    and state), it is handed on at most 130 times and comes back to a module it had left at most 48: a guard
    against the config spreading through the engine, not a goal (125 and 45 today; the data section travels
    through the data sources' calls, the trainer keeps its config and calls its own methods, the run log is handed
    the state each update, a partial mapping is merged with the defaults, the run's input files are hashed, the
    task builds the model from the model and MAE sections, and the probe's best weights, of an earlier epoch, are
    rebuilt from the config for the test split).
    The rules that matter are S1-S4 below."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('config_trail', os.path.join(ROOT, 'tools', 'config_trail.py'))
    config_trail = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(config_trail)
    trail = config_trail.trail()
    assert trail['handoffs'] <= 130 and trail['returns'] <= 48, trail
    assert any(e[4] == '_build' for e in trail['edges'])  # the probe sees the trail: it is not empty by accident


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


# --- Each part owns its config (DEVELOPERS.md, "Config ownership"): S1-S4, each with its checker tried on a plant.

#: The modules that may see every section: the config-file code and the trainer (the edge aside).
CONFIG_CODE = ('tkvision.engine.config', 'tkvision.engine.config_rules', 'tkvision.engine.trainer')
#: Section readers outside the section's own component, each with why.
SECTION_READERS_BESIDE = {
    ('DataConfig', 'tkvision.engine.run_data'): "the engine's data stage: it builds the loaders the data section "
                                                'describes (the data package cannot import the engine)',
    **{(section, f'tkvision.engine.tasks.{task}'): 'a task builds its model around the backbone (the model and MAE '
                                                    'sections, handed on to engine/build.py) and an MAE its pictures'
       for section in ('ModelConfig', 'MaeConfig') for task in ('base', 'mae', 'regress')},
}


def _library_modules() -> dict:
    return {m: p for m, p in _modules().items() if not m.startswith(EDGE)}


def _config_keys() -> set:
    from tkvision.engine.config import DEFAULTS
    return set(DEFAULTS) | set(DEFAULTS['growth']) | set(DEFAULTS['decoder'])


def _key_tables(source: str, keys: set, least: int = 5) -> list:
    """Line numbers of dict / set / list / tuple literals in ``source`` holding ``least`` or more config key names
    as string constants: a table of keys beside the fields."""
    found = []
    for node in ast.walk(ast.parse(source)):
        items = node.keys if isinstance(node, ast.Dict) else (
            node.elts if isinstance(node, (ast.Set, ast.List, ast.Tuple)) else [])
        names = {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
        if len(names & keys) >= least:
            found.append(node.lineno)
    return found


def test_s1_each_config_key_is_declared_once_with_its_rule_and_resume_flag():
    """S1: every key is one field of one section, carrying its rule and whether a resume may change it in the
    field's metadata (`tkvision.utils.config_fields.key`); `RULES` and `RESUME_MUTABLE` are read from the fields,
    and no module of the library keeps another table of key names."""
    from tkvision.engine.config import DEFAULTS, RESUME_MUTABLE, RULES, SECTION_CLASSES
    from tkvision.utils.config_fields import section_fields
    declared = []
    for name, cls in SECTION_CLASSES.items():
        for key, field in section_fields(cls).items():
            assert set(field.metadata) == {'allowed', 'resume'}, f'{cls.__name__}.{key}: declare it with key()'
            declared.append(('growth.' if name == 'growth' else '') + key)
            assert (declared[-1] in RESUME_MUTABLE) == field.metadata['resume']
    assert len(declared) == len(set(declared)) and set(declared) == set(RULES)
    assert {k.split('.')[0] for k in declared} == set(DEFAULTS)
    keys = _config_keys()
    tables = {m: _key_tables(open(p).read(), keys) for m, p in _library_modules().items()}
    assert {m: lines for m, lines in tables.items() if lines} == {}


def test_s1_the_table_finder_finds_a_parallel_table():
    """The checker itself: a resume list of six keys is found; a dict of three is not."""
    keys = _config_keys()
    assert _key_tables("MUTABLE = frozenset({'lr', 'blr', 'min_lr', 'sched', 'epochs', 'output'})", keys) == [1]
    assert _key_tables("x = {'lr': 1, 'epochs': 2, 'seed': 3}", keys) == []


def _section_imports(modules: dict) -> dict:
    """``{(section class name, importing module)}`` of every ``from X import <Section>`` in ``modules``."""
    from tkvision.engine.build import DecoderConfig
    from tkvision.engine.config import SECTION_CLASSES, TrainConfig
    names = {c.__name__ for c in [*SECTION_CLASSES.values(), DecoderConfig, TrainConfig]}
    found = set()
    for module, path in modules.items():
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                found |= {(a.name, module) for a in node.names if a.name in names}
    return found


def _section_owner(name: str) -> str:
    from tkvision.engine.build import DecoderConfig
    from tkvision.engine.config import SECTION_CLASSES, TrainConfig
    return {c.__name__: c.__module__ for c in [*SECTION_CLASSES.values(), DecoderConfig, TrainConfig]}[name]


def _unowned_reads(imports: set) -> list:
    """The imports of `_section_imports` by a module that is neither the section's component (its module, or its
    package for a package's section), the config-file code nor the trainer, nor a named exception."""
    out = []
    for name, module in sorted(imports):
        owner = _section_owner(name)
        package = owner.rsplit('.', 1)[0] if owner.startswith('tkvision.data') else owner
        whole = name == 'TrainConfig'
        if module == owner or (not whole and (module.startswith(package) or module in CONFIG_CODE)) \
                or (whole and module in ('tkvision.engine.config', 'tkvision.engine.trainer')) \
                or (name, module) in SECTION_READERS_BESIDE:
            continue
        out.append(f'{module} imports {name}')
    return out


def test_s2_a_section_is_read_by_its_component_and_only_the_trainer_sees_the_whole():
    """S2: a section class is imported only by its component's module (the data package for ``DataConfig``), the
    config-file code and the trainer (`SECTION_READERS_BESIDE` names the one exception and why); ``TrainConfig``,
    the whole config, only by the config code and the trainer. The command lines and drivers at the edge may."""
    assert _unowned_reads(_section_imports(_library_modules())) == []


def test_s2_the_checker_finds_a_section_read_outside_its_component():
    assert _unowned_reads({('OptimConfig', 'tkvision.engine.loop'), ('LossConfig', 'tkvision.engine.loss'),
                           ('TrainConfig', 'tkvision.engine.checkpoint')}) == [
        'tkvision.engine.loop imports OptimConfig', 'tkvision.engine.checkpoint imports TrainConfig']


def _carriers() -> dict:
    """``{attribute: (owner module, section fields)}`` of the attributes through which an object of the library
    keeps a section it was given (``self.optim = optim`` of an ``optim: OptimConfig`` parameter)."""
    from tkvision.engine.build import DecoderConfig
    from tkvision.engine.config import SECTION_CLASSES
    from tkvision.utils.config_fields import section_fields
    fields = {c.__name__: set(section_fields(c)) for c in [*SECTION_CLASSES.values(), DecoderConfig]}
    out = {}
    for module, path in _library_modules().items():
        for node in ast.walk(ast.parse(open(path).read())):
            if not (isinstance(node, ast.FunctionDef) and node.name == '__init__'):
                continue
            typed = {a.arg: ast.unparse(a.annotation) for a in node.args.args + node.args.kwonlyargs if a.annotation}
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.Assign):
                    pairs = zip(stmt.targets[0].elts, stmt.value.elts) if isinstance(stmt.targets[0], ast.Tuple) \
                        and isinstance(stmt.value, ast.Tuple) else [(stmt.targets[0], stmt.value)]
                    for target, value in pairs:
                        if isinstance(target, ast.Attribute) and isinstance(value, ast.Name) \
                                and typed.get(value.id) in fields:
                            out[target.attr] = (module, fields[typed[value.id]])
    return out


def _carrier_reads(source: str, module: str, carriers: dict) -> list:
    """``a.<carrier>.<field>`` chains in ``source`` outside the carrier's module (``config.<section>.<field>``,
    the trainer's own whole config, aside)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            carrier, base = node.value.attr, node.value.value
            owner, fields = carriers.get(carrier, (module, set()))
            if owner != module and node.attr in fields and not (isinstance(base, ast.Name) and base.id == 'config'):
                found.append(f'{module}:{node.lineno} .{carrier}.{node.attr}')
    return found


def test_s3_no_section_is_read_through_an_object_that_carries_it():
    """S3: a section kept by an object (``RunData._data``, ``RunOptim._optim`` and ``._growth``) is read only in
    that object's module; the others get values (``RunData.batch_size``, ``RunOptim.eval_after_step``)."""
    carriers = _carriers()
    assert {'_data', '_optim', '_growth'} <= set(carriers)
    found = [f for m, p in _library_modules().items() for f in _carrier_reads(open(p).read(), m, carriers)]
    assert found == []


def test_s3_the_checker_finds_a_read_through_a_carrier():
    carriers = _carriers()
    source = 'def f(run, loss):\n    return run.optim._growth.eval_after_step, loss.data._data.batch_size, run.optim.lr\n'
    assert sorted(_carrier_reads(source, 'tkvision.engine.x', carriers)) == [
        'tkvision.engine.x:2 ._data.batch_size', 'tkvision.engine.x:2 ._growth.eval_after_step']


def _whole_takers(source: str, module: str) -> list:
    """Functions of ``source`` with a parameter annotated ``Trainer`` (outside the trainer) or ``TrainConfig``
    (outside the config code and the trainer)."""
    allowed = {'Trainer': ('tkvision.engine.trainer',),
               'TrainConfig': ('tkvision.engine.trainer', 'tkvision.engine.config')}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                kind = ast.unparse(a.annotation) if a.annotation else ''
                for name, modules in allowed.items():
                    if name in kind and module not in modules:
                        found.append(f'{module}.{node.name}({a.arg}: {kind})')
    return found


def test_s4_a_stage_takes_the_parts_it_uses():
    """S4: no function but the trainer's takes the trainer, and none but the config code's and the trainer's the
    whole config: each stage is handed its parts (the loop: state, data, task, optim, clock, processes, log; the
    evaluator: data, task, processes)."""
    found = [f for m, p in _library_modules().items() for f in _whole_takers(open(p).read(), m)]
    assert found == []


def test_s4_the_checker_finds_a_stage_that_takes_the_whole():
    source = 'def evaluate_epoch(run: Trainer, state):\n    pass\ndef build(config: Optional[TrainConfig]):\n    pass\n'
    assert _whole_takers(source, 'tkvision.engine.run_eval') == [
        'tkvision.engine.run_eval.evaluate_epoch(run: Trainer)',
        'tkvision.engine.run_eval.build(config: Optional[TrainConfig])']


#: The task flags of the record the tasks were before they were classes: no stage may branch on them.
TASK_FLAGS = ('reconstructs', 'probes', 'predicts_classes')


def _task_name_comparisons(source: str, module: str) -> list:
    """``==`` / ``!=`` / ``in`` comparisons of ``source`` with a task's name (``'mae'``, ``'classify'``,
    ``'linprobe'``, ``'regress'``) as a string constant, and reads of a task flag (`TASK_FLAGS`): ``module:line``."""
    from tkvision.engine.tasks import TASKS
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            constants = [o.value for o in operands if isinstance(o, ast.Constant)]
            constants += [e.value for o in operands if isinstance(o, (ast.Tuple, ast.List, ast.Set)) for e in o.elts
                          if isinstance(e, ast.Constant)]
            if any(c in TASKS for c in constants if isinstance(c, str)):
                found.append(f'{module}:{node.lineno}')
        if isinstance(node, ast.Attribute) and node.attr in TASK_FLAGS:
            found.append(f'{module}:{node.lineno}')
    return found


def test_no_module_but_the_tasks_own_names_a_task_or_a_task_flag():
    """Each task is a class (``tkvision.engine.tasks``: classify, mae, linprobe, regress) that every stage asks: no
    module of the library, tools included, outside ``tkvision/engine/tasks/`` compares the ``task`` key's value with a
    task's name or reads a task flag, so a new task is one module there."""
    modules = dict(_library_modules(), **{f'tools.{n[:-3]}': os.path.join(ROOT, 'tools', n)
                                          for n in os.listdir(os.path.join(ROOT, 'tools')) if n.endswith('.py')})
    found = [f for m, p in modules.items() if not m.startswith('tkvision.engine.tasks')
             for f in _task_name_comparisons(open(p).read(), m)]
    assert found == []


def test_the_task_checker_finds_a_comparison():
    source = ("if cfg['task'] == 'mae':\n    pass\nok = task in ('linprobe', 'x')\nfine = name == 'mean'\n"
              "if task.reconstructs:\n    pass\n")
    assert _task_name_comparisons(source, 'tkvision.engine.x') == ['tkvision.engine.x:1', 'tkvision.engine.x:3',
                                                                   'tkvision.engine.x:5']
