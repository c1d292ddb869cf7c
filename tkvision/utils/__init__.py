"""What every part of tkvision shares and that depends on nothing else in it: the exceptions a user
sees as one-line errors (`errors`), the one seed-derivation helper (`seeding`), the `amp` dtypes (`precision`)
and the one atomic file write (`files`)."""
from .errors import USER_ERRORS, ConfigError, RunError, UsageError, WeightsMismatchError
from .files import atomic_folder, atomic_write
from .seeding import derive_seed

__all__ = ['ConfigError', 'RunError', 'UsageError', 'WeightsMismatchError', 'USER_ERRORS', 'atomic_write',
           'atomic_folder', 'derive_seed']
