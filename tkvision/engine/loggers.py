"""Where a run's scalars go besides ``metrics.csv``: one small class per backend behind one seam, chosen by name
in the ``loggers`` key, any number at once (torchtitan's ``BaseLogger`` / ``LoggerContainer``,
https://github.com/pytorch/torchtitan/blob/main/torchtitan/components/metrics.py).

Each backend is a `Logger` subclass registered with `register_logger`; it names the files it writes into the run's
folder (``files``), so the run log (``tkvision.engine.runlog.RunLog``) knows what may exist there before the first
checkpoint. A tracker keeps the id of its run in the run log's record (``trackers.json`` beside ``last.pth``): a
resumed run (``--resume``, a torchrun restart, a SLURM requeue) continues the **same** tracker run and logs from its
checkpoint's update on; what a killed attempt had already logged past that update, each backend keeps once by its
own rule (the same values: resume is exact).

============  ==========================================  ===============================  ==================
name          what                                        in the run's folder              extra
============  ==========================================  ===============================  ==================
jsonl         a line of JSON per step, no dependency      ``scalars.jsonl``                (none)
tensorboard   TensorBoard's ``SummaryWriter``             ``tb/``                          ``tensorboard``
wandb         Weights & Biases (``wandb.init``)           ``wandb/``                       ``wandb``
mlflow        MLflow's ``MlflowClient``                   ``mlflow.db``, ``mlartifacts/``  ``mlflow``
============  ==========================================  ===============================  ==================

Settings come from each client's own environment variables, as its users know them: ``WANDB_PROJECT``,
``WANDB_ENTITY``, ``WANDB_MODE`` (``offline``: no network), ``WANDB_DIR``; ``MLFLOW_TRACKING_URI`` (unset: a SQLite
store in the run's folder) and ``MLFLOW_EXPERIMENT_NAME`` (default ``tkvision``).
"""
import json
import os
import time
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple, Type

from ..utils.errors import ConfigError
from ..utils.files import atomic_write

__all__ = ['Logger', 'LOGGERS', 'register_logger', 'logger_class', 'JsonlLogger', 'TensorBoardLogger',
           'WandbLogger', 'MlflowLogger', 'FINISHED', 'FAILED', 'PREEMPTED']

#: How a run ended, as `Logger.finish` is told.
FINISHED, FAILED, PREEMPTED = 'finished', 'failed', 'preempted'


class Logger:
    """One backend of a run's scalars (rank 0 only; the run log calls it).

    Args:
        out: the run's folder.
        config: the run's flat config (``config.yaml``'s keys), the tracker run's config.
        record: what `record` returned in an earlier attempt of this run (the tracker run to continue), or None
            for a new run.
        resumed_update: the update a resumed run continues after (its checkpoint's; 0 for a new run): logging starts
            at the next.

    Raises:
        ConfigError: the client is not installed, naming the extra that brings it (``pip install
            'tkvision[wandb]'``).
    """
    #: The name the ``loggers`` key picks it by.
    name: ClassVar[str] = ''
    #: The files and folders it writes into the run's folder.
    files: ClassVar[Tuple[str, ...]] = ()
    #: The module of its client, and the package extra that installs it.
    module: ClassVar[str] = ''
    extra: ClassVar[str] = ''

    def __init__(
            self,
            out: str,
            config: Mapping[str, Any],
            record: Optional[Mapping[str, Any]],
            resumed_update: int,
    ):
        self.out = out

    def record(self) -> Dict[str, Any]:
        """What a later attempt needs to continue this tracker run (its id), kept in ``trackers.json``."""
        return {}

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        """Record ``scalars`` (``{'train/loss': ...}``) at optimizer update ``step``."""

    def flush(self) -> None:
        """Write out what `log` holds (the run log calls it at its sync points and before every checkpoint: what a
        checkpoint covers must be in the tracker by then)."""

    def finish(self, status: str, summary: Mapping[str, str]) -> None:
        """Close the backend: ``status`` is `FINISHED`, `FAILED` or `PREEMPTED`; ``summary`` holds the run's folder
        and its best weights (paths), recorded where the tracker keeps such facts."""

    @classmethod
    def check(cls) -> None:
        """Refuse, before any work, a backend whose client is not installed.

        Raises:
            ConfigError: naming the package and the extra that installs it.
        """
        try:
            __import__(cls.module)
        except ImportError:
            raise ConfigError(f"loggers: {cls.name} needs the {cls.module} package: pip install "
                              f"'tkvision[{cls.extra}]' (or remove {cls.name} from loggers)") from None


#: Every backend by name (the ``loggers`` key's allowed values).
LOGGERS: Dict[str, Type[Logger]] = {}


