"""What the config keys were in earlier releases: keys renamed, replaced and removed, and values removed, each with
what to use instead (``tkvision.engine.config`` reads these tables: a file or an override naming an old key is
refused with what to write, an old checkpoint's config is migrated, and a resume refuses what it can no longer
continue)."""
from typing import Any, Callable, Dict, Tuple

__all__ = ['RENAMED', 'RETIRED_KEYS', 'REPLACED_KEYS', 'RETIRED_VALUES']

#: Keys renamed since an earlier release: ``{old name: new name}``; the old name still reads.
# one name per concept: growth.freeze_old_tokens is another key
RENAMED: Dict[str, str] = {'freeze_old_tokens': 'freeze_loaded_tokens'}

#: Keys removed since an earlier release: ``{key: (the value that did what today's code does, what to do)}``. A
#: file or the command line naming one is refused; an old checkpoint's config drops it when it holds that value.
RETIRED_KEYS: Dict[str, Tuple[Any, str]] = {
    'elastic_tau': ('kept', "prefixes keep the whole layer's tau ('follow' was lower on the means at every prefix, two"
                            " seeds, docs/elastic.md); delete the key"),
    'elastic_start': (0.0, 'the smaller prefixes train from the first step (a delayed start was measured only '
                           'together with in-place distillation, lower on the means, docs/elastic.md); delete the '
                           'key'),
}

#: Keys replaced by another since an earlier release: ``{key: (what to use, how an old checkpoint's value reads)}``.
#: A file or the command line naming one is refused; an old checkpoint's config is translated.
REPLACED_KEYS: Dict[str, Tuple[str, Callable[[Any], Dict[str, Any]]]] = {
    'tensorboard': ('write loggers: [tensorboard] (the loggers key lists every backend: tkvision.engine.loggers)',
                    lambda on: {'loggers': ['tensorboard']} if on else {}),
}

#: Values removed since an earlier release: ``{(key, value): what to use}``.
RETIRED_VALUES: Dict[Tuple[str, Any], str] = {
    ('distillation', 'inplace'): 'in-place distillation was lower than plain elastic training on the means '
                                 '(docs/elastic.md); use distillation: none, or teacher with a trained model',
    ('backward_mode', 'compiled'): "it never beat closed_form (docs/performance.md); use closed_form, and compile: "
                                   'true to compile the whole model',
    ('elastic_sampling', 'sandwich'): 'it was never trained and cost the most per step; use largest_plus_random '
                                      '(the default), all or random',
    ('elastic_nesting', 'no_attention'): 'it was never trained; use all (the default) or ffn',
}
