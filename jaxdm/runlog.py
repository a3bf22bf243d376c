"""Run logging for long jobs: JSONL metrics, a progress display and PNG learning curves.

Generic (used by RL training, screening and benchmarks alike):
- ``MetricsWriter``: one JSON object per line, ``{"step": k, "time": ..., <metrics>}``; jax
  and numpy scalars become floats, non-finite numbers become ``null`` (strict JSON), and on
  resume ``truncate_after`` drops lines past the restored step so curves have no duplicates.
- ``Progress``: a tqdm bar with a compact metrics postfix (silent when ``enabled=False``).
- ``plot_curves``: one PNG with one panel per metric and one line per run; ``pyplot``:
  matplotlib's pyplot on the Agg backend, imported on first use, for every figure.
- ``metric_series``: columns of a run's records (e.g. the evaluation rows) for curves.
- ``MAX_FAILED_SHARE`` / ``check_failed_share``: the one default and check of the
  ``max_failed_share`` bound every job that calls a model or an agent applies (screen, bench,
  the harness, the trainer's teacher): a pass or unit in which a larger share of calls failed
  stops its job by name.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from jaxdm.jsonl import append_records, read_records, write_atomic, write_records

__all__ = ["MetricsWriter", "read_metrics", "truncate_after", "Progress", "plot_curves",
           "jsonable", "format_table", "metric_series",
           "MAX_FAILED_SHARE", "check_failed_share", "pyplot"]

# A dead or flaky server is a failure, not a result: 5 % of calls failing stops a job.
MAX_FAILED_SHARE = 0.05


def check_failed_share(value: Any, key: str = "max_failed_share",
                       error: type[ValueError] = ValueError) -> float:
    """``value`` as a ``max_failed_share`` bound: a real number in [0, 1] (not a bool, not NaN),
    else ``error`` naming ``key`` and the value."""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and 0.0 <= value <= 1.0)
    if not ok:
        raise error(f"{key} must be in [0, 1], got {value!r}")
    return float(value)


def jsonable(value: Any) -> Any:
    """A JSON-safe copy: arrays of size 1 and numpy/jax scalars → float/int, NaN/inf → None."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (str, type(None))):
        return value
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # numpy / jax arrays and scalars
        arr = np.asarray(value)
        if arr.size == 1:
            value = arr.reshape(()).item()
        else:
            return [jsonable(v) for v in arr.tolist()]
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    raise TypeError(f"cannot log value of type {type(value).__name__}: {value!r}")


class MetricsWriter:
    """Append-only JSONL metrics file; each ``write`` is one fsync'd append
    (``jaxdm.jsonl.append_records``: a crash loses nothing written)."""

    def __init__(self, path: str | Path, *, resume_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            write_atomic(self.path, "")  # a fresh run starts a fresh file
        else:
            truncate_after(self.path, resume_step)

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Append one JSON line {step, time, metrics} (arrays made plain values, non-finite
        numbers null) with an fsync; returns the record."""
        record = {"step": int(step), "time": time.time()}
        record.update(jsonable(dict(metrics)))
        append_records(self.path, [record])
        return record

    def close(self) -> None:
        """Nothing to close: each write opens, appends and closes the file."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def metric_series(records: Sequence[Mapping[str, Any]], series: Mapping[str, str], *,
                  present: str, defaults: Mapping[str, float] | None = None
                  ) -> dict[str, list]:
    """Columns of the records that hold the key ``present``: ``iteration`` (the records'
    ``iteration``) and, per ``name: key`` of ``series``, the values of ``key``. A row missing a
    key raises KeyError naming it and the iteration, unless ``defaults`` gives the key a value
    (metrics only some runs log)."""
    defaults = defaults or {}
    out: dict[str, list] = {"iteration": [], **{name: [] for name in series}}
    for r in records:
        if present not in r:
            continue
        out["iteration"].append(r["iteration"])
        for name, key in series.items():
            if key in r:
                out[name].append(r[key])
            elif key in defaults:
                out[name].append(defaults[key])
            else:
                raise KeyError(f"metric {key!r} missing at iteration {r.get('iteration')}")
    return out


