"""`tftrain.compat.versions`: the installed TensorFlow/Keras are checked against the range setup.cfg declares."""

import configparser
import os
from importlib import metadata

import keras
import pytest
import tensorflow as tf
from packaging.requirements import Requirement

from tftrain.compat import keras_internals, versions

SETUP_CFG = os.path.join(os.path.dirname(__file__), "..", "..", "setup.cfg")
DECLARED = ["tensorflow>=2.16.2", "keras>=3.10", "numpy", 'pytest>=7; extra == "test"']


def setup_cfg_requirements():
    parser = configparser.ConfigParser()
    parser.read(SETUP_CFG)
    lines = parser["options"]["install_requires"].splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def fake_installed(**found):
    return lambda name: found.get(name)


def test_the_installed_pair_is_in_the_declared_range():
    versions.check_installed_versions()
    declared = {
        Requirement(text).name: Requirement(text).specifier for text in versions.declared_requirements()
    }
    assert declared["tensorflow"].contains(tf.__version__, prereleases=True)
    assert declared["keras"].contains(keras.__version__, prereleases=True)


def test_the_range_checked_is_the_one_setup_cfg_declares():
    """One source: the installed metadata is setup.cfg's `install_requires` (reinstall tftrain if this fails)."""
    installed = {
        Requirement(text).name: str(Requirement(text).specifier) for text in versions.declared_requirements()
    }
    declared = {Requirement(text).name: str(Requirement(text).specifier) for text in setup_cfg_requirements()}
    for name in versions.CHECKED:
        assert declared[name], name  # a range, not a bare name
        assert installed[name] == declared[name], name


def test_the_tested_floor_is_the_declared_floor():
    declared = {Requirement(text).name: Requirement(text).specifier for text in setup_cfg_requirements()}
    floors = {"tensorflow": keras_internals.TESTED_TENSORFLOW[0], "keras": keras_internals.TESTED_KERAS[0]}
    for name, floor in floors.items():
        (bound,) = [spec for spec in declared[name] if spec.operator == ">="]
        assert tuple(floor.split("."))[:2] == tuple(bound.version.split("."))[:2], name
        assert declared[name].contains(floor), name
    with open(os.path.join(os.path.dirname(SETUP_CFG), ".ci", "oldest-pair")) as file:
        script = file.read()
    assert f'"tensorflow=={floors["tensorflow"]}" "keras=={floors["keras"]}"' in script


def test_keras_2_is_named_with_the_range_and_the_pip_command():
    message = versions.version_problems(DECLARED, fake_installed(tensorflow="2.16.2", keras="2.15.0"))
    assert (
        "- keras 2.15.0 is installed (Keras 2; tftrain needs Keras 3); tftrain needs keras>=3.10." in message
    )
    assert "tensorflow 2.16.2" not in message
    assert message.endswith('pip install --upgrade "keras>=3.10"')


def test_an_old_tensorflow_and_keras_are_both_named():
    message = versions.version_problems(DECLARED, fake_installed(tensorflow="2.15.1", keras="3.7.0"))
    assert "- tensorflow 2.15.1 is installed; tftrain needs tensorflow>=2.16.2." in message
    assert "- keras 3.7.0 is installed; tftrain needs keras>=3.10." in message
    assert "Keras 2" not in message
    assert message.endswith('pip install --upgrade "tensorflow>=2.16.2" "keras>=3.10"')


@pytest.mark.parametrize(
    "found",
    [
        {"tensorflow": "2.16.2", "keras": "3.10.0"},
        {"tensorflow": "2.21.0", "keras": "3.15.1"},
        {"tensorflow": "2.22.0rc1", "keras": "3.16.0.dev2026120701"},  # pre-releases in range
        {"tensorflow": "2.16.2"},  # Keras not installed: nothing to check
        {},
    ],
)
def test_versions_in_range_or_not_installed_pass(found):
    assert versions.version_problems(DECLARED, fake_installed(**found)) is None


def test_only_plain_requirements_of_tensorflow_and_keras_are_checked():
    requirements = [
        'keras>=9; extra == "test"',  # an extra's
        'tensorflow>=9; python_version < "3"',  # another environment's
        "numpy>=9",  # not a checked package
        "Keras>=3.10",  # names compare case-insensitively
    ]
    found = fake_installed(tensorflow="2.16.2", keras="3.9.2", numpy="1.26.4")
    message = versions.version_problems(requirements, found)
    assert "keras 3.9.2 is installed; tftrain needs keras>=3.10" in message
    assert "tensorflow" not in message and "numpy" not in message


def test_check_raises_import_error_from_the_installed_metadata(monkeypatch):
    monkeypatch.setattr(versions, "installed_version", fake_installed(tensorflow="2.15.1", keras="2.15.0"))
    with pytest.raises(
        ImportError, match=r"tensorflow 2\.15\.1 is installed; tftrain needs tensorflow>="
    ) as error:
        versions.check_installed_versions()
    assert "keras 2.15.0 is installed (Keras 2; tftrain needs Keras 3)" in str(error.value)


def test_a_tftrain_that_is_not_installed_checks_nothing(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "requires", not_installed)
    monkeypatch.setattr(versions, "installed_version", fake_installed(tensorflow="2.15.1", keras="2.15.0"))
    assert versions.declared_requirements() == []
    versions.check_installed_versions()