def register_logger(cls: Type[Logger]) -> Type[Logger]:
    """Class decorator: make ``cls`` the backend of ``loggers: [<cls.name>]``.

    Raises:
        ValueError: no name, or a name registered already.
    """
    if not cls.name or cls.name in LOGGERS:
        raise ValueError(f'logger name {cls.name!r} is empty or registered already')
    LOGGERS[cls.name] = cls
    return cls


def logger_class(name: str) -> Type[Logger]:
    """The backend registered as ``name``.

    Raises:
        ConfigError: an unknown name, naming the ones there are.
    """
    if name not in LOGGERS:
        raise ConfigError(f"loggers: {name!r} is no logger; loggers are {', '.join(LOGGERS)}")
    return LOGGERS[name]


@register_logger
class JsonlLogger(Logger):
    """``<output>/scalars.jsonl``: one JSON object per logged step, ``{"step": u, "train/loss": ...}``, readable
    with any JSON-lines reader (``pandas.read_json(path, lines=True)``). An attempt keeps the lines of the steps
    up to the update it continues after (a resumed run's checkpoint update; none for a new run), whatever
    ``trackers.json`` says, and writes the rest again; a line cut by a kill is dropped with a note."""
    name, module, extra, files = 'jsonl', 'json', '', ('scalars.jsonl',)

    def __init__(
            self,
            out: str,
            config: Mapping[str, Any],
            record: Optional[Mapping[str, Any]],
            resumed_update: int,
    ):
        super().__init__(out, config, record, resumed_update)
        self.path = os.path.join(out, 'scalars.jsonl')
        kept: List[str] = []
        if resumed_update and os.path.isfile(self.path):
            with open(self.path) as f:
                lines = f.readlines()
            steps = [_step(line) for line in lines]
            if None in steps:
                print(f'note: {self.path}: {steps.count(None)} line(s) that are no complete JSON object (cut by a '
                      'kill) are dropped; the others are kept')
            kept = [line for line, step in zip(lines, steps) if step is not None and step <= resumed_update]
        atomic_write(self.path, lambda f: f.writelines(kept), text=True)
        # appended to for the whole run: a link planted after the write above is refused, not followed
        self.file = open(self.path, 'a', opener=lambda path, flags: os.open(path, flags | os.O_NOFOLLOW))

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.file.write(json.dumps({'step': step, **scalars}) + '\n')

    def flush(self) -> None:
        self.file.flush()

    def finish(self, status: str, summary: Mapping[str, str]) -> None:
        self.file.close()


