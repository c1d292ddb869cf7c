"""The studies behind the results pages of ``docs/``: each a module run as ``python -m studies.<study>.<module>``
from the repository's root, importing tkvision as any user code does. Not part of the wheel (the package ships
the library and the users' recipes); CI runs their tests from the repository.

- `studies.comparison`: TokenFormer against timm's ViT at equal parameters, compute and time;
- `studies.growth`: growth chains against training from scratch (paper Fig. 3);
- `studies.elastic`: one model at any prefix of its parameter tokens against separately trained ones;
- `studies.naflex`: the NaFlex family against timm's NaFlexViT;
- `studies.ringformer`: attention distance of the recurrent families;
- `studies.performance`: layer, data and loader benchmarks, the trainer against timm's, the GPU report.
"""
import os
import tempfile

__all__ = ['ROOT', 'portable_command']

#: The repository's root: where a study's subprocesses run (``tools/train.py``, ``-m tkvision...``), whatever
#: the caller's current folder.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def portable_command(args) -> str:
    """A command line to store in a results file: paths under the current folder made relative to it, paths in
    the temporary folder shown as ``<tmp>/...``, so the file says what to run anywhere, not where it ran."""
    here, tmp = os.getcwd(), tempfile.gettempdir()
    out = []
    for arg in map(str, args):
        if os.path.isabs(arg) and arg.startswith(here + os.sep):
            arg = os.path.relpath(arg, here)
        elif os.path.isabs(arg) and arg.startswith(tmp + os.sep):
            arg = '<tmp>' + arg[len(tmp):]
        out.append(arg)
    return ' '.join(out)
