#!/usr/bin/env python
"""How far the whole run config travels, followed call by call through a real (tiny) training run from
``tkvision.engine.trainer.train``: how many call sites hand the config on to a function of tkvision, across
how many modules, and how many of those hand it back to a module it had left. ``tests/test_structure.py``
holds the counts under a ceiling (each builder should receive the section it uses, not the whole config).

``python tools/config_trail.py [--verbose]`` trains two epochs of a tiny model on 256 Fashion-MNIST images
under ``sys.setprofile`` and prints the counts (``--verbose``: every hand-off).

What counts: a call of a tkvision function one of whose arguments is the config or a section of it (a typed
section of `tkvision.engine.config.SECTION_CLASSES`, or a mapping of config keys) or an object that keeps one as an
attribute (the run's context, data, task, clock and state; ``self`` included), made from tkvision code; each call site
once. A
*return*: a hand-off into a module that is already among the modules of the calls that hold the config
on the stack (the way back to a module the config had left).
"""
import argparse
import os
import sys
import tempfile
from collections.abc import Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module(frame) -> str:
    return frame.f_globals.get('__name__', '')


def _is_config(value, keys) -> bool:
    """The config or a section of it: a typed section (`tkvision.engine.config.SECTION_CLASSES`), or a mapping of
    config keys (at least two keys, all of them known)."""
    from tkvision.engine.build import DecoderConfig
    from tkvision.engine.config import SECTION_CLASSES, TrainConfig
    if isinstance(value, (TrainConfig, DecoderConfig, *SECTION_CLASSES.values())):
        return True
    return isinstance(value, Mapping) and len(value) >= 2 and all(isinstance(k, str) for k in value) \
        and set(value) <= keys


def _carries_config(value, keys) -> bool:
    """An object built from the config that keeps a part of it as an attribute."""
    attributes = getattr(value, '__dict__', None)
    if not isinstance(attributes, dict) or isinstance(value, type):
        return False
    return any(_is_config(v, keys) for v in attributes.values())


def _holds_config(frame, keys) -> bool:
    """An argument of the call is the config, a section of it, or an object that carries one (the run's context,
    data, loss, clock and state, which hand it on as surely as passing it)."""
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    values = [frame.f_locals.get(n) for n in names]
    return any(_is_config(v, keys) or _carries_config(v, keys) for v in values)


def trail(verbose: bool = False) -> dict:
    """``dict(handoffs, modules, returns, edges)`` of a tiny run (module docstring)."""
    from tkvision.engine.config import DEFAULTS, load_config
    from tkvision.engine.trainer import train
    keys = set(DEFAULTS) | set(DEFAULTS['growth'])
    edges, visited = {}, {'tkvision.engine.trainer'}

    def profile(frame, event, arg):
        if event != 'call' or not _module(frame).startswith('tkvision') or frame.f_back is None:
            return
        caller = frame.f_back
        if not _module(caller).startswith('tkvision') or not _holds_config(frame, keys):
            return
        site = (_module(caller), caller.f_code.co_name, caller.f_lineno, _module(frame), frame.f_code.co_name)
        if site in edges:
            return
        callee = _module(frame)
        edges[site] = callee != site[0] and callee in visited  # back into a module the config had left
        visited.add(callee)

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(None, dict(model_kwargs=dict(img_size=28, patch_size=7, in_chans=1, embed_dim=16, depth=1,
                                                       num_heads=2, num_tokens=8),
                                     rrc_scale=None, epochs=2, batch_size=64, train_subset=256, val_subset=128,
                                     threads=1, progress=False, output=os.path.join(out, 'run')))
        sys.setprofile(profile)
        try:
            train(cfg)
        finally:
            sys.setprofile(None)
    if verbose:
        for (m, fn, line, callee, name), back in edges.items():
            print(f"{m}.{fn}:{line} -> {callee}.{name}" + ('   (returns)' if back else ''))
    return dict(handoffs=len(edges), modules=len({s[3] for s in edges}), returns=sum(edges.values()), edges=edges)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--verbose', action='store_true', help='print every hand-off')
    args = ap.parse_args(argv)
    t = trail(args.verbose)
    print(f"cfg handed on {t['handoffs']} times across {t['modules']} modules; it comes back {t['returns']} times "
          'to a module it had left')
    return 0


if __name__ == '__main__':
    sys.exit(main())
