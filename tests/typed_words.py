"""Comparative words typed by hand into what a reader reads: the twin of `typed_figures` for verdicts.

A verdict between two measured arms ("ahead", "behind", "level", "better", "beats", ...) belongs in a ``compare``
marker (tools/render_docs.py), whose verb comes from the gap's 95% interval: "level" when it includes 0, "ahead by" /
"behind by" when it excludes 0, "on the means only" when it includes 0 but the gap exceeds the seed spread. Any other
comparative word in the README, DEVELOPERS.md, a hand-written page under docs/ or a config's comments must be listed
in ``tests/typed_words.csv`` by its **context** (the words around it) with its source: the marker or interval that
supports it, a paper's table, or why it is not a verdict between measured arms (a rule, a plan, a question).

What counts (`WORD`): better, worse, best, worst, beats, wins, gains, loses, trails, matches, outperforms, exceeds,
surpasses, ahead, behind, higher, lower, on par, "holds up" and "holds" ending a clause ("the paper's order holds."),
"level with" and "is / are / stays / ends level". Not counted: words inside code (``best.safetensors``), inside a
rendered marker, and the phrases of `NOT_VERDICTS`.
"""
import csv
import functools
import os
import re
from typing import Dict, List, Tuple

from .typed_figures import ROOT, covered_spans, documents, loose_in, readable_text

LIST_FILE = os.path.join(ROOT, 'tests', 'typed_words.csv')

#: A comparative word (the module docstring says which).
WORD = re.compile(
    r'\b(?:better|worse|best|worst|beats?|beating|wins?|gains?|loses?|trails?|trailing|matches|outperforms?|exceeds?|'
    r'surpass(?:es)?|ahead|behind|higher|lower|on a? ?par|holds? up)\b'
    r'|\blevel\b(?=\s+with\b)|\b(?:is|are|was|were|stays?|stayed|ends?|ended|comes?|came|remains?|lands?)\s+level\b'
    r'|\bholds\b(?=[.,;:)]|\s+(?:here|there|on|at|across|again)\b)', re.I)
#: Phrases where such a word is not a verdict between measured arms.
NOT_VERDICTS = re.compile(
    r'\b(?:lies|studies|figures|nothing|queueing)\s+behind\b'  # "the studies behind the results pages"
    r'|\bbest (?:weights|checkpoint|epoch)\b|\bthe best (?:checkpoint|weights)\b'  # the checkpoint a run keeps
    r'|\blower bounds?\b|\b(?:keys|what) to lower\b'  # setup.cfg's bounds; an error message's advice
    r'|\bkept only if (?:it|validation top-1) beats\b'  # a config's rule for a lever, stated before its run
    r'|\bahead by / behind by\b',  # the legend of the verbs
    re.I)


@functools.lru_cache(maxsize=None)
def _prose(text: str) -> str:
    """`typed_figures.readable_text` with code spans and fenced blocks gone: a word in code is a name."""
    text = re.sub(r'```.*?```|``[^`]+``|`[^`\n]*`', ' ', text, flags=re.S)
    return readable_text(text)


def words(text: str) -> List[Tuple[str, int, int]]:
    """The comparative words of `_prose` output ``text``: ``(word, start, end)``, `NOT_VERDICTS` spared."""
    spared = [m.span() for m in NOT_VERDICTS.finditer(text)]
    return [(m.group(0), *m.span()) for m in WORD.finditer(text)
            if not any(a <= m.start() < b for a, b in spared)]


def word_documents() -> Dict[str, str]:
    """What the check reads: `typed_figures.documents` less the docstrings, mkdocs.yml and the Makefile (the
    verdicts a reader weighs are on the pages and in the configs)."""
    return {where: text for where, text in documents().items()
            if not where.startswith('docstring ') and where not in ('mkdocs.yml', 'Makefile')}


def listed(path: str = LIST_FILE) -> List[Dict[str, str]]:
    """The rows of ``tests/typed_words.csv``: ``where``, ``context``, ``source``."""
    with open(path, encoding='utf-8', newline='') as f:
        return list(csv.DictReader(f))


def loose_words(docs: Dict[str, str], rows: List[Dict[str, str]]) -> Tuple[List[str], List[str]]:
    """``(loose, stale)``: ``'where: word in "context"'`` for each comparative word no listed context covers, and
    each listed row whose context is no longer in its text (remove it)."""
    return loose_in(docs, rows, _page_loose)


@functools.lru_cache(maxsize=None)
def _page_loose(where: str, text: str, contexts: Tuple[str, ...]) -> Tuple[List[str], List[str]]:
    """`loose_words` of one page (cached: a test that plants a sentence in one page re-reads only that one)."""
    text = _prose(text)
    covered, stale = covered_spans(where, text, contexts)
    loose = []
    for word, start, end in words(text):
        if not any(a <= start and end <= b for a, b in covered):
            loose.append(f'{where}: {word} in "{text[max(0, start - 60):end + 30]}"')
    return loose, stale
