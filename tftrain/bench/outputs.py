"""Where the benchmark writes: checked before anything runs, written all at once at the end.

A benchmark run takes minutes; a typo in `--output` or a missing matplotlib
must not be discovered after it. And a run that fails half-way (or a plot that
cannot be drawn) must not leave a truncated JSON file or a stale image behind:
every file is first written next to its destination under a temporary name and
renamed into place only after all of them were written.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from tftrain.bench import plot, report


def check_destination(path: str, argument: str, suffixes: tuple[str, ...] | None = None) -> None:
    """Checks that `path` can be written: its directory exists and is writable, it is not a directory.

    Args:
        path: The file to write later.
        argument: The flag's name, for the message.
        suffixes: Allowed file name endings, or None for any.

    Raises:
        ValueError: what is wrong, and how to fix it.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"--{argument}={path} is a directory. Expected a file name, e.g. {path}/results.")
    if not os.path.isdir(directory):
        raise ValueError(f"--{argument}={path}: the directory {directory} does not exist. Create it first.")
    if not os.access(directory, os.W_OK):
        raise ValueError(f"--{argument}={path}: the directory {directory} is not writable.")
    if suffixes is not None and not path.lower().endswith(suffixes):
        raise ValueError(f"--{argument}={path}: expected a file name ending in {', '.join(suffixes)}.")


def check_outputs(json_path: str | None, plot_path: str | None) -> None:
    """Checks both destinations, and that matplotlib is there when a plot is asked for.

    Raises:
        ValueError: a destination cannot be written.
        plot.PlottingUnavailableError: `plot_path` is set and matplotlib is missing.
    """
    if json_path:
        check_destination(json_path, "output")
    if plot_path:
        check_destination(plot_path, "plot", plot.PLOT_SUFFIXES)
        plot.check_available()
    if json_path and plot_path and os.path.abspath(json_path) == os.path.abspath(plot_path):
        raise ValueError(f"--output and --plot name the same file ({json_path}). Give them different names.")


def _write_all(writers: list[tuple[str, Callable[[str], None]]]) -> None:
    """Runs each `writer(temporary_path)`, then renames every file into place; on error, removes them."""
    written: list[tuple[str, str]] = []
    try:
        for path, writer in writers:
            directory, name = os.path.split(os.path.abspath(path))
            handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
            os.close(handle)
            written.append((temporary, path))
            writer(temporary)
    except BaseException:
        for temporary, _ in written:
            if os.path.exists(temporary):
                os.remove(temporary)
        raise
    mode = 0o666 & ~_umask()  # mkstemp makes files private; give them the usual permissions
    for temporary, path in written:
        os.chmod(temporary, mode)
        os.replace(temporary, path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_outputs(results: dict[str, Any], json_path: str | None, plot_path: str | None) -> list[str]:
    """Writes the JSON and the plot (each optional) all at once.

    Args:
        results: What `suite.run_benchmark` returned.
        json_path: Where to write the JSON, or None.
        plot_path: Where to draw the chart, or None.

    Returns:
        The paths written.
    """
    writers: list[tuple[str, Callable[[str], None]]] = []
    if json_path:
        writers.append((json_path, lambda path: report.write_json(results, path)))
    if plot_path:
        # savefig infers the format from the name; the temporary name ends in .tmp.
        suffix = os.path.splitext(plot_path)[1].lstrip(".").lower()
        writers.append((plot_path, lambda path: _plot_as(results, path, suffix)))
    _write_all(writers)
    return [path for path, _ in writers]


def write_startup_json(results: dict[str, Any], json_path: str) -> str:
    """Writes the startup benchmark's results (`tftrain.bench.startup`) as JSON, all at once; returns the path."""
    import json  # noqa: PLC0415

    def write(path: str) -> None:
        with open(path, "w") as file:
            json.dump(results, file, indent=2)

    _write_all([(json_path, write)])
    return json_path


def _plot_as(results: dict[str, Any], path: str, suffix: str) -> None:
    with open(path, "wb") as file:
        plot.plot_results(results, file, image_format=suffix)
