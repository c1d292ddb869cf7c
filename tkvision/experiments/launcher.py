"""How each point of a sweep runs: the executor and the resources of a point's job (`Launcher`), from the command
line (``tkvision-sweep --executor slurm --gpus-per-node 8 ...``) or a ``launcher:`` block of a YAML file
(`read_launcher_file`); ``tkvision.experiments.launch`` runs the points with it.
"""
import dataclasses
from typing import Any, Dict, Optional, Tuple

import yaml

from ..utils.errors import ConfigError

__all__ = ['Launcher', 'EXECUTORS', 'read_launcher_file']

EXECUTORS = ('inline', 'local', 'slurm')
#: ``#SBATCH`` options the requeue of a pre-empted or timed-out point depends on: set by the launcher itself.
_OWNED_SLURM_OPTIONS = {'requeue': 'a pre-empted or timed-out point requeues itself with it',
                        'signal': 'submitit signals a point to checkpoint before its time limit with it (set '
                                  '--signal-delay-s instead)',
                        'array': 'the sweep is one job array'}


@dataclasses.dataclass(frozen=True)
class Launcher:
    """How each point of a sweep runs.

    Args:
        executor: ``inline`` (this process), ``local`` (submitit's local executor) or ``slurm``.
        parallel: points at a time on the local executor.
        nodes: nodes per point (SLURM).
        gpus_per_node: GPUs per node of a point (0: a CPU point).
        tasks_per_node: processes per node of a point (default: one per GPU, else 1); more than one makes the
            point one distributed training job.
        cpus_per_task: CPU cores per process (SLURM; None: the cluster's default).
        timeout_min: the time limit of a job in minutes; a point that reaches it checkpoints and is requeued
            (submitit's ``max_num_timeout`` times, `max_timeouts`).
        partition: the SLURM partition (None: the cluster's default).
        array_parallelism: array tasks running at once (SLURM; None: submitit's default, 256).
        slurm_options: further ``#SBATCH`` options as ``(name, value)`` pairs (``account``, ``qos``).
        max_timeouts: time-outs after which a point is not requeued again (pre-emptions do not count).
        signal_delay_s: seconds before the time limit at which SLURM sends submitit's USR2 (submitit's
            ``slurm_signal_delay_s``; None: its 90). A point checkpoints and is requeued on it; a short limit
            (a test's) needs a short delay.
    """
    executor: str = 'inline'
    parallel: int = 1
    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: Optional[int] = None
    cpus_per_task: Optional[int] = None
    timeout_min: int = 1440
    partition: Optional[str] = None
    array_parallelism: Optional[int] = None
    slurm_options: Tuple[Tuple[str, str], ...] = ()
    max_timeouts: int = 3
    signal_delay_s: Optional[int] = None

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ConfigError(f'--executor {self.executor!r}: use one of {", ".join(EXECUTORS)}')
        for name in ('parallel', 'nodes', 'timeout_min', 'tasks_per_node', 'cpus_per_task', 'array_parallelism',
                     'signal_delay_s'):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f'launcher {name}: {value!r} is not an integer >= 1')
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0:
            raise ConfigError(f'launcher gpus_per_node: {self.gpus_per_node!r} is not an integer >= 0')
        if self.executor != 'slurm' and self.nodes > 1:
            raise ConfigError(f'launcher nodes: {self.nodes} nodes need --executor slurm (the {self.executor} '
                              'executor runs on this machine)')
        if self.executor == 'inline' and self.processes_per_node > 1:
            raise ConfigError(f'{self.processes_per_node} processes per point need --executor local or slurm (inline '
                              'runs each point in this one process)')
        for what, value in [('partition', self.partition)] + [(f'slurm option {k}', f'{k}={v}')
                                                               for k, v in self.slurm_options]:
            if value is not None and any(ord(c) < 32 or ord(c) == 127 for c in str(value)):
                raise ConfigError(f'launcher {what}: {value!r} holds a control character (a newline would write a line '
                                  'of its own into the sbatch file): remove it')
        for name, _ in self.slurm_options:
            if name.replace('_', '-').lstrip('-') in _OWNED_SLURM_OPTIONS:
                raise ConfigError(f'launcher slurm option {name}: the sweep sets it itself '
                                  f'({_OWNED_SLURM_OPTIONS[name.replace("_", "-").lstrip("-")]}); remove it')

    @property
    def processes_per_node(self) -> int:
        """``tasks_per_node``, else one per GPU, else 1."""
        return self.tasks_per_node or max(self.gpus_per_node, 1)

    def executor_parameters(self) -> Dict[str, Any]:
        """The parameters of ``submitit.AutoExecutor.update_parameters`` for this launcher."""
        params: Dict[str, Any] = dict(timeout_min=self.timeout_min, tasks_per_node=self.processes_per_node,
                                      gpus_per_node=self.gpus_per_node, name='tkvision-sweep')
        if self.executor == 'slurm':
            params.update(nodes=self.nodes, slurm_additional_parameters=dict(self.slurm_options, requeue=True))
            if self.cpus_per_task:
                params['cpus_per_task'] = self.cpus_per_task
            if self.partition:
                params['slurm_partition'] = self.partition
            if self.array_parallelism:
                params['slurm_array_parallelism'] = self.array_parallelism
            if self.signal_delay_s:
                params['slurm_signal_delay_s'] = self.signal_delay_s
        return params


def read_launcher_file(path: str) -> Dict[str, Any]:
    """The ``launcher:`` block of the YAML file ``path``: `Launcher` fields by name (``slurm_options`` a
    mapping).

    Raises:
        ConfigError: no such file, no ``launcher:`` mapping in it, or a key `Launcher` does not have (named).
    """
    try:
        with open(path, encoding='utf-8') as f:
            data = yaml.safe_load(f) or {}
        block = data.get('launcher') if isinstance(data, dict) else None
    except OSError as error:
        raise ConfigError(f'--launcher {path}: cannot read it ({error.strerror})') from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:  # a !!python tag included: nothing is constructed
        problem = getattr(error, 'problem', None) or str(error).splitlines()[0]
        raise ConfigError(f'--launcher {path} is not a YAML file this reads ({problem})') from None
    if not isinstance(block, dict):
        raise ConfigError(f'--launcher {path}: the file needs a mapping under "launcher:" (e.g. launcher: '
                          '{gpus_per_node: 8, timeout_min: 4320})')
    known = {f.name for f in dataclasses.fields(Launcher)}
    for name in block:
        if name not in known:
            raise ConfigError(f'--launcher {path}: unknown key launcher.{name}; known: {", ".join(sorted(known))}')
    if 'slurm_options' in block:
        if not isinstance(block['slurm_options'], dict):
            raise ConfigError(f'--launcher {path}: launcher.slurm_options must be a mapping (account: vision)')
        block['slurm_options'] = tuple((str(k), str(v)) for k, v in block['slurm_options'].items())
    return block
