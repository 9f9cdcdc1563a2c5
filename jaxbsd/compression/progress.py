"""Progress of a compression: a line per MLP as it starts and finishes, and bars inside long steps.

:class:`~jaxbsd.compression.api.Execution`'s ``progress`` chooses the listener:

* ``True``: :class:`ProgressPrinter` prints one line on stderr when an MLP (or a group of MLPs
  solved as one program) starts and one when each finishes; inside the long steps of one MLP at a
  time, the decoupling's sweeps and the refinement's Adam steps, a tqdm bar with an ETA is drawn on
  stderr where it is a terminal (a redrawn bar would garble a log file; the lines stay);
* a callable: ``progress(event)`` with each :class:`MLPProgress` (no bars);
* ``False``: nothing.

The engine (:func:`jaxbsd.compression.engine.execute`) calls one hook with the events; the steps
that draw bars ask :func:`bars_wanted` (the decoupling, through :func:`jaxbsd.decouple`'s own
``progress=`` bar) or open a :func:`step_bar` (the refinement: its compiled loop reports through an
``io_callback`` on the channel the bar gives, and has no hook at all without one). Progress changes
no number: the loops compute the same values with or without their hook.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import sys
from typing import Callable, Iterator

from jaxbsd.solver import driver

__all__ = ["MLPProgress", "ProgressPrinter", "listener", "bars_wanted", "step_bar", "emit", "format_event"]


@dataclasses.dataclass(frozen=True)
class MLPProgress:
    """One event of a compression's progress.

    Attributes:
      kind: ``"start"`` (an MLP, or a group of MLPs solved as one program, begins), ``"done"``
        (one MLP is in place) or ``"resumed"`` (``position - 1`` MLPs were done by an earlier run).
      position: the 1-based place of the (first) MLP of the event among the run's MLPs.
      total: how many MLPs the run replaces.
      paths: the MLPs of the event (one, but for a group's ``"start"``).
      method: the method's name.
      ranks: the rank of each MLP of ``paths``.
      params_before: the parameters of the MLPs of ``paths`` before.
      params_after: ``"done"``: the replacement's parameters; else None.
      output_error: ``"done"``: the replacement's relative squared output error against the
        original MLP on the calibration tokens (``MLPReport.output_error``: up to 8192 check tokens,
        with the refinement's held-out ones when refined); else None.
      seconds: ``"done"``: the seconds of its build (and refinement); else None.
    """

    kind: str
    position: int
    total: int
    paths: tuple[str, ...]
    method: str
    ranks: tuple = ()
    params_before: int = 0
    params_after: int | None = None
    output_error: float | None = None
    seconds: float | None = None


def format_event(event: MLPProgress) -> str:
    """The line :class:`ProgressPrinter` prints for ``event``."""
    where = (f"[{event.position}/{event.total}]" if len(event.paths) == 1 else
             f"[{event.position}-{event.position + len(event.paths) - 1}/{event.total}]")
    ranks = sorted(set(map(str, event.ranks)))
    rank = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(ranks)}"
    if event.kind == "resumed":
        return f"resumed: {event.position - 1} of {event.total} MLPs were done by an earlier run"
    if event.kind == "start":
        what = event.paths[0] if len(event.paths) == 1 else f"{len(event.paths)} MLPs as one program ({event.paths[0]} …)"
        return f"{where} {what}: {event.method} at {rank} ({event.params_before:,} parameters) ..."
    return (f"{where} {event.paths[0]}: {event.method} {rank}, {event.params_before:,} -> {event.params_after:,} "
            f"parameters, output error {event.output_error:.3g} on the calibration tokens, {event.seconds:.1f} s")


class ProgressPrinter:
    """``progress=True``: each event as one line (:func:`format_event`) on ``file`` (default stderr)."""

    def __init__(self, file=None):
        self.file = file

    def __call__(self, event: MLPProgress) -> None:
        print(format_event(event), file=self.file or sys.stderr, flush=True)


_BARS: contextvars.ContextVar[bool] = contextvars.ContextVar("jaxbsd_progress_bars", default=False)


@contextlib.contextmanager
def listener(progress: bool | Callable[[MLPProgress], None]) -> Iterator[Callable[[MLPProgress], None] | None]:
    """The engine's hook for ``Execution.progress`` (None for ``False``), with the bars of the long
    steps turned on inside the block for ``True`` where stderr is a terminal."""
    if progress is False or progress is None:
        yield None
        return
    hook = ProgressPrinter() if progress is True else progress
    token = _BARS.set(progress is True and sys.stderr.isatty())
    try:
        yield hook
    finally:
        _BARS.reset(token)


def bars_wanted() -> bool:
    """Whether a step should draw its own bar (inside :func:`listener` for ``progress=True``, on a terminal)."""
    return _BARS.get()


#: What a compiled loop calls to report its steps: ``io_callback(emit, None, channel, done)`` (the
#: solver's channels, :func:`jaxbsd.solver.driver.reporting`).
emit = driver.emit


@contextlib.contextmanager
def step_bar(total: int, desc: str) -> Iterator[int | None]:
    """A tqdm bar of ``total`` steps on stderr and the channel (an int) a compiled loop reports on
    through ``io_callback(emit, None, channel, done)``; None (no bar, no hook) unless
    :func:`bars_wanted`."""
    if not bars_wanted() or total < 1:
        yield None
        return
    from tqdm import tqdm

    # mininterval=0: every report is drawn (about 50 a run), the last one included.
    bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False, mininterval=0)
    try:
        with driver.reporting(lambda done: bar.update(int(done) - bar.n)) as channel:
            yield channel
    finally:
        bar.close()
