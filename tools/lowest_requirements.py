#!/usr/bin/env python
"""Print ``name==version`` for the lower bound (``>=``) of each named requirement of setup.cfg, so CI can
install exactly what setup.cfg promises works: ``python tools/lowest_requirements.py timm safetensors``.

Exit status 2 when a named package has no ``>=`` bound in setup.cfg.
"""
import configparser
import os
import re
import sys


def lowest(names) -> list:
    """``['timm==1.0.31', ...]``: the ``>=`` bound of each of ``names`` in setup.cfg's install_requires."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'setup.cfg'))
    bounds = {}
    for line in cfg['options']['install_requires'].split('\n'):
        m = re.match(r'\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][^,;\s]*)', line)
        if m:
            bounds[m.group(1).lower()] = m.group(2)
    missing = [n for n in names if n.lower() not in bounds]
    if missing:
        raise SystemExit(f'error: no >= bound in setup.cfg for {", ".join(missing)}')
    return [f'{n}=={bounds[n.lower()]}' for n in names]


if __name__ == '__main__':
    print('\n'.join(lowest(sys.argv[1:])))
