"""A config key declared once: its field in the section of the component that reads it, with its type, default,
allowed values and whether a resumed run may change it (dataclass field metadata, torchtitan's rule: a section is
the ``Config`` of one component and lives in its module, https://github.com/pytorch/torchtitan).

A section is a frozen dataclass whose fields are declared with `key`; the docstring under each field says what it
means (``tools/render_reference.py`` reads both into ``docs/reference/config.md``). The config-file code
(``tkvision.engine.config``) reads the rules and the resume flags from the fields (`field_rules`,
`resume_mutable`); no other table lists the keys.
"""
import dataclasses
import math
from types import MappingProxyType
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, cast

__all__ = ['Rule', 'key', 'integer', 'number', 'boolean', 'string', 'mapping', 'numbers', 'choice', 'rule',
           'is_number', 'field_rules', 'resume_mutable', 'section_fields', 'section_defaults', 'section_from_mapping',
           'frozen_value', 'plain_value']


class Rule(NamedTuple):
    """What a key allows: ``check(value) -> bool``, the words an error message says (``'an integer >= 1'``), and the
    type an allowed value is stored as (``coerce(value)``: ``int`` for an integer rule, so ``300.0`` is kept as
    ``300``; None keeps the value as it is)."""
    check: Callable[[Any], bool]
    words: str
    coerce: Optional[Callable[[Any], Any]] = None

    def normalize(self, value: Any) -> Any:
        """``value`` (allowed by `check`) as the key stores it: converted by `coerce`, ``None`` kept."""
        return value if self.coerce is None or value is None else self.coerce(value)


def is_number(value: Any) -> bool:
    """A finite number (a bool is not one; ``.inf`` and ``.nan`` would only fail later, as NaN losses)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bounds(lo, hi, lo_open, hi_open):
    def ok(x):
        return (lo is None or (x > lo if lo_open else x >= lo)) and (hi is None or (x < hi if hi_open else x <= hi))
    words = ''
    if lo is not None:
        words += f" {'>' if lo_open else '>='} {lo}"
    if hi is not None:
        words += f"{' and' if lo is not None else ''} {'<' if hi_open else '<='} {hi}"
    return ok, words


def _nullable(check: Callable[[Any], bool], words: str, null: bool, coerce: Optional[Callable] = None) -> Rule:
    return Rule(lambda v: null if v is None else check(v), words + (' or null' if null else ''), coerce)


def integer(
        lo: Optional[float] = None,
        hi: Optional[float] = None,
        *,
        null: bool = False,
) -> Rule:
    """A whole number within ``[lo, hi]`` (``300.0`` counts; the config-file code stores it as ``300``)."""
    ok, words = _bounds(lo, hi, False, False)
    return _nullable(lambda v: is_number(v) and float(v).is_integer() and ok(v), 'an integer' + words, null, int)


def number(
        lo: Optional[float] = None,
        hi: Optional[float] = None,
        *,
        lo_open: bool = False,
        hi_open: bool = False,
        null: bool = False,
) -> Rule:
    """A finite number within the bounds (``lo_open``: ``> lo``; ``hi_open``: ``< hi``)."""
    ok, words = _bounds(lo, hi, lo_open, hi_open)
    return _nullable(lambda v: is_number(v) and ok(v), 'a number' + words, null)


def boolean() -> Rule:
    """``true`` or ``false``."""
    return Rule(lambda v: isinstance(v, bool), 'true or false')


def string(*, null: bool = False) -> Rule:
    """A non-empty string."""
    return _nullable(lambda v: isinstance(v, str) and v != '', 'a string', null)


def mapping() -> Rule:
    """A mapping (its keys are checked by the function it is passed to)."""
    return Rule(lambda v: isinstance(v, dict), 'a mapping')


def numbers(
        lo: Optional[float] = None,
        hi: Optional[float] = None,
        *,
        lo_open: bool = False,
        hi_open: bool = False,
        length: Optional[int] = None,
        null: bool = False,
) -> Rule:
    """A non-empty list of finite numbers within the bounds (``length`` of them when given)."""
    ok, words = _bounds(lo, hi, lo_open, hi_open)

    def check(v):
        return (isinstance(v, (list, tuple)) and len(v) > 0 and (length is None or len(v) == length)
                and all(is_number(x) and ok(x) for x in v))
    return _nullable(check, f'a list of {length or "one or more"} numbers' + words, null)


def choice(*values: Any) -> Rule:
    """One of ``values`` (``None`` written null)."""
    return Rule(lambda v: v in values, 'one of ' + ', '.join('null' if c is None else repr(c) for c in values))


def rule(check: Callable[[Any], bool], words: str) -> Rule:
    """A rule of its own: ``check(value) -> bool`` and what it allows, in words."""
    return Rule(check, words)


def key(
        default: Any = dataclasses.MISSING,
        *,
        allowed: Rule,
        resume: bool = False,
        default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A section field: its ``default`` (or ``default_factory``), what it ``allowed`` (a `Rule`), and whether a
    resumed run may change it (``resume``: the schedule is rebuilt at the current update, or the key sets where
    and how fast the run goes, not what it computes)."""
    metadata = MappingProxyType({'allowed': allowed, 'resume': resume})
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section_fields(cls: type, prefix: str = '') -> Dict[str, dataclasses.Field]:
    """``{key: field}`` of the section class ``cls``, a nested section's keys as ``'<field>.<key>'``."""
    out: Dict[str, dataclasses.Field] = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type):
            out.update(section_fields(cast(type, f.type), f'{prefix}{f.name}.'))
        else:
            out[prefix + f.name] = f
    return out


def field_rules(cls: type) -> Dict[str, Rule]:
    """``{key: Rule}`` of every key of the section class ``cls`` (nested keys dotted)."""
    return {name: f.metadata['allowed'] for name, f in section_fields(cls).items()}


def resume_mutable(cls: type) -> frozenset:
    """The keys of ``cls`` (nested keys dotted) a resumed run may change."""
    return frozenset(name for name, f in section_fields(cls).items() if f.metadata['resume'])


def plain_value(value: Any) -> Any:
    """``value`` as a config file holds it: tuples as lists, read-only mappings and sections as dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: plain_value(item) for k, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(item) for item in value]
    return value


def frozen_value(value: Any) -> Any:
    """``value`` read-only all the way down: lists as tuples, mappings as ``MappingProxyType``."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: frozen_value(item) for k, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen_value(item) for item in value)
    return value


def section_defaults(cls: type) -> Dict[str, Any]:
    """``{key: default}`` of the section class ``cls`` as a config file writes it (lists, dicts; a nested
    section's keys as a nested mapping)."""
    return plain_value(cls())


def section_from_mapping(
        cls: type,
        values: Mapping[str, Any],
) -> Any:
    """An instance of the section class ``cls`` from ``values``, a mapping holding its keys (and maybe others), a
    nested section from its own mapping; each value frozen (`frozen_value`).

    Raises:
        KeyError: a key of the section missing from ``values``.
    """
    kwargs = {}
    for f in dataclasses.fields(cls):
        value = values[f.name]
        nested = dataclasses.is_dataclass(f.type)
        kwargs[f.name] = section_from_mapping(cast(type, f.type), value) if nested else frozen_value(value)
    return cls(**kwargs)
