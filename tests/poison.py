"""Test hooks, not code paths users reach: poison the loss of chosen micro-batches (``tkvision.engine.loss.TrainTask
.losses``) to inject a NaN or a spike, and record the samples each process trains (`log_samples`). In-process with
`install`; in a child process (torchrun) through ``TKVISION_TEST_POISON`` / ``TKVISION_TEST_SAMPLES`` and the
``sitecustomize.py`` that `sitecustomize_dir` writes (Python imports it at start)."""
import json
import os

#: ``{"epoch,batch": factor}``; a factor of NaN poisons with NaN.
ENV = 'TKVISION_TEST_POISON'


def install(poison: dict, setattr=setattr) -> None:
    """Multiply the loss of micro-batch ``batch`` of ``epoch`` (from 0) by ``poison[(epoch, batch)]`` (NaN or a
    factor: a spike with its gradients scaled too); ``setattr``: pytest's ``monkeypatch.setattr`` in a test, which
    undoes it after."""
    from tkvision.engine.loss import StepLoss, TrainTask
    real = TrainTask.losses

    def losses(self, net, model, images, labels, autocast, epoch, batch):
        factor = poison.get((epoch, batch))
        for loss in real(self, net, model, images, labels, autocast, epoch, batch):
            yield loss if factor is None else StepLoss(loss.value * factor, loss.images, loss.forwards, loss.last)
    setattr(TrainTask, 'losses', losses)


def install_from_env() -> None:
    spec = os.environ.get(ENV)
    if spec:
        install({tuple(int(v) for v in k.split(',')): float(f) for k, f in json.loads(spec).items()})


def sitecustomize_dir(folder: str) -> str:
    """A folder holding a ``sitecustomize.py`` that installs the poison of ``TKVISION_TEST_POISON``; put it first on
    the child's ``PYTHONPATH`` (with the checkout, for ``tests``)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, 'sitecustomize.py'), 'w') as f:
        f.write('from tests.poison import install_from_env, install_samples_from_env\ninstall_from_env()\n'
                'install_samples_from_env()\n')
    return folder


#: A folder where `log_samples` writes each training epoch's order, per process (``TKVISION_TEST_SAMPLES``).
SAMPLES_ENV = 'TKVISION_TEST_SAMPLES'


def log_samples(folder: str) -> None:
    """Record the indices each process's training sampler yields (``ResumableSampler.__iter__``), one JSON file per
    epoch, process and start: ``{epoch, rank, world, start, order}``."""
    from tkvision.data.loader import ResumableSampler
    real = ResumableSampler.__iter__

    def iterate(self):
        pairs = list(real(self))
        name = f'e{self.epoch}_w{self.num_replicas}_r{self.rank}_s{self.start}_{os.getpid()}.json'
        with open(os.path.join(folder, name), 'w') as f:
            json.dump(dict(epoch=self.epoch, rank=self.rank, world=self.num_replicas, start=self.start,
                           order=[i for i, _ in pairs]), f)
        return iter(pairs)
    ResumableSampler.__iter__ = iterate


def install_samples_from_env() -> None:
    if os.environ.get(SAMPLES_ENV):
        log_samples(os.environ[SAMPLES_ENV])
