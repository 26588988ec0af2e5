"""One lifecycle (issue 47 item 3): the robustness callbacks join / finalize / release the shared
RobustnessContext through one base, ContextMember; the model reads each training step's follow-ups from
the context instead of looking for MetamorphicTraining in ``trainer.callbacks``."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import robusttrain
from robusttrain import callbacks as cbs
from robusttrain.callbacks.context import RobustnessContext
from robusttrain.callbacks.lifecycle import ContextMember
from robusttrain.training import WorstOfK, metamorphic_forward, metamorphic_loss
from robusttrain.training.objective import MissingCallbackError, StepFollowups

PACKAGE = Path(robusttrain.__file__).parent
MEMBERS = [
    cbs.MetamorphicCallback,
    cbs.MetamorphicTraining,
    cbs.BalancedCheckpoint,
    cbs.BalancedAverage,
    cbs.EMACheckpoint,
    cbs.FailureMiningCallback,
    cbs.RobustnessReporter,
]


@pytest.mark.parametrize("cls", MEMBERS, ids=lambda c: c.__name__)
def test_each_robustness_callback_takes_the_lifecycle_from_the_one_base(cls):
    assert issubclass(cls, ContextMember)
    for hook in ("join_context", "on_exception", "context", "fit_dir"):
        assert hook not in vars(cls), f"{cls.__name__} defines {hook} again"


def test_no_callback_joins_finalizes_or_releases_by_itself():
    # the three steps are written in lifecycle.py (and the context's own methods in context.py)
    pattern = re.compile(r"release_lock\(|lock import release|\.finalize\(trainer\)|\.join\(type\(self\)")
    found = [
        f"{p.name}: {m.group(0)}"
        for p in sorted((PACKAGE / "callbacks").glob("*.py"))
        if p.name not in ("lifecycle.py", "context.py")
        for m in pattern.finditer(p.read_text())
    ]
    assert not found, found


def test_models_and_objectives_never_look_through_the_trainers_callbacks():
    pattern = re.compile(r"trainer\.callbacks|[\"']callbacks[\"']\)")
    found = [
        str(p.relative_to(PACKAGE))
        for folder in ("models", "training")
        for p in sorted((PACKAGE / folder).glob("*.py"))
        if pattern.search(p.read_text())
    ]
    assert not found, found


class _Net(torch.nn.Module):
    """A module as a training_step sees it: a trainer, and log()."""

    def __init__(self, trainer):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 1)
        self.trainer = trainer
        self.logged = {}

    def forward(self, x):
        return self.conv(x)

    def log(self, name, value, **_):
        self.logged[name] = float(value)


def _followups(objective):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 3, 16, 16, generator=g)
    masks = torch.zeros(4, 16, 16, dtype=torch.long)
    masks[:, 4:10, 4:10] = 1
    fol = WorstOfK(["blur", "contrast"], k=1, q=0.5, seed=0)(x, masks, None, step=0)
    step = StepFollowups(objective, weight=2.0)
    step.start(None)
    step.followups, step.target = fol, masks
    return x, fol, step


def test_the_models_terms_come_from_the_step_the_context_carries():
    x, fol, step = _followups("consistency")
    assert len(fol) == 2
    net = _Net(SimpleNamespace(robusttrain_context=RobustnessContext(followups=step)))
    out, term = metamorphic_forward(net, x)
    assert tuple(out.shape) == (4, 2, 16, 16) and step.used
    assert float(term.detach()) > 0 and net.logged["mt/lambda"] == 2.0
    assert float(term.detach()) == pytest.approx(2.0 * net.logged["mt/consistency"])
    # the paired term reads the same step
    x, fol, paired = _followups("paired")
    net = _Net(SimpleNamespace(robusttrain_context=RobustnessContext(followups=paired)))
    logits = net(x)
    assert float(metamorphic_loss(net, None, logits).detach()) > 0 and "mt/followup_loss" in net.logged


def test_a_callback_in_the_list_without_the_context_adds_nothing():
    # what the old lookup found (an object with the two methods in trainer.callbacks) is not read now
    x, _, step = _followups("consistency")
    finder = SimpleNamespace(consistency_forward=None, paired_loss=None)
    net = _Net(SimpleNamespace(callbacks=[finder], robusttrain_context=RobustnessContext()))
    out, term = metamorphic_forward(net, x)
    assert float(term.detach()) == 0.0 and tuple(out.shape) == (4, 2, 16, 16)
    with pytest.raises(MissingCallbackError, match="needs a MetamorphicTraining"):
        metamorphic_loss(net, None, out)
    assert not step.used
