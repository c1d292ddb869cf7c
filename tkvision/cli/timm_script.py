"""Run one of timm's own scripts with our models registered: ``python -m tkvision.cli.timm_script
path/to/pytorch-image-models/train.py --model tokenformer_vit_ti16 ...``.

timm has no plugin entry point, so its scripts (``train.py``, ``validate.py``, ``benchmark.py``,
``inference.py``, ``onnx_export.py``, ``avg_checkpoints.py``; in timm's repository, not in its wheel)
only know our families once `tkvision` is imported. This runs the script as ``__main__`` after
that import, with the script's own arguments. Flags our models need in timm's scripts:
``--model-kwargs img_size=28 patch_size=7`` (any constructor argument) with ``--img-size 28`` (the data
config comes from the pretrained config, 224 px, as for timm's own ViT), ``--in-chans 1`` for a
1-channel model, ``--checkpoint model.safetensors`` for our trainer's weights (``validate.py``).
"""
import os
import runpy
import sys
from typing import Optional, Sequence

import tkvision  # noqa: F401  (registers the tokenformer / ringformer families with timm)

__all__ = ['main']


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``argv[0]`` (a timm script) as ``__main__`` with ``argv[1:]`` as its arguments.

    Raises:
        SystemExit: whatever status the script exits with. Returns 2 (the usage line and what is wrong,
        on stderr) when no script is given or the file does not exist.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    usage = 'usage: python -m tkvision.cli.timm_script path/to/timm_script.py [its arguments]'
    where = "timm's scripts are in its repository: git clone https://github.com/huggingface/pytorch-image-models"
    if not argv:
        print(f'{usage}\nthe path of the timm script to run is missing ({where})', file=sys.stderr)
        return 2
    if not os.path.isfile(argv[0]):
        print(f'{usage}\n{argv[0]} is not a file ({where})', file=sys.stderr)
        return 2
    sys.argv = argv
    runpy.run_path(argv[0], run_name='__main__')
    return 0


if __name__ == '__main__':
    sys.exit(main())
