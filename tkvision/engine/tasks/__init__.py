"""What a run trains, by name: the ``task`` key's values as `Task` subclasses, one module each (``classify``,
``mae``, ``linprobe``, ``regress``), under the base in `base` that says what a stage may ask of one. No other module
of the engine or the commands names a task: they ask the task (`task_named`) instead.

Every module of this package is imported here, so a new task is one new module with a `Task` subclass under
`register_task` (``DEVELOPERS.md``, "A task").
"""
import importlib
import pkgutil

from .base import TASKS, EvalContext, Objective, RunFiles, StepSettings, Task, register_task, task_named

__all__ = ['Task', 'Objective', 'StepSettings', 'EvalContext', 'RunFiles', 'TASKS', 'register_task', 'task_named']

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module != 'base':
        importlib.import_module(f'{__name__}.{_module}')
