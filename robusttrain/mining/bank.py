"""FailureBank: the de-duplicated, bounded store of metamorphic failures, shared through files.

The bank is a sink for the MetamorphicCallback (``bank(record, images)``). Records are kept in
memory and persisted by :meth:`FailureBank.flush` (once per epoch) to ``<run_dir>/failures/``:

* ``failures.jsonl`` — append-only log. Each flush appends one *batch*: one line per record whose
  key is new to the bank (``{"kind": "failure", "id": ..., **FailureRecord.to_dict()}``), then one
  marker line ``{"kind": "batch", "epoch": e, "seen": [ids seen again], "n": new}``. The batch is
  written with one ``write`` and ``fsync``ed. A reader only trusts a batch that ends with its marker,
  so a run killed mid-write (torn last line, or a batch without marker) is read as if that flush
  never happened; the writer truncates such a tail before appending again.
* ``thumbs/<id>.png`` — for the ``n_thumbs`` worst failures (largest Dice drop): one strip
  source | follow-up | GT | prediction on source | prediction on follow-up. Thumbs of failures that
  leave the worst-N set are deleted.

Eviction (applied after every flush, and identically by the reader): at most ``max_size``
records; half of the slots go to the most severe (largest drop), the rest to the most recent
(largest ``last_epoch`` = last epoch the failure was seen, then larger drop); ties by id.
A failure that is seen again refreshes its ``last_epoch`` and keeps its largest drop.

Split rule: every record is stored (validation failures are reported), but :meth:`trainable`
returns only ``split == "train"`` records unless ``allow_val_mining=True`` — then a leakage
warning is logged once.

>>> import tempfile
>>> from robusttrain.metamorphic.records import FailureRecord
>>> run = tempfile.mkdtemp()
>>> bank = FailureBank(run)
>>> r = FailureRecord(case_id="c1", split="train", perturbation="blur", severity=4,
...                   params={"sigma": [3.0]}, seed=7, epoch=2, src_dice=0.9, fol_dice=0.3,
...                   src_iou=0.8, fol_iou=0.2, index=0)
>>> bank(r); bank(r)  # the repeat is de-duplicated
>>> bank.flush(epoch=2)
1
>>> len(FailureBank.load(run)), len(FailureBank.load(run).trainable())
(1, 1)
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from robusttrain.io import atomic_write_bytes, atomic_write_text, json_default
from robusttrain.metamorphic.records import FailureRecord, failure_id
from robusttrain.rundir import failures as failures_file

log = logging.getLogger(__name__)

_STRIP_KEYS = ("source", "followup", "gt", "pred_source", "pred_followup")


class FailureBank:
    """De-duplicating, bounded, file-backed store of :class:`FailureRecord` (see module doc)."""

    def __init__(
        self,
        run_dir: str | os.PathLike | None = None,
        max_size: int = 2000,
        n_thumbs: int = 32,
        allow_val_mining: bool = False,
        thumb_height: int = 96,
    ):
        if max_size < 2:
            raise ValueError("max_size must be >= 2")
        self.dir = Path(run_dir) / failures_file.DIR if run_dir is not None else None
        self.max_size, self.n_thumbs, self.thumb_height = max_size, n_thumbs, thumb_height
        self.allow_val_mining = allow_val_mining
        self.entries: dict[str, dict[str, Any]] = {}  # id -> {"record", "last_epoch", "count"}
        self.n_batches = 0
        self._new: list[str] = []  # ids added since the last flush
        self._seen: set[str] = set()  # existing ids seen again since the last flush
        self._n_new = 0  # genuinely new keys since the last flush
        self._images: dict[str, dict[str, np.ndarray]] = {}  # pending thumbnails
        self._warned = False

    # ---- sink -------------------------------------------------------------------------------
    def __call__(self, record: FailureRecord, images: dict[str, np.ndarray] | None = None) -> None:
        self.add(record, images)

    def add(self, record: FailureRecord, images: dict[str, np.ndarray] | None = None) -> bool:
        """Add one record; returns True when its key is new to the bank."""
        rid = failure_id(record)
        if record.split != "train" and self.allow_val_mining and not self._warned:
            log.warning(
                "allow_val_mining=True: failures on split %r will be trained on — the "
                "validation scores of this run are no longer an unbiased estimate "
                "(data leakage).",
                record.split,
            )
            self._warned = True
        entry = self.entries.get(rid)
        if entry is None:
            self.entries[rid] = {"record": record, "last_epoch": record.epoch, "count": 1}
            self._new.append(rid)
            self._n_new += 1
            new = True
        else:
            # same case/perturbation/params seen again: refresh recency, keep the worst drop
            entry["last_epoch"] = max(entry["last_epoch"], record.epoch)
            entry["count"] += 1
            if record.drop > entry["record"].drop:
                entry["record"] = record
                if rid not in self._new:  # rewrite its line so readers see the worse drop
                    self._new.append(rid)
            if rid not in self._new:
                self._seen.add(rid)
            new = False
        if images is not None and self.n_thumbs > 0:
            self._images[rid] = images
        return new

    # ---- queries ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.entries)

    def records(self) -> list[FailureRecord]:
        return [e["record"] for e in self.entries.values()]

    def is_trainable(self, record: FailureRecord) -> bool:
        return record.split == "train" or self.allow_val_mining

    def trainable(self) -> list[FailureRecord]:
        """Records replay may train on (train split; others only with ``allow_val_mining``)."""
        return [r for r in self.records() if self.is_trainable(r)]

    def worst(self, n: int) -> list[str]:
        """Ids of the ``n`` largest drops (ties: most recent, then id)."""
        return sorted(
            self.entries, key=lambda i: (-self.entries[i]["record"].drop, -self.entries[i]["last_epoch"], i)
        )[:n]

    # ---- eviction ---------------------------------------------------------------------------
    def _evict(self) -> None:
        if len(self.entries) <= self.max_size:
            return
        n_severe = self.max_size // 2
        keep = set(self.worst(n_severe))
        rest = sorted(
            (i for i in self.entries if i not in keep),
            key=lambda i: (-self.entries[i]["last_epoch"], -self.entries[i]["record"].drop, i),
        )
        keep.update(rest[: self.max_size - len(keep)])
        self.entries = {i: e for i, e in self.entries.items() if i in keep}

    # ---- persistence ------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """Whether anything was added or seen again since the last :meth:`flush` (a flush would write)."""
        return bool(self._new or self._seen)

    @property
    def log_path(self) -> Path | None:
        return self.dir / failures_file.LOG_NAME if self.dir is not None else None

    def flush(self, epoch: int) -> int:
        """Append this epoch's batch (new records + marker), evict, refresh thumbs.

        Returns the number of new records. Call on one process only (rank 0) under DDP.
        """
        lines = [_line(i, self.entries[i]) for i in self._new if i in self.entries]
        lines.append(
            json.dumps({"kind": "batch", "epoch": int(epoch), "seen": sorted(self._seen), "n": len(lines)})
        )
        self._apply_seen(self._seen, epoch)
        n_new = self._n_new
        self._new, self._seen, self._n_new = [], set(), 0
        self._evict()
        self.n_batches += 1
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            path = self.dir / failures_file.LOG_NAME
            failures_file.truncate_torn_tail(path)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")  # one write per batch
                fh.flush()
                os.fsync(fh.fileno())
            self._write_thumbs()
        self._images = {i: im for i, im in self._images.items() if i in self.entries}
        return n_new

    def _apply_seen(self, ids: Iterable[str], epoch: int) -> None:
        for i in ids:
            if i in self.entries:
                self.entries[i]["last_epoch"] = max(self.entries[i]["last_epoch"], int(epoch))

    def compact(self) -> None:
        """Rewrite the log atomically as one batch holding exactly the current bank."""
        if self.dir is None:
            return
        lines = [_line(i, e) for i, e in self.entries.items()]
        lines.append(json.dumps({"kind": "batch", "epoch": -1, "seen": [], "n": len(lines)}))
        atomic_write_text(self.dir / failures_file.LOG_NAME, "\n".join(lines) + "\n")

    def _write_thumbs(self) -> None:
        if self.dir is None:
            return
        tdir = self.dir / failures_file.THUMB_DIR
        worst = set(self.worst(self.n_thumbs))
        for i in worst & set(self._images):
            strip = thumbnail_strip(self._images[i], self.thumb_height)
            if strip is not None:
                atomic_write_bytes(tdir / f"{i}.png", _png(strip))
        if tdir.is_dir():
            for p in tdir.glob("*.png"):
                if p.stem not in worst:
                    p.unlink(missing_ok=True)

    def state_dict(self) -> dict[str, Any]:
        return {
            "entries": [
                {"id": i, "last_epoch": e["last_epoch"], "count": e["count"], "record": e["record"].to_dict()}
                for i, e in self.entries.items()
            ],
            "pending_new": list(self._new),
            "pending_seen": sorted(self._seen),
            "n_batches": self.n_batches,
            "max_size": self.max_size,
        }

    def load_state_dict(self, state: dict[str, Any], rewrite_files: bool = True) -> None:
        """Restore from a checkpoint; the file log is rewritten to match (files may be ahead
        of the checkpoint when a run was killed after it). Pass ``rewrite_files=False`` on
        non-zero DDP ranks."""
        self.entries = {
            d["id"]: {
                "record": FailureRecord.from_dict(d["record"]),
                "last_epoch": d["last_epoch"],
                "count": d["count"],
            }
            for d in state["entries"]
        }
        self._new = list(state.get("pending_new", []))
        self._seen = set(state.get("pending_seen", []))
        self.n_batches = state.get("n_batches", 0)
        self._n_new = len(self._new)
        if rewrite_files:
            self.restore_files()

    def restore_files(self) -> None:
        """After :meth:`load_state_dict`: make the log match the restored bank (the files of a killed
        run may be ahead of its checkpoint). Cut back to the checkpoint's batches when that is exact
        (the log then reads as if the run had never stopped), else rewrite it (:meth:`compact`)."""
        if not self._truncate_to_checkpoint():
            self.compact()

    def _truncate_to_checkpoint(self) -> bool:
        """Cut the log back to the batches the checkpoint had seen (a killed run may have appended
        more), when replaying them gives exactly the restored bank; the file then reads as if the
        run had never stopped. False when that is not the case (the caller compacts instead)."""
        if self.dir is None:
            return False
        path = self.dir / failures_file.LOG_NAME
        if not path.is_file():  # nothing flushed yet, then or now
            return self.n_batches == 0 and not self.entries
        data = path.read_bytes()
        ends = failures_file.batch_ends(data)
        if len(ends) < self.n_batches:
            return False
        end = ends[self.n_batches - 1] if self.n_batches else 0
        kept = failures_file.parse_batches(data[:end])
        replay = FailureBank(None, max_size=self.max_size)
        for batch in kept:
            replay._apply_batch(batch)
        if _snapshot(replay.entries) != _snapshot(self.entries):
            return False
        if end != len(data):
            atomic_write_bytes(path, data[:end])
        return True

    @classmethod
    def load(cls, run_dir: str | os.PathLike, **kw: Any) -> FailureBank:
        """Read ``<run_dir>/failures/failures.jsonl`` back (complete batches only)."""
        bank = cls(run_dir, **kw)
        for batch in failures_file.read_batches(bank.log_path):
            bank._apply_batch(batch)
        return bank

    def _apply_batch(self, batch: list[dict[str, Any]]) -> None:
        marker = batch[-1]
        for d in batch[:-1]:
            rec = _record_from_line(d)
            self.entries[d["id"]] = {
                "record": rec,
                "last_epoch": d.get("last_epoch", rec.epoch),
                "count": d.get("count", 1),
            }
        self._apply_seen(marker.get("seen", []), marker["epoch"])
        self._evict()
        self.n_batches += 1


def _snapshot(entries: dict[str, dict[str, Any]]) -> dict[str, tuple]:
    return {
        i: (
            e["last_epoch"],
            e["count"],
            json.dumps(e["record"].to_dict(), sort_keys=True, default=json_default),
        )
        for i, e in entries.items()
    }


def _line(rid: str, entry: dict[str, Any]) -> str:
    return json.dumps(
        {
            "kind": "failure",
            "id": rid,
            "last_epoch": entry["last_epoch"],
            "count": entry["count"],
            **entry["record"].to_dict(),
        },
        default=json_default,
    )


def _record_from_line(d: dict[str, Any]) -> FailureRecord:
    d = {k: v for k, v in d.items() if k not in ("kind", "id", "last_epoch", "count")}
    return FailureRecord.from_dict(d)


def thumbnail_strip(images: dict[str, np.ndarray], height: int = 96) -> np.ndarray | None:
    """Source | follow-up | GT | pred(source) | pred(follow-up) as one HWC uint8 RGB strip."""
    import cv2

    tiles = []
    for k in _STRIP_KEYS:
        im = images.get(k)
        if im is None:
            continue
        im = np.asarray(im)
        if im.ndim == 2:  # label maps: spread classes over the grey range so they are visible
            scale = 255 // max(int(im.max()), 1)
            im = np.repeat((im.astype(np.int64) * scale).clip(0, 255).astype(np.uint8)[..., None], 3, -1)
        elif im.shape[-1] == 1:
            im = np.repeat(im, 3, -1)
        if im.dtype != np.uint8:
            im = (np.clip(im, 0, 1) * 255).round().astype(np.uint8)
        w = max(1, round(im.shape[1] * height / im.shape[0]))
        tiles.append(
            cv2.resize(np.ascontiguousarray(im[..., :3]), (w, height), interpolation=cv2.INTER_NEAREST)
        )
    return np.concatenate(tiles, axis=1) if tiles else None


def _png(rgb: np.ndarray) -> bytes:
    import cv2

    ok, buf = cv2.imencode(".png", rgb[..., ::-1])  # cv2 wants BGR
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return buf.tobytes()
