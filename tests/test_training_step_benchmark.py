"""benchmarks/perf/training_step.py measures what it says: the step time includes MetamorphicTraining's
draws, scoring and perturbing (its timer once started after them, and the published ratios left the
follow-ups' cost out; found on the H200 on 2026-11-26)."""

import statistics
import time

import pytest
from torch.utils.data import DataLoader

from benchmarks.perf import training_step
from robusttrain.callbacks import MetamorphicTraining
from robusttrain.datamodules import PolypDataModule


@pytest.mark.slow
def test_the_step_time_includes_the_callbacks_batch_start(monkeypatch, tmp_path):
    dm = PolypDataModule(image_size=32, batch_size=2, n_train=2 * 6, n_val=2, seed=0)
    dm.setup("fit")
    loader = DataLoader(dm.train_dataset, batch_size=2, shuffle=False)
    original = MetamorphicTraining.on_train_batch_start

    def slow(self, *args, **kwargs):  # a known cost inside the hook the benchmark must count
        time.sleep(0.3)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MetamorphicTraining, "on_train_batch_start", slow)
    monkeypatch.setattr(training_step.tempfile, "tempdir", str(tmp_path))
    plain = statistics.median(training_step.time_setting(None, loader, 3, "cpu"))
    k1 = statistics.median(
        training_step.time_setting(
            training_step.SETTINGS["DEFAULT random aug (replace, k=1, q=.5)"], loader, 3, "cpu"
        )
    )
    assert k1 >= 0.3 and k1 > plain + 0.15, (plain, k1)
