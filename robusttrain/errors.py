"""The base of every "bad input you can fix" error: the CLI prints these as one line (exit 2).

Subclasses: :class:`robusttrain.datamodules.DataError` (files, folders, masks),
:class:`robusttrain.metamorphic.batch.HookError` (batches / model outputs the default hooks
cannot read), :class:`robusttrain.metamorphic.outputs.NonFiniteOutputError` (NaN/inf outputs) and
:class:`robusttrain.callbacks.context.RobustnessConfigError` (robustness callbacks that do not fit
together; also a resume with a changed MR suite raises an InputError).
Imports nothing, so every layer can use it.

>>> issubclass(InputError, ValueError)
True
"""


class InputError(ValueError):
    """Bad input (data, model outputs, arguments); the message names it and what was expected."""
