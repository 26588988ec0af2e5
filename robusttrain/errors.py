"""The base of every "bad input you can fix" error: the CLI prints these as one line (exit 2).

Subclasses: :class:`robusttrain.datamodules.DataError` (files, folders, masks),
:class:`robusttrain.metamorphic.batch.HookError` (batches / model outputs the default hooks
cannot read), :class:`robusttrain.metamorphic.outputs.NonFiniteOutputError` (NaN/inf outputs) and
:class:`RobustnessConfigError` (robustness callbacks that do not fit together, here so that the
callbacks' pure parts in ``robusttrain.training`` raise it too; also a resume with a changed MR suite
raises an InputError).
Imports nothing, so every layer can use it.

>>> issubclass(InputError, ValueError)
True
"""


class InputError(ValueError):
    """Bad input (data, model outputs, arguments); the message names it and what was expected."""


class RobustnessConfigError(InputError):
    """The robustness callbacks are configured inconsistently; the message says what to change
    (re-exported by :mod:`robusttrain.callbacks`)."""