def _step(line: str) -> Optional[int]:
    """The ``step`` of a ``scalars.jsonl`` line, or None for a line that is no complete JSON object with one."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    step = value.get('step') if isinstance(value, dict) else None
    return step if isinstance(step, int) else None


@register_logger
class TensorBoardLogger(Logger):
    """TensorBoard scalars in ``<output>/tb`` (``torch.utils.tensorboard.SummaryWriter``). An attempt hides what
    earlier attempts wrote there from the update it starts at on (``purge_step``: a new run all of it, a resumed run
    what came after its checkpoint), and writes it again."""
    name, module, extra, files = 'tensorboard', 'tensorboard', 'tensorboard', ('tb',)

    def __init__(
            self,
            out: str,
            config: Mapping[str, Any],
            record: Optional[Mapping[str, Any]],
            resumed_update: int,
    ):
        super().__init__(out, config, record, resumed_update)
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(os.path.join(out, 'tb'), purge_step=resumed_update + 1)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        self.writer.flush()

    def finish(self, status: str, summary: Mapping[str, str]) -> None:
        self.writer.close()


@register_logger
class WandbLogger(Logger):
    """A Weights & Biases run (``wandb.init(id=..., resume='allow')``, https://docs.wandb.ai/guides/runs/resuming):
    the flat config as its config, files under ``<output>/wandb`` (``WANDB_DIR`` moves them), the run's folder and
    best weights in its summary; a pre-empted attempt ends with ``mark_preempting`` and exit code 75. A run's steps
    only increase in W&B, so a step a killed attempt had already written is kept once. What W&B had not written when
    the process was killed outright (SIGKILL) is lost to it (its transaction log is flushed every
    ``WANDB__TRANSACTION_LOG_FLUSH_INTERVAL`` seconds, 15 by default); a pre-emption loses nothing."""
    name, module, extra, files = 'wandb', 'wandb', 'wandb', ('wandb',)

    def __init__(
            self,
            out: str,
            config: Mapping[str, Any],
            record: Optional[Mapping[str, Any]],
            resumed_update: int,
    ):
        super().__init__(out, config, record, resumed_update)
        import wandb
        self.run = wandb.init(id=(record or {}).get('id'), resume='allow', dir=os.environ.get('WANDB_DIR', out),
                              project=os.environ.get('WANDB_PROJECT', 'tkvision'), config=dict(config),
                              name=config.get('run_name') or os.path.basename(os.path.abspath(out)),
                              settings=wandb.Settings(console='off', silent=True))

    def record(self) -> Dict[str, Any]:
        return {'id': self.run.id}

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log(dict(scalars), step=step)

    def finish(self, status: str, summary: Mapping[str, str]) -> None:
        """Close the W&B run; an offline one (``WANDB_MODE=offline``) says how to upload it (``wandb sync``)."""
        self.run.summary.update(dict(summary))
        if status == PREEMPTED:
            self.run.mark_preempting()
        offline = getattr(self.run.settings, 'mode', '') == 'offline' or os.environ.get('WANDB_MODE') == 'offline'
        folder = os.path.dirname(self.run.dir)
        self.run.finish(exit_code={FINISHED: 0, PREEMPTED: 75}.get(status, 1))
        if offline:
            print(f'W&B ran offline: upload this run with `wandb sync {folder}` (on a machine that reaches W&B)')


@register_logger
class MlflowLogger(Logger):
    """An MLflow run through ``MlflowClient`` (https://mlflow.org/docs/latest/python_api/mlflow.client.html): the flat
    config as its parameters, the run's folder and best weights as tags; ``MLFLOW_TRACKING_URI`` (a server) or,
    unset, a SQLite store ``<output>/mlflow.db`` with artifacts in ``<output>/mlartifacts``. A resumed attempt sets
    the same run running again and skips, metric by metric, the steps the store holds already. Requests to a server
    that went away give up after a few seconds (``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` 2, ``MLFLOW_HTTP_REQUEST_TIMEOUT``
    10 s unless set)."""
    # with SQLite's companions of the store: a run killed mid-transaction leaves mlflow.db-journal beside it
    name, module, extra, files = 'mlflow', 'mlflow', 'mlflow', ('mlflow.db', 'mlflow.db-journal', 'mlflow.db-wal',
                                                                 'mlflow.db-shm', 'mlartifacts')

    def __init__(
            self,
            out: str,
            config: Mapping[str, Any],
            record: Optional[Mapping[str, Any]],
            resumed_update: int,
    ):
        super().__init__(out, config, record, resumed_update)
        os.environ.setdefault('MLFLOW_HTTP_REQUEST_MAX_RETRIES', '2')  # a dead server costs seconds, not minutes
        os.environ.setdefault('MLFLOW_HTTP_REQUEST_TIMEOUT', '10')
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient
        local = 'MLFLOW_TRACKING_URI' not in os.environ
        uri = 'sqlite:///' + os.path.abspath(os.path.join(out, 'mlflow.db')) if local else None
        self.client = MlflowClient(tracking_uri=uri)
        self.logged: Dict[str, int] = {}  # metric: the last step the store holds (a resumed run's)
        self.pending: List[Any] = []  # mlflow.entities.Metric, sent by flush
        if (record or {}).get('id'):
            self.run_id: str = str((record or {})['id'])
            self.client.update_run(self.run_id, status='RUNNING')
            for key in self.client.get_run(self.run_id).data.metrics:
                self.logged[key] = max(m.step for m in self.client.get_metric_history(self.run_id, key))
            return
        name = os.environ.get('MLFLOW_EXPERIMENT_NAME', 'tkvision')
        found = self.client.get_experiment_by_name(name)
        artifacts = 'file://' + os.path.abspath(os.path.join(out, 'mlartifacts')) if local else None
        experiment = found.experiment_id if found else self.client.create_experiment(name, artifact_location=artifacts)
        run_name = config.get('run_name') or os.path.basename(os.path.abspath(out))
        self.run_id = self.client.create_run(experiment, run_name=run_name).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in config.items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a request
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def record(self) -> Dict[str, Any]:
        return {'id': self.run_id}

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.pending += [Metric(k, float(v), now, step) for k, v in scalars.items() if step > self.logged.get(k, 0)]

    def flush(self) -> None:
        """The metrics kept since the last flush, in requests of at most 1,000 (MLflow's ``log_batch`` limit): one
        request per flush, not one per update."""
        while self.pending:
            self.client.log_batch(self.run_id, metrics=self.pending[:1000])
            for metric in self.pending[:1000]:
                self.logged[metric.key] = max(self.logged.get(metric.key, 0), metric.step)
            self.pending = self.pending[1000:]

    def finish(self, status: str, summary: Mapping[str, str]) -> None:
        self.flush()
        for k, v in summary.items():
            self.client.set_tag(self.run_id, k, v)
        ended = {FINISHED: 'FINISHED', PREEMPTED: 'KILLED'}.get(status, 'FAILED')
        self.client.set_terminated(self.run_id, status=ended)

