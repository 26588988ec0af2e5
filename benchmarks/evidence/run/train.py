"""Step 1 of a run: fit (fresh or resumed) with the condition's callbacks and the recorder."""

from __future__ import annotations

import time

import torch

from benchmarks.evidence.run.data import build_data
from benchmarks.evidence.run.protocol import run_model, v4_condition_kwargs, v4_family_sets
from benchmarks.evidence.run.recorder import make_recorder
from benchmarks.evidence.run.state import RunState


def train_run(run: RunState, profile: int = 0) -> dict | None:
    """Step 1, train: a fresh (or resumed) run folder, the seeded data and split, the condition's
    callbacks, the validation recorder (and, v3/v4, the EMA beside it, the resumable ``fit/`` checkpoint
    and ``config.yaml``), the model, then ``trainer.fit``.

    Returns the timing record of a ``--profile-steps`` run (nothing else happens to it), else None.
    Refuses (``SystemExit``) a BatchNorm model under v3/v4 and a run that stopped before its last epoch."""
    import lightning.pytorch as L

    from benchmarks.evidence.conditions import MT_CONDITIONS, MT_DEFAULTS, training_callbacks, usable_families
    from robusttrain.models.segmentation import SegmentationModule

    args, cond, seed, run_dir, v3, v4 = run.args, run.cond, run.seed, run.run_dir, run.v3, run.v4
    torch.set_num_threads(args.threads)
    last_ckpt = run_dir / "fit" / "last.ckpt"
    resume_from = str(last_ckpt) if (v3 and args.resume and last_ckpt.is_file()) else None
    if run_dir.exists() and resume_from is None:  # a fresh failure bank per run
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(seed, workers=True)
    dm, held, _ = build_data(args)
    names = dm.class_names
    n_train_cases, n_val_cases = len(dm.train_dataset.case_ids()), len(dm.val_dataset.case_ids())
    perts = usable_families(args.perturbations.split(","), dm.in_channels)
    sevs = tuple(int(s) for s in args.severities.split(","))
    mining = {
        k: getattr(args, k)
        for k in ("jitter", "fresh_image", "clean_mix")
        if getattr(args, k, None) is not None
    }
    mt = {"q": args.q} if getattr(args, "q", None) is not None else None
    common = dict(
        seed=args.data_seed,
        ratio=args.ratio,
        probe=args.probe,
        mine_every=args.mine_every,
        run_dir=str(run_dir),
        val_every=getattr(args, "mr_every", 0),
        val_cases=getattr(args, "mr_val_cases", None),
        train_seed=seed,
    )
    if v4:  # the pre-registered conditions (conditions.V4_* / V5_*): no per-invocation overrides
        from benchmarks.evidence.conditions import condition_callbacks

        cbs, _ = condition_callbacks("v5" if run.v5 else "v4", cond, dm, perts, sevs, **common)
        test_fams = usable_families(args.test_perturbations.split(","), dm.in_channels)
        v4_sets = v4_family_sets(args, cond, perts, test_fams)
    else:
        cbs, _ = training_callbacks(cond, dm, perts, sevs, mining=mining, mt=mt, **common)
        test_fams, v4_sets = perts, {}
    feats = tuple(int(f) for f in args.features.split(","))
    rec = make_recorder(names, run_dir / "epochs" if v3 else None)
    extra: list[L.Callback] = []
    ema = None
    if v3:
        from lightning.pytorch.callbacks import ModelCheckpoint

        from benchmarks.evidence.artifacts import write_config

        # top_k=1 (the latest epoch): Lightning writes last.ckpt only in a step that saved a checkpoint
        extra = [ModelCheckpoint(dirpath=run_dir / "fit", save_last=True, save_top_k=1, every_n_epochs=1)]
        from benchmarks.evidence.averages import EMATracker

        decay = args.ema_decay
        if v4:  # sized to the run: a half-life of --ema-half-life of the run's optimiser steps
            from benchmarks.evidence.averages import ema_decay_for

            steps = args.epochs * len(dm.train_dataloader())
            decay = ema_decay_for(steps, args.ema_half_life)
        ema = EMATracker(decay=decay)  # watches the run, never swaps into it (averages.py)
        extra.append(ema)
        kw = {**MT_DEFAULTS, **(mt or {}), **MT_CONDITIONS[cond]} if cond in MT_CONDITIONS else None
        if v4:
            kw = {"condition": v4_condition_kwargs(cond, run.v5), **v4_sets}
        write_config(run_dir, args, cond, seed, feats, test_fams, sevs, kw, model=run_model(run, feats))
    if run.v5:  # paired seeds: one model's init (decoder, or all of it) is the same in every condition
        torch.manual_seed(seed)
    model = SegmentationModule(
        in_channels=dm.in_channels, num_classes=dm.num_classes, class_names=names, **run_model(run, feats)
    )
    if run.v5:  # ... and every condition, either model, sees the same data order
        L.seed_everything(seed, workers=True)
    if v3 and not run.v5:  # v5's EMA and averages carry the BatchNorm buffers (PROTOCOL.md)
        from benchmarks.evidence.averages import has_batchnorm

        # refused before training: its averages' BatchNorm statistics would need re-estimating
        if has_batchnorm(model):
            raise SystemExit(
                "evidence: the balanced average / EMA of a BatchNorm model is not supported here"
            )
    trainer = L.Trainer(
        max_epochs=args.epochs,
        callbacks=[*cbs, rec, *extra],
        logger=False,
        default_root_dir=run_dir,
        enable_checkpointing=bool(extra),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator=getattr(args, "accelerator", "cpu"),
        devices=1,
        deterministic=False,
        precision=getattr(args, "precision", "32-true"),
        max_steps=profile or -1,
        profiler="simple" if profile else None,
    )
    t0 = time.time()
    trainer.fit(model, datamodule=dm, ckpt_path=resume_from)
    if profile:  # timing only (--profile-steps): nothing is scored or tabled
        seconds = time.time() - t0
        summary = trainer.profiler.summary()  # type: ignore[attr-defined]  # set by Trainer.__init__
        print(f"[evidence] profile {cond}_s{seed}, {profile} steps, {seconds:.1f} s\n{summary}", flush=True)
        return {"condition": cond, "seed": seed, "profiled_steps": profile, "seconds": seconds}
    if trainer.interrupted or int(trainer.current_epoch) < args.epochs:  # never score a half-trained run
        raise SystemExit(
            f"evidence: {cond}_s{seed} stopped at epoch {trainer.current_epoch} of {args.epochs} "
            "(interrupted); run again with --resume to continue it"
        )
    run.train_s = rec.train_seconds if v3 else time.time() - t0
    run.resume_from, run.dm, run.held, run.names = resume_from, dm, held, names
    run.n_train_cases, run.n_val_cases, run.sevs, run.mt, run.cbs = n_train_cases, n_val_cases, sevs, mt, cbs
    run.test_fams, run.v4_sets, run.feats, run.rec, run.ema = test_fams, v4_sets, feats, rec, ema
    run.model, run.trainer = model, trainer
    return None