def read_metrics(path: str | Path, *, drop_torn_tail: bool = False) -> list[dict[str, Any]]:
    """All records of a metrics file; a malformed line raises ValueError with its number.

    ``drop_torn_tail``: a torn last line (no newline: a crash while writing it; records are
    written whole, so it can never be a finished record) is dropped with a message on stderr
    instead (``jaxdm.jsonl.read_records``). A malformed line before it is still an error.
    """
    return [record for _, record in read_records(path, drop_torn_tail=drop_torn_tail)]


def truncate_after(path: str | Path, step: int) -> int:
    """Keep only records with ``step <= step`` (atomic rewrite); returns how many were kept.
    A torn last line (a crash mid-write) is dropped with a message."""
    p = Path(path)
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(p, "")
        return 0
    keep = [r for r in read_metrics(p, drop_torn_tail=True) if int(r.get("step", -1)) <= step]
    write_records(p, keep)
    return len(keep)


class Progress:
    """A tqdm progress bar over iterations with a short metrics postfix."""

    def __init__(self, total: int, desc: str = "", *, initial: int = 0, enabled: bool = True,
                 keys: Sequence[str] = ()):
        self.keys = tuple(keys)
        self._bar = None
        if enabled:
            from tqdm import tqdm  # why: progress bars only

            self._bar = tqdm(total=total, initial=initial, desc=desc, file=sys.stderr,
                             dynamic_ncols=True, leave=True)

    def update(self, metrics: Mapping[str, Any] | None = None, n: int = 1) -> None:
        """Advance the bar by ``n`` and show the chosen numeric ``metrics`` (last part of each key)
        beside it; nothing when progress is off."""
        if self._bar is None:
            return
        if metrics:
            shown = {k.split("/")[-1]: v for k, v in metrics.items()
                     if (not self.keys or k in self.keys) and isinstance(v, (int, float))}
            self._bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
        self._bar.update(n)

    def close(self) -> None:
        """Idempotent."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def pyplot():
    """matplotlib.pyplot on the Agg backend (PNG files, no display): the one place jaxdm's
    figures get matplotlib from, imported on the first figure (about 0.4 s) so jobs that draw
    none never load it."""
    import matplotlib  # why: heavy (~0.4 s), only for figures

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_curves(runs: Mapping[str, Sequence[Mapping[str, Any]] | str | Path],
                keys: Sequence[str], out_png: str | Path, *, x: str = "step",
                title: str | None = None, band: Mapping[str, str] | None = None) -> Path:
    """Plot ``keys`` against ``x`` for several runs into one PNG (one panel per key).

    ``runs`` maps a label to a list of records or a metrics JSONL path. Records lacking a key
    (or with null) are skipped for that key. ``band`` optionally maps a key to a companion
    key holding its standard error, drawn as a shaded band.
    """
    plt = pyplot()
    if not keys:
        raise ValueError("plot_curves: keys is empty")
    loaded = {label: (read_metrics(r) if isinstance(r, (str, Path)) else list(r))
              for label, r in runs.items()}
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for label, records in loaded.items():
            pts = [(r[x], r[key], (r.get(band[key]) if band and key in band else None))
                   for r in records if r.get(key) is not None and x in r]
            if not pts:
                continue
            xs = np.array([p[0] for p in pts], float)
            ys = np.array([p[1] for p in pts], float)
            ax.plot(xs, ys, label=label, marker="o" if len(xs) < 30 else None, ms=3)
            if band and key in band and all(p[2] is not None for p in pts):
                se = np.array([p[2] for p in pts], float)
                ax.fill_between(xs, ys - se, ys + se, alpha=0.2)
        ax.set_xlabel(x)
        ax.set_title(key)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                 *, float_fmt: str = "{:.1f}") -> str:
    """A plain monospace table (header + rows) for terminal reports."""
    cells = [[str(c) for c in columns]]
    for r in rows:
        cells.append([float_fmt.format(r[c]) if isinstance(r.get(c), float) else str(r.get(c, ""))
                      for c in columns])
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
