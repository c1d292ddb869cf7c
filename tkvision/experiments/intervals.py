"""The project's one rule for the interval of a difference between two sets of seeds (`gap_interval`), and the
words a comparison may use from it (`compare_words`): what every results page and ``tools/render_docs.py``'s
``compare`` marker say of "ahead", "behind" and "level" comes from here.

Pure Python and SciPy's t quantile (SciPy comes with albumentations): light enough for the docs renderer.
"""
import statistics
from typing import Optional, Sequence, Tuple

__all__ = ['gap_interval', 'compare_words']


def gap_interval(values: list, twin_values: list, digits: int = 2) -> Tuple[float, Optional[float], Optional[float]]:
    """``(gap, low, high)``: the difference of the means of ``values`` and ``twin_values`` (a method's and its
    twin's top-1 over seeds), and its 95% interval, rounded to ``digits``: Welch's t interval, or where one side
    has a single seed, that side's spread taken as the other's (``s · √(1 + 1/n)``, n - 1 degrees of freedom).
    Low and high are None when neither side has two seeds."""
    from scipy import stats  # albumentations' dependency: the one t quantile of the report
    gap = statistics.mean(values) - statistics.mean(twin_values)
    n1, n2 = len(values), len(twin_values)
    if n1 < 2 and n2 < 2:
        return round(gap, digits), None, None
    if n1 < 2 or n2 < 2:
        spread, n = (statistics.stdev(twin_values), n2) if n1 < 2 else (statistics.stdev(values), n1)
        se, df = spread * (1 + 1 / n) ** 0.5, n - 1
    else:
        a, b = statistics.variance(values) / n1, statistics.variance(twin_values) / n2
        se = (a + b) ** 0.5
        df = (a + b) ** 2 / (a ** 2 / (n1 - 1) + b ** 2 / (n2 - 1)) if a + b > 0 else n1 + n2 - 2
    half = float(stats.t.ppf(0.975, df)) * se
    return round(gap, digits), round(gap - half, digits), round(gap + half, digits)


def compare_words(
        values: Sequence[float],
        other_values: Sequence[float],
        unit: str,
        digits: int = 2,
        short: bool = False,
) -> str:
    """The verb and figures of "``values`` against ``other_values``" (one number per seed a side), by
    `gap_interval`'s 95% interval: ``ahead by g`` / ``behind by g`` when the interval excludes 0; when it includes 0,
    ``level within the seed spread`` if the gap is no larger than the larger side's standard deviation, else ``ahead
    on the means only`` / ``behind on the means only``; then the gap, the interval and the seeds of each side, in
    parentheses. With one seed a side there is no interval: ``ahead on one seed a side only``.

    Args:
        values: the first side's figure per seed (top-1 in %, a loss).
        other_values: the other side's.
        unit: the unit of a gap (``'points'``).
        digits: decimals of the figures shown.
        short: the verb and the gap alone (``level (+0.22 points)``, ``behind by 0.69 points``): a summary's form,
            the full parenthesis staying on the results page.

    Raises:
        ValueError: a side with no seed.
    """
    if not values or not other_values:
        raise ValueError(f'a comparison needs a seed a side; got {len(values)} and {len(other_values)}')
    # the verb is decided on the unrounded interval (8 digits: clear of float noise such as 0.1 + 0.2 - 0.3); the
    # figures shown are rounded once, as a results file's gap is, since rounding to 8 digits and then to ``digits``
    # can move a half the other way (-7.885000000000005 would show as -7.88, a single rounding gives -7.89)
    gap, low, high = gap_interval(list(values), list(other_values), digits=8)
    shown = gap_interval(list(values), list(other_values), digits=digits)
    seeds = f'{len(values)} and {len(other_values)} seeds'
    side = 'ahead' if gap > 0 else 'behind'
    size, level = f'{abs(shown[0]):.{digits}f} {unit}', 'level on one seed a side'
    if low is None or high is None:
        if short:
            return f'{side} on one seed a side only ({shown[0]:+.{digits}f} {unit})' if gap else level
        return f'{side} on one seed a side only ({size}; no interval)' if gap else level
    interval = f'95% interval {shown[1]:+.{digits}f} to {shown[2]:+.{digits}f}; {seeds}'
    if low > 0 or high < 0:
        return f'{side} by {size}' + ('' if short else f' ({interval})')
    spread = max(statistics.stdev(v) if len(v) > 1 else 0.0 for v in (values, other_values))
    verb = 'level' if abs(gap) <= spread else f'{side} on the means only'
    if short:
        return f'{verb} ({shown[0]:+.{digits}f} {unit})'
    spread_words = ' within the seed spread' if verb == 'level' else ''
    return f'{verb}{spread_words} ({shown[0]:+.{digits}f} {unit}, {interval})'
