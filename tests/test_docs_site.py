"""The documentation site: built strict by MkDocs (a warning or a broken link fails), and read in a real
browser (Debian's headless Chromium): the home page and an API reference page render with their titles and
``Pattention`` in the page. Screenshots are kept in ``build/test-artifacts/``."""
import os
import subprocess
import sys

import pytest

from .helpers import ROOT

CHROMIUM = '/usr/bin/chromium'
#: Chromium as root, headless, without the background connections a closed network refuses.
FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync']
ARTIFACTS = os.path.join(ROOT, 'build', 'test-artifacts')


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp('site')
    res = subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '--strict', '--site-dir', str(out)], cwd=ROOT,
                         capture_output=True, text=True, env=dict(os.environ, NO_MKDOCS_2_WARNING='1'))
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _browse(page: str, profile, screenshot: str = None) -> str:
    """The DOM Chromium renders for ``page`` (and a screenshot of it)."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f'{CHROMIUM} is missing: make test installs Debian\'s chromium package')
    url = f'file://{page}'
    dom = subprocess.run([CHROMIUM, *FLAGS, f'--user-data-dir={profile}', '--dump-dom', url], capture_output=True,
                         text=True, timeout=120)
    if screenshot:
        os.makedirs(ARTIFACTS, exist_ok=True)
        subprocess.run([CHROMIUM, *FLAGS, f'--user-data-dir={profile}', '--window-size=1280,1600',
                        f'--screenshot={os.path.join(ARTIFACTS, screenshot)}', url], capture_output=True, timeout=120)
        assert os.path.getsize(os.path.join(ARTIFACTS, screenshot)) > 10_000  # a rendered page, not a blank
    return dom.stdout


@pytest.mark.slow
def test_the_site_builds_strict_and_its_pages_render_in_a_browser(site, tmp_path):
    home = _browse(site / 'index.html', tmp_path / 'profile', 'docs_home.png')
    assert '<title>tkvision</title>' in home and 'Pattention' in home and 'How good' in home
    api = _browse(site / 'reference' / 'api.html', tmp_path / 'profile', 'docs_api.png')
    assert '<title>Python API - tkvision</title>' in api and 'Pattention' in api
    assert 'backward_mode' in api and 'prefix_tokens' in api  # from the docstrings
    _assert_each_parameter_listed_alone(api, 'tkvision.layers.block.Block')


def _assert_each_parameter_listed_alone(dom: str, identifier: str):
    """The rendered Parameters table of ``identifier`` lists each parameter of its signature in a row of its
    own: a docstring line describing two at once ('value_std / key_std: ...') rendered as one garbled name."""
    import importlib
    import inspect
    import re
    module, name = identifier.rsplit('.', 1)
    signature = inspect.signature(getattr(importlib.import_module(module), name))
    section = dom[dom.index(f'id="{identifier}"'):]
    table = section[section.index('Parameters'):section.index('</table>')]
    rows = re.findall(r'<tr class="doc-section-item">\s*<td>\s*<code>([^<]+)</code>', table)
    expected = [p for p in signature.parameters if p not in ('self', 'kwargs', 'args')]
    assert sorted(rows) == sorted(expected), (rows, expected)  # each once, none garbled into another


def test_every_link_between_the_sites_pages_resolves(site):
    """Each relative link of every built page reaches a file of the site, never a folder (from disk a folder opens as
    a listing: the site is built with ``use_directory_urls: false``): a results page's link to the report
    behind it (``bench/*.md``, ``growth/report.md``, ...) is a page, not a 404 (those reports were left out
    of the build while the results pages linked them)."""
    import re
    from urllib.parse import unquote, urlsplit
    broken = []
    for page in site.rglob('*.html'):
        for href in re.findall(r'href="([^"]+)"', page.read_text(errors='replace')):
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or not parts.path or parts.path.startswith('/'):
                continue
            target = (page.parent / unquote(parts.path)).resolve()
            if target.is_dir():  # opened from disk (file://), a folder shows as a listing, not its page
                broken.append(f'{page.relative_to(site)} -> {href} (a folder)')
            elif not target.exists():
                broken.append(f'{page.relative_to(site)} -> {href}')
    assert not broken, broken[:20]


#: A list item's first line in a page's markdown source: ``- x``, ``* x``, ``+ x`` or ``1. x``.
_LIST_ITEM = r'^\s*(?:[-*+]|\d+\.)\s+\S'


def _source_list_items(text: str) -> int:
    """The list items a page's source holds, outside fenced code and HTML comments (a comment's lines kept as
    blank lines, so nothing joins across it)."""
    import re
    text = re.sub(r'<!--.*?-->', lambda m: '\n' * m.group(0).count('\n'), text, flags=re.S)
    count, fenced = 0, False
    for line in text.splitlines():
        if line.lstrip().startswith('```'):
            fenced = not fenced
        elif not fenced and re.match(_LIST_ITEM, line):
            count += 1
    return count


def test_every_list_in_the_pages_renders_as_a_list(site):
    """Each list item of a page's source is an ``<li>`` of its built page: a list right after a lead-in line with no
    blank line, or a list item whose continuation line begins with an inline value marker, rendered as one run-on
    paragraph ("1. ... 2. ... 3.") while the strict build passed."""
    import pathlib
    import re
    docs = pathlib.Path(ROOT, 'docs')
    wrong, checked = [], 0
    for source in sorted(p for p in docs.rglob('*.md') if p.name != 'api.md'):  # api.md: mkdocstrings' own
        relative = source.relative_to(docs).with_suffix('')
        page = site / relative.with_suffix('.html')  # use_directory_urls: false
        if not page.exists():
            continue
        checked += 1
        html = page.read_text(errors='replace')
        article = html[html.index('<article'):html.index('</article>')]
        rendered = len(re.findall(r'<li[ >]', article))
        text = re.sub(r'^--8<-- "([^"]+)"$', lambda m: open(os.path.join(ROOT, m.group(1))).read(),
                      source.read_text(), flags=re.M)  # a snippet (changelog.md includes CHANGELOG.md)
        expected = _source_list_items(text)
        if rendered != expected:
            wrong.append(f'docs/{relative}.md: {expected} list items in the source, {rendered} rendered')
    assert checked > 20 and not wrong, (checked, wrong)


def test_no_paragraph_is_cut_by_a_value_marker(site):
    """A line of a page's source that begins with an inline value or compare marker (``<!-- value ... -->``) is an
    HTML block to Markdown, in MkDocs as on GitHub: the paragraph it sits in was cut in two around it ("...
    against the ViT is</p> <!-- compare --> <p>level within ..."). The built pages hold no marker as a block of its
    own, and the README, which GitHub renders, no marker at the start of a paragraph's later line."""
    import pathlib
    import re
    block = re.compile(r'^\s*<!-- (?:value|compare) ', re.M)
    cut = [str(page.relative_to(site)) for page in sorted(pathlib.Path(site).rglob('*.html'))
           if block.search(page.read_text(errors='replace'))]
    lines = open(os.path.join(ROOT, 'README.md')).read().split('\n')
    cut += [f'README.md:{i + 1}' for i in range(1, len(lines))
            if block.match(lines[i]) and lines[i - 1].strip()]
    assert not cut, cut


#: Appended to a copy of a built page: after the layout, each table header naming a result (``top-1``) as its right
#: edge and the right edge of the table's visible box (its scroll wrapper's), in CSS pixels, into ``<pre id=probe>``.
_WIDTH_PROBE = '''<script>
const found = [];
document.querySelectorAll('article table').forEach((table, i) => {
  const box = (table.closest('.md-typeset__scrollwrap') || table.parentElement).getBoundingClientRect();
  table.querySelectorAll('th').forEach(th => {
    if (/top-1/.test(th.textContent)) {
      found.push({table: i, header: th.textContent.trim(), right: th.getBoundingClientRect().right, edge: box.right});
    }
  });
});
const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(found);
document.body.appendChild(pre);
</script>'''


def _result_columns(site, page: str, profile) -> list:
    """``[{table, header, right, edge}]`` of every result column of ``page`` as Chromium lays it out at 1280 px."""
    import json
    import re
    html = (site / page).read_text()
    probe = site / page.replace('.html', '_probe.html')
    probe.write_text(html.replace('</body>', _WIDTH_PROBE + '</body>'))
    dom = subprocess.run([CHROMIUM, *FLAGS, f'--user-data-dir={profile}', '--window-size=1280,1600', '--dump-dom',
                          f'file://{probe}'], capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    return json.loads(found.group(1).replace('&quot;', '"'))


@pytest.mark.slow
def test_the_results_columns_of_the_results_pages_show_at_1280_px(site, tmp_path):
    """At a 1280-px window every column of a results table that holds a top-1 ends inside the table's visible box,
    not behind its horizontal scroll (the comparison's "1. Equal parameters" table hid both). The probe sees what
    it measures: on a page where a planted table is wider than the window, its result column is past the edge."""
    for page in ('comparison.html', 'cifar10.html'):
        if not (site / page).exists():
            continue
        columns = _result_columns(site, page, tmp_path / 'profile')
        assert columns, page
        hidden = [c for c in columns if c['right'] > c['edge'] + 1]
        assert not hidden, (page, hidden)
    wide = '<table><tr>' + ''.join(f'<th>a long column name {i}</th>' for i in range(30)) + '<th>top-1</th></tr></table>'
    html = (site / 'comparison.html').read_text().replace('<article class="md-content__inner md-typeset">',
                                                        '<article class="md-content__inner md-typeset">' + wide, 1)
    (site / 'planted.html').write_text(html)
    planted = [c for c in _result_columns(site, 'planted.html', tmp_path / 'profile') if c['header'] == 'top-1']
    assert planted and planted[0]['right'] > planted[0]['edge']
