"""The base of every "bad input you can fix" error: the CLI prints these as one line (exit 2).

Subclasses: :class:`robusttrain.datamodules.DataError` (files, folders, masks),
:class:`robusttrain.metamorphic.batch.HookError` (batches / model outputs the default hooks
cannot read) and :class:`robusttrain.metamorphic.outputs.NonFiniteOutputError` (NaN/inf outputs).
Imports nothing, so every layer can use it.

>>> issubclass(InputError, ValueError)
True
"""


class InputError(ValueError):
    """Bad input (data, model outputs, arguments); the message names it and what was expected."""
