"""Plots of training runs (matplotlib, Agg backend: no display needed); ``plt`` for the experiment drivers' figures."""
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ['plot_curves', 'plt']


def plot_curves(
        history: list,
        path: str,
        title: str = '',
        train_label: str = 'train loss',
) -> None:
    """Loss (train, val) and top-1 (val, EMA) against epoch, side by side, saved as PNG at ``path``
    (the loss panel alone for an MAE run, which has no top-1).

    Args:
        history: list of per-epoch dicts (``metrics.csv`` rows) with ``epoch``, ``train_loss`` and,
            where evaluated, ``val_loss``, ``top1``, ``ema_top1``; values may be strings.
        train_label: the training loss's legend (``tkvision.engine.loss.LossConfig.train_loss_label``).
    """
    def series(key):
        pts = [(int(r['epoch']) + 1, float(r[key])) for r in history if r.get(key) not in (None, '')]
        return [p[0] for p in pts], [p[1] for p in pts]

    classify = bool(series('top1')[0])
    fig, axes = plt.subplots(1, 2 if classify else 1, figsize=(10 if classify else 5.5, 4), squeeze=False)
    ax_loss = axes[0, 0]
    losses = ((('train_loss', train_label), ('val_loss', 'val loss (cross-entropy)'))
              if classify else (('train_loss', 'train reconstruction loss'),
                                ('val_loss', 'val reconstruction loss (fixed masks)'),
                                ('ema_val_loss', 'EMA val reconstruction loss')))
    for key, label in losses:
        x, y = series(key)
        if x:
            ax_loss.plot(x, y, marker='o', label=label)
    ax_loss.set(xlabel='epoch', ylabel='loss', title='loss')
    if classify:
        ax_acc = axes[0, 1]
        for key, label in (('top1', 'val top-1'), ('ema_top1', 'EMA val top-1')):
            x, y = series(key)
            if x:
                ax_acc.plot(x, y, marker='o', label=label)
        ax_acc.set(xlabel='epoch', ylabel='top-1 (%)', title='accuracy')
    for ax in axes[0]:
        ax.grid(alpha=.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
