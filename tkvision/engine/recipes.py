"""The recipes shipped with the package: every YAML file under ``tkvision/configs/`` (a source checkout
links ``configs/`` there), installed with the wheel as package data, as Detectron2 and mmpretrain ship
theirs.

A recipe is named by its path under that folder without ``.yaml``: ``fashion_mnist/quick``,
``imagenet/tokenformer_vit_b16``. ``--config`` takes a file path first; a path that is no file is
looked up here (`config_path`), so ``tkvision-train --config imagenet/tokenformer_vit_b16`` works
from any directory of a pip install. `list_recipes` reads each recipe's header comment (what it
reproduces, its command and its figures, as big_vision's config headers do) for
``tkvision-train --list-recipes``. Files whose name starts with ``_`` are shared bases, not recipes.
"""
import os
import re

from ..utils.errors import ConfigError

__all__ = ['RECIPES_DIR', 'config_path', 'list_recipes', 'format_recipes']

#: Where the shipped recipes live (inside the installed package).
RECIPES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')

#: Header sentences worth showing in a listing: the targets and results a recipe states.
_FIGURES = re.compile(r'\b(target|expected|measured|reproduces)\b', re.I)


def config_path(path: str) -> str:
    """The file ``--config path`` names: ``path`` itself when it is a file, else the shipped recipe of
    that name (``.yaml`` and a leading ``configs/`` optional).

    Raises:
        ConfigError: neither a file nor a shipped recipe; the message says how to list the recipes.
    """
    if os.path.isfile(path):
        return path
    name = path[len('configs/'):] if path.startswith('configs/') else path
    for candidate in (name, name + '.yaml'):
        shipped = os.path.join(RECIPES_DIR, candidate)
        if os.path.isfile(shipped):
            return shipped
    raise ConfigError(f'config file not found: {path} (no such file, and no shipped recipe of that name: '
                      '`tkvision-train --list-recipes` lists them)')


#: The markers around a measured figure in a header (``tools/render_docs.py`` keeps the figure equal to its
#: results file); a listing shows the figure alone.
_VALUE_MARKERS = re.compile(r'<!-- value [^\n]*? -->|<!-- end -->')


def _header(path: str) -> str:
    """The file's opening comment lines, joined into one paragraph (measured figures without their markers)."""
    lines = []
    with open(path) as f:
        for line in f:
            if not line.startswith('#'):
                break
            lines.append(line[1:].strip())
    return _VALUE_MARKERS.sub('', ' '.join(filter(None, lines)))


def list_recipes() -> list:
    """Every shipped recipe, sorted by name: ``[{'name', 'path', 'summary', 'figures'}]``.

    ``summary``: the header's first sentence (what the recipe reproduces); ``figures``: the header's
    sentences that state a target, an expected or a measured result ('' when it states none).
    """
    recipes = []
    for folder, _, files in os.walk(RECIPES_DIR):
        for file in files:
            if not file.endswith('.yaml') or file.startswith('_'):
                continue
            path = os.path.join(folder, file)
            sentences = re.split(r'(?<=[.!?])\s+(?=[A-Z(])', _header(path))
            recipes.append(dict(name=os.path.relpath(path, RECIPES_DIR)[:-len('.yaml')].replace(os.sep, '/'),
                                path=path, summary=sentences[0],
                                figures=' '.join(s for s in sentences[1:] if _FIGURES.search(s))))
    return sorted(recipes, key=lambda r: r['name'])


def format_recipes(recipes: list) -> str:
    """The listing ``tkvision-train --list-recipes`` prints: one line per recipe (name, what it
    reproduces), its figures indented below."""
    width = max((len(r['name']) for r in recipes), default=0)
    lines = []
    for r in recipes:
        lines.append(f"{r['name']:<{width}}  {r['summary']}")
        if r['figures']:
            lines.append(f"{'':<{width}}    {r['figures']}")
    lines.append(f'{len(recipes)} recipes in {RECIPES_DIR}; run one with: tkvision-train --config NAME')
    return '\n'.join(lines)
