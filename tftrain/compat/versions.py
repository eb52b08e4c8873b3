"""The TensorFlow and Keras versions tftrain declares, checked against those installed.

`import tftrain` runs `check_installed_versions`: a TensorFlow or Keras
outside the range tftrain declares fails there, with an `ImportError` that
names the package, the version found, the range and the pip command that
fixes it, rather than later, in a private API that version lacks (Keras 2
has no `keras.src`; a TensorFlow before 2.16 comes with Keras 2).

The ranges are read from one place, tftrain's own installed metadata
(`install_requires` in setup.cfg), and the installed versions from the
packages' metadata: neither TensorFlow nor Keras is imported, so
`import tftrain` stays light. Only the distributions named in
`install_requires` are looked at (`tensorflow`, not a variant such as
`tensorflow-cpu`); one that is not installed, or a tftrain run from a source
tree that was never installed, is not checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib import metadata

from packaging.requirements import Requirement

__all__ = [
    "CHECKED",
    "check_installed_versions",
    "declared_requirements",
    "installed_version",
    "version_problems",
]

CHECKED = ("tensorflow", "keras")
"""The distributions whose installed version is checked against the declared range."""


def declared_requirements() -> list[str]:
    """tftrain's requirements as its installed metadata declares them (empty where it is not installed)."""
    try:
        return list(metadata.requires("tftrain") or ())
    except metadata.PackageNotFoundError:
        return []


def installed_version(name: str) -> str | None:
    """The installed version of distribution `name`, or None where it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _applies(requirement: Requirement) -> bool:
    """Whether a requirement holds for a plain install here (no extra; its environment marker true)."""
    return requirement.marker is None or requirement.marker.evaluate({"extra": ""})


def version_problems(requirements: Iterable[str], installed: Callable[[str], str | None]) -> str | None:
    """What is wrong with the installed versions of `CHECKED`, or None where nothing is.

    Args:
        requirements: Requirement strings, as `importlib.metadata.requires`
            returns them (e.g. `"keras>=3.10"`, `'pytest; extra == "test"'`).
        installed: The installed version of a distribution name, or None
            where it is not installed.

    Returns:
        A message naming each package outside its range (its version found,
        the range declared) and the pip command that installs versions in
        range; None where every checked package is in range or not installed.
    """
    outside = []
    for text in requirements:
        requirement = Requirement(text)
        name = requirement.name.lower()
        if name not in CHECKED or not _applies(requirement) or not requirement.specifier:
            continue
        version = installed(name)
        if version is None or requirement.specifier.contains(version, prereleases=True):
            continue
        note = " (Keras 2; tftrain needs Keras 3)" if name == "keras" and version.startswith("2.") else ""
        outside.append((name, version, note, f"{name}{requirement.specifier}"))
    if not outside:
        return None
    lines = [
        f"- {name} {version} is installed{note}; tftrain needs {wanted}."
        for name, version, note, wanted in outside
    ]
    command = " ".join(f'"{wanted}"' for *_, wanted in outside)
    return (
        "tftrain cannot run with the installed TensorFlow/Keras, which are outside the range "
        "tftrain declares (its install_requires):\n" + "\n".join(lines) + f"\nInstall versions in range: "
        f"pip install --upgrade {command}"
    )


def check_installed_versions() -> None:
    """Checks the installed TensorFlow and Keras against the range tftrain's metadata declares.

    Raises:
        ImportError: TensorFlow or Keras is installed at a version outside
            the declared range (the message names each, and the pip command
            that fixes it).
    """
    message = version_problems(declared_requirements(), installed_version)
    if message is not None:
        raise ImportError(message)
