"""DDP: 2 CPU processes (gloo) give exactly the same efr.csv / history.csv / mr_cases.csv as 1."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import sys
    import lightning.pytorch as L
    import torch
    from torch.utils.data import DataLoader
    from robusttrain.callbacks import MetamorphicCallback, RobustnessContext
    from robusttrain.callbacks.context import TrainProbe
    from robusttrain.metamorphic.suite import MRSuite
    from toys import COLOUR, Blobs, Tiny

    class Shifting(Tiny):
        """Weights never change (lr=0, so DDP and 1-process agree bit for bit), but the decision
        threshold moves with the epoch, so every epoch's EFR table differs."""
        def forward(self, x):
            out = super().forward(x)
            return out + torch.tensor([0.0, 2.0 - 1.5 * self.current_epoch]).view(1, 2, 1, 1)

    out, devices = sys.argv[1], int(sys.argv[2])
    ds = Blobs(n=7, slices=2)  # 4 cases, the last one with a single slice: shards split cases
    ctx = RobustnessContext(train_probe=TrainProbe(ds, size=3))  # what FailureMiningCallback requests
    cb = MetamorphicCallback(suite=MRSuite(COLOUR, (2, 4), seed=1), dirpath=out, batch_size=2, verbose=False,
                             context=ctx)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=devices, callbacks=[cb],
                        strategy="ddp" if devices > 1 else "auto", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Shifting(lr=0.0), DataLoader(ds, batch_size=2), DataLoader(ds, batch_size=2))
''')


@pytest.mark.slow
def test_two_process_ddp_equals_one_process(tmp_path):
    script = tmp_path / "ddp_fit.py"
    script.write_text(SCRIPT)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
    )
    for n in (1, 2):
        r = subprocess.run(
            [sys.executable, str(script), str(tmp_path / f"n{n}"), str(n)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert r.returncode == 0, r.stderr[-3000:]
    for f in ("efr.csv", "history.csv", "mr_cases.csv"):
        one, two = (tmp_path / "n1" / f).read_text(), (tmp_path / "n2" / f).read_text()
        assert one == two, f
    hist = (tmp_path / "n1" / "history.csv").read_text().splitlines()
    assert len(hist) == 1 + 2 * 4  # 4 cases x 2 epochs, no duplicates from the shards
    efr = (tmp_path / "n1" / "efr.csv").read_text()
    assert ",train," in efr and ",val," in efr
