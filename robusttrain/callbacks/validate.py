"""Moved to :mod:`robusttrain.validate` (one home for callbacks, datamodules and analysis); kept so the
callback modules being rewritten elsewhere keep importing ``.validate`` until they switch."""

from robusttrain.validate import check_choice, check_fraction, check_int, check_number

__all__ = ["check_choice", "check_fraction", "check_int", "check_number"]
