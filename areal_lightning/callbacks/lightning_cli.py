"""`LightningCLI`: Lightning's own, with a refused callback argument reported in one line.

When one of our constructors refuses an ``init_args`` value (a wrong dotted path for
``evaluate_fn``), jsonargparse tries every other type of ``trainer.callbacks`` and reports all of
them with two tracebacks, our sentence somewhere inside. This subclass reports that sentence as a
command-line error: ``usage`` and one ``error:`` line, exit status 2, before training starts.
Needs ``jsonargparse[signatures]``.

Example:
    ``python train.py fit -c config.yaml`` with ``train.py``::

        from areal_lightning.callbacks.lightning_cli import LightningCLI
        from my_project import MyModule

        if __name__ == "__main__":
            LightningCLI(MyModule)
"""

from __future__ import annotations

from lightning.pytorch import cli
from typing_extensions import override

from areal_lightning.errors import ArgumentError


def refused_argument(err: BaseException) -> ArgumentError | None:
    """The `ArgumentError` among `err` and the exceptions it was raised from (or during), if any.

    Example:
        >>> try:
        ...     try:
        ...         raise ArgumentError("EvaluationCallback", "evaluate_fn", "x.y", "a dotted path")
        ...     except ArgumentError as inner:
        ...         raise ValueError("Does not validate against any of the Union subtypes") from inner
        ... except ValueError as outer:
        ...     print(refused_argument(outer))
        `EvaluationCallback(evaluate_fn=...)` must be a dotted path, got 'x.y'
    """
    seen: set[int] = set()
    todo: list[BaseException] = [err]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ArgumentError):
            return current
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
    return None


class LightningCLI(cli.LightningCLI):
    """`lightning.pytorch.cli.LightningCLI`, reporting a refused argument of one of our callbacks
    (an `ArgumentError`) as one parser error instead of jsonargparse's report of every type it tried."""

    @override
    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as err:
            refused = refused_argument(err)
            if refused is None:
                raise
            self.parser.error(str(refused))  # exits 2 with usage and the one line (raises if exit_on_error=False)
