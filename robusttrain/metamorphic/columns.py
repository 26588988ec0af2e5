"""The columns of ``robusttrain check``'s per-case tables, beside what fills them
(:mod:`robusttrain.metamorphic.empty_masks`); :mod:`robusttrain.rundir.check` writes and reads them.

>>> CASE_COLUMNS[:2], FOLLOWUP_COLUMNS[-1], EMPTY_COLUMNS[-2]
(['split', 'case_id'], 'predicted_px', 'specificity')
"""

# check_cases.csv: one row per (split, case), then dice_<class> / iou_<class>
CASE_COLUMNS = ["split", "case_id", "empty_mask", "lesion_px", "predicted_px", "dice", "iou"]
# check_followups.csv: one row per (split, case, perturbation, severity)
FOLLOWUP_COLUMNS = [
    "split",
    "case_id",
    "empty_mask",
    "perturbation",
    "severity",
    "seed",
    "heldout",
    "src_dice",
    "fol_dice",
    "src_iou",
    "fol_iou",
    "drop_dice",
    "drop_iou",
    "consistency",
    "predicted_px",
]
# check_empty_frames.csv: the empty-mask cases, scored apart
EMPTY_COLUMNS = [
    "split",
    "perturbation",
    "severity",
    "cases",
    "predicted_nothing",
    "specificity",
    "mean_predicted_px",
]
