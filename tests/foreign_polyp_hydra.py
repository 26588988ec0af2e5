"""The MONAI-dict ``pytorch_lightning`` project of :mod:`foreign_projects` as a Hydra app (Hydra sets
up logging: a root console handler), with the four callbacks as the README shows them. Prints one
JSON line: perturbed training images per epoch and the run directory. Run by test_foreign_projects."""

import json
from dataclasses import dataclass

import hydra
import pytorch_lightning  # noqa: F401  (imported first, as a project's module imports do)
from foreign_projects import make_polyp, n_perturbed
from hydra.core.config_store import ConfigStore

from robusttrain.callbacks import (
    BalancedCheckpoint,
    FailureMiningCallback,
    MetamorphicCallback,
    RobustnessReporter,
)
from robusttrain.metamorphic.suite import MRSuite


@dataclass
class Config:
    epochs: int = 2
    root: str = "runs/polyp"


ConfigStore.instance().store(name="config", node=Config)


@hydra.main(version_base=None, config_name="config")
def main(cfg: Config) -> None:
    mining = FailureMiningCallback(replay_ratio=0.5, train_probe_size=8)
    callbacks = [
        MetamorphicCallback(suite=MRSuite(["contrast"], severities=(5,))),
        BalancedCheckpoint(policy="last_inlier", monitor="val_loss"),
        mining,
        RobustnessReporter(),
    ]
    pl, Net, Data = make_polyp(mining)
    pl.seed_everything(0)
    trainer = pl.Trainer(
        max_epochs=cfg.epochs,
        callbacks=callbacks,
        default_root_dir=cfg.root,
        enable_progress_bar=False,
        accelerator="cpu",
        devices=1,
    )
    model = Net()
    trainer.fit(model, datamodule=Data())
    print(
        json.dumps(
            {
                "perturbed": {str(e): n_perturbed(v) for e, v in model.seen.items()},
                "run_dir": str(trainer.robusttrain_context.run_dir),
            }
        )
    )


if __name__ == "__main__":
    main()
