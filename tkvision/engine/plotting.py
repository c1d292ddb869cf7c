"""Plots of training runs (matplotlib, Agg backend: no display needed); ``plt`` for the experiment drivers' figures.
Every figure is written through ``tkvision.utils.files.atomic_write`` (a temporary file, then renamed: a kill never
leaves half a PNG, and a planted link at the final name is replaced, not followed)."""
from typing import Optional, Sequence, Tuple

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from ..utils.files import atomic_write  # noqa: E402

__all__ = ['plot_curves', 'confusion_figure', 'save_figure', 'plt', 'Series']

#: ``(metrics.csv column, legend)`` pairs of one panel.
Series = Sequence[Tuple[str, str]]


def save_figure(fig: 'matplotlib.figure.Figure', path: str, dpi: int = 100) -> None:
    """Save ``fig`` as the PNG ``path`` atomically and close it."""
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format='png'))
    finally:
        plt.close(fig)


def plot_curves(
        history: list,
        path: str,
        title: str = '',
        losses: Series = (('train_loss', 'train loss'), ('val_loss', 'val loss')),
        metric: Optional[Tuple[str, str, Series]] = None,
) -> None:
    """Loss against epoch, and beside it a task's metric (``metric``: ``(title, axis label, series)``, e.g. top-1),
    saved as PNG at ``path``. The task says which columns (``tkvision.engine.tasks.Task.curves``).

    Args:
        history: list of per-epoch dicts (``metrics.csv`` rows) with ``epoch`` and the columns named; values may be
            strings, empty where not evaluated.
        losses: the loss panel's series.
        metric: the second panel, or None for the loss panel alone.
    """
    def series(key):
        pts = [(int(r['epoch']) + 1, float(r[key])) for r in history if r.get(key) not in (None, '')]
        return [p[0] for p in pts], [p[1] for p in pts]

    panels = [('loss', 'loss', losses)] + ([metric] if metric else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(10 if len(panels) == 2 else 5.5, 4), squeeze=False)
    for ax, (name, label, lines) in zip(axes[0], panels):
        for key, legend in lines:
            x, y = series(key)
            if x:
                ax.plot(x, y, marker='o', label=legend)
        ax.set(xlabel='epoch', ylabel=label, title=name)
        ax.grid(alpha=.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)


def confusion_figure(
        confusion: torch.Tensor,
        classes: Sequence[str],
        title: str,
        path: str,
) -> None:
    """A confusion matrix ``[C, C]`` (row: true class, column: predicted) drawn normalised by row (each row's share of
    its class's images, in %), with the counts' classes on both axes, saved as PNG at ``path``."""
    counts = confusion.double()
    shares = 100 * counts / counts.sum(dim=1, keepdim=True).clamp(min=1)
    size = min(12.0, max(4.0, 0.45 * len(classes) + 2))  # 1,000 classes: colours, no numbers, a bounded figure
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(shares.numpy(), cmap='Blues', vmin=0, vmax=100)
    if len(classes) <= 30:  # beyond that the labels and numbers are unreadable: the colours stay
        ax.set_xticks(range(len(classes)), classes, rotation=60, ha='right')
        ax.set_yticks(range(len(classes)), classes)
        for i in range(len(classes)):
            for j in range(len(classes)):
                ax.text(j, i, f'{shares[i, j]:.0f}', ha='center', va='center', fontsize=7,
                        color='white' if shares[i, j] > 50 else 'black')
    ax.set(xlabel='predicted class', ylabel='true class', title=title)
    fig.colorbar(image, ax=ax, label='% of the true class')
    fig.tight_layout()
    save_figure(fig, path)
