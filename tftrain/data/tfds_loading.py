"""tensorflow-datasets behind `tftrain.data.load` and `tftrain.data.info`, with fast, clear offline errors.

A dataset missing from `data_dir` is downloaded only when its download
servers accept a connection: tensorflow-datasets itself retries a failed
connection for minutes (measured here: 3.4 minutes for cifar10 with no
network) before it gives up.
"""

from __future__ import annotations

import difflib
import functools
import os
import socket
import textwrap
import urllib.parse
import urllib.request
from collections.abc import Iterable

import tensorflow as tf

from tftrain.data.catalog import (
    GENERATED_DATASETS,
    KNOWN_DATASETS,
    PUBLISHED_SPLIT_SIZES,
    SPLIT_ALIASES,
    DatasetInfo,
    SplitSizes,
    alias_split,
    base_name,
    check_known_split,
    is_plain_split,
    split_error,
    split_names,
)
from tftrain.errors import DatasetUnavailableError

CONNECT_TIMEOUT_S = 5.0
"""Seconds to wait for a download server to accept a connection."""


def _tfds():
    import tensorflow_datasets as tfds

    return tfds


def _unknown_name(name: str, data_dir: str | None) -> ValueError:
    wanted = base_name(name).lower()
    known = [known for known in KNOWN_DATASETS if known not in GENERATED_DATASETS]
    close = [known for known in known if known.startswith(wanted) or wanted.startswith(known)]
    registered = _tfds().list_builders(with_community_datasets=False)
    close += difflib.get_close_matches(wanted, list(registered), n=5, cutoff=0.6)
    close = list(dict.fromkeys(close))[:6]
    suggestion = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    where = f"data_dir={data_dir}" if data_dir else "the default data_dir"
    return ValueError(
        f"Invalid value for argument `name`. Received: name={name!r}, which is neither a "
        f"tensorflow-datasets name (tfds.list_builders()) nor a dataset prepared in {where}.{suggestion} "
        "Expected a tensorflow-datasets name, optionally with a config and version "
        "('imagenet2012_subset/1pct', 'cifar10:3.0.2'), or 'shapes' or 'synthetic' (generated offline)."
    )


def _builder(name: str, data_dir: str | None):
    """`tfds.builder(name, data_dir=data_dir)`, with a clear `ValueError` for a name it does not know."""
    tfds = _tfds()
    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise _unknown_name(name, data_dir) from None
    except (ValueError, AssertionError) as error:  # an unknown config or version of a known name
        expected = ""
        try:
            configs = [config.name for config in tfds.builder_cls(base_name(name)).BUILDER_CONFIGS]
        except Exception:  # not a registered name: tfds's own words must do
            configs = []
        if configs:
            expected = f" Its configs: {', '.join(configs)} (e.g. '{base_name(name)}/{configs[0]}')."
        raise ValueError(
            f"Invalid value for argument `name`. Received: name={name!r}. tensorflow-datasets cannot "
            f"build it: {_one_line(error)}.{expected}"
        ) from None


def check_tfds_name(name: str, *, data_dir: str | None) -> None:
    """`tftrain.data.check_name` for a tensorflow-datasets name: raises `ValueError` if tfds cannot build it."""
    _check_image_classification(_builder(name, data_dir), name)


def _check_image_classification(builder, name: str) -> None:
    features = builder.info.features
    keys = list(features.keys()) if hasattr(features, "keys") else []
    label = features["label"] if "label" in keys else None
    if "image" not in keys or not hasattr(label, "num_classes"):
        raise ValueError(
            f"Invalid value for argument `name`. Received: name={name!r}, a dataset with features "
            f"{keys}. tftrain.data reads image classification datasets: expected an 'image' feature "
            "and a class 'label' feature, as cifar10 or imagenet2012 have."
        )


def _not_prepared(builder, name: str, split: str) -> DatasetUnavailableError:
    root = os.fspath(builder.data_dir_root)
    return DatasetUnavailableError(
        f"Dataset {name!r} is not prepared in data_dir={root}, so the size of its split {split!r} is "
        f"not known. Prepare it first: tftrain.data.load({name!r}, data_dir=DIR) downloads and "
        "prepares it where its download servers can be reached (manual downloads, such as "
        "imagenet2012's, go in manual_dir). " + _offline_advice(name),
        name=name,
        data_dir=root,
    )


def _available_splits(name: str, split_dict) -> list[str]:
    available = list(split_dict)
    for alias, target in SPLIT_ALIASES.get(base_name(name), {}).items():
        if target in available and alias not in available:
            available.append(alias)
    return available


def _split_error(name: str, split: object, split_dict, error: BaseException | None = None):
    available = _available_splits(name, split_dict or {})
    if not isinstance(split, str):
        return split_error(name, split, available, "Expected a string")
    missing = [piece for piece in split_names(alias_split(name, split)) if piece not in available]
    if missing and available:
        reason = f"It has no split {', '.join(map(repr, missing))}"
    elif error is not None:
        reason = f"tensorflow-datasets cannot read it: {str(error).strip().splitlines()[-1]}"
    else:
        reason = ""
    return split_error(name, split, available, reason)


def _split_count(name: str, split_dict, builder_for_errors, split: str) -> int:
    """Examples in `split` (any split string), as tensorflow-datasets counts them."""
    if not split_dict:
        raise _not_prepared(builder_for_errors, name, split)
    if not isinstance(split, str):
        raise _split_error(name, split, split_dict)
    try:
        return int(split_dict[alias_split(name, split)].num_examples)
    except (KeyError, ValueError) as error:
        raise _split_error(name, split, split_dict, error) from None


def _check_split_syntax(name: str, split: str) -> None:
    """Checks a split string before the dataset's own splits are known (it is not prepared)."""
    check_known_split(name, split)
    if not isinstance(split, str):
        raise _split_error(name, split, None)
    try:
        _tfds().core.ReadInstruction.from_spec(alias_split(name, split))
    except (ValueError, AssertionError) as error:
        raise _split_error(name, split, None, error) from None


def _published_split_dict(name: str):
    """A tfds `SplitDict` of the published sizes of `name`'s splits (no files behind it)."""
    tfds = _tfds()
    infos = []
    for split, count in PUBLISHED_SPLIT_SIZES[name].items():
        template = tfds.core.ShardedFileTemplate(
            data_dir="/published", dataset_name=name, split=split, filetype_suffix="tfrecord"
        )
        infos.append(
            tfds.core.SplitInfo(name=split, shard_lengths=[count], num_bytes=0, filename_template=template)
        )
    return tfds.core.SplitDict(infos)


def _offline_advice(name: str) -> str:
    return (
        'Offline, use dataset="shapes" (a generated, learnable image set) or '
        'dataset="synthetic" (random data, for timing), e.g. tftrain.data.load("shapes"). '
        "Or prepare the dataset on a machine with internet access "
        f"(`tfds build {name} --data_dir=DIR`, or `tfds.load({name!r}, data_dir=DIR)` in Python), "
        "copy DIR here and pass it as data_dir."
    )


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _connection_problem(urls: Iterable[str], timeout: float) -> str | None:
    """Why the download servers of `urls` cannot be reached, or None if they accept a connection.

    Connects where the download would: to the proxy configured for the URL's
    scheme (the standard proxy environment variables, as `requests` reads
    them) or else to the server itself.
    """
    proxies = urllib.request.getproxies()
    tried = set()
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            continue
        address = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        proxy = proxies.get(parts.scheme)
        if proxy and not urllib.request.proxy_bypass(parts.hostname):
            proxy_parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            address = (proxy_parts.hostname, proxy_parts.port or 80)
        if address in tried:
            continue
        tried.add(address)
        try:
            socket.create_connection(address, timeout=timeout).close()
        except OSError as error:
            return f"cannot connect to {address[0]}:{address[1]} ({error})"
    return None


def _download_and_prepare(builder, name: str, manual_dir: str | None) -> None:
    """Downloads and prepares `builder`'s dataset, or raises `DatasetUnavailableError` quickly."""
    root = os.fspath(builder.data_dir_root)

    def unavailable(why: str) -> DatasetUnavailableError:
        message = f"Dataset {name!r} is not in data_dir={root} and {why}. {_offline_advice(name)}"
        return DatasetUnavailableError(message, name=name, data_dir=root)

    if builder.MANUAL_DOWNLOAD_INSTRUCTIONS:
        manual = manual_dir or os.path.join(root, "downloads", "manual")
        if not os.path.isdir(manual) or not os.listdir(manual):
            instructions = " ".join(textwrap.dedent(builder.MANUAL_DOWNLOAD_INSTRUCTIONS).split())
            raise unavailable(
                f"cannot be downloaded automatically: manual_dir={manual} is missing or empty. "
                f"tensorflow-datasets says: {instructions} Pass that directory as manual_dir to prepare "
                "the dataset"
            )
    else:
        problem = _connection_problem(sorted(builder.url_infos or ()), CONNECT_TIMEOUT_S)
        if problem:
            raise unavailable(f"could not be downloaded: {problem}")
    config = _tfds().download.DownloadConfig(manual_dir=manual_dir)
    try:
        builder.download_and_prepare(download_config=config)
    except Exception as error:  # any failure here means the data is not available
        raise unavailable(f"could not be downloaded and prepared: {_one_line(error)}") from None


def _resize(image: tf.Tensor, image_size: int) -> tf.Tensor:
    if image.shape[0] == image_size and image.shape[1] == image_size:
        return image
    resized = tf.image.resize(image, (image_size, image_size), antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)


def load_tfds(
    name: str,
    split: str,
    *,
    data_dir: str | None,
    image_size: int | None,
    num_examples: int | None,
    manual_dir: str | None,
    shuffle_files: bool,
) -> tf.data.Dataset:
    """`tftrain.data.load` for a tensorflow-datasets name; its other arguments validated there.

    The split is checked against the dataset's splits where they are known
    (it is prepared), else its syntax and, for `KNOWN_DATASETS`, its split
    names; once a missing dataset is prepared, against its splits.
    tensorflow-datasets' automatic cache of small datasets is off
    (`tfds.ReadConfig(try_autocache=False)`).
    """
    builder = _builder(name, data_dir)
    _check_image_classification(builder, name)
    if builder.info.splits:
        _split_count(name, builder.info.splits, builder, split)
    else:
        _check_split_syntax(name, split)
    tfds_split = alias_split(name, split)
    if num_examples is not None and is_plain_split(tfds_split):
        tfds_split = f"{tfds_split}[:{num_examples}]"  # reads only the files it needs
    # A slice or sum ("train[10%:]", "train+test") is read whole and cut by `take` below.

    def read() -> tf.data.Dataset:
        # No automatic cache of small datasets: a cached iterator cannot be checkpointed symbolically, so
        # every checkpoint of a run would hold the decoded dataset. `.cache()` on the result asks for one.
        read_config = _tfds().ReadConfig(try_autocache=False)
        examples = builder.as_dataset(split=tfds_split, shuffle_files=shuffle_files, read_config=read_config)
        # What `as_supervised=True` gives for cifar10 or imagenet2012; also without supervised keys.
        return examples.map(lambda example: (example["image"], example["label"]))

    try:
        dataset = read()
    except AssertionError:  # tensorflow-datasets: "could not find data in <data_dir>"
        if builder.is_prepared():
            raise
        _download_and_prepare(builder, name, manual_dir)
        if builder.info.splits:
            _split_count(name, builder.info.splits, builder, split)
        dataset = read()
    if num_examples is not None:
        dataset = dataset.take(num_examples)
    if image_size is not None:
        dataset = dataset.map(
            lambda image, label: (_resize(image, image_size), label), num_parallel_calls=tf.data.AUTOTUNE
        )
    return dataset


def tfds_info(name: str, *, data_dir: str | None, image_size: int | None) -> DatasetInfo:
    """`tftrain.data.info` for a tensorflow-datasets name; arguments already validated there.

    Split sizes: `builder.info.splits` of the prepared dataset, else the
    published ones (`PUBLISHED_SPLIT_SIZES`), else none (looking one up
    raises `DatasetUnavailableError`).
    """
    builder = _builder(name, data_dir)
    _check_image_classification(builder, name)
    features = builder.info.features
    height, width, channels = features["image"].shape
    if image_size is not None:
        height = width = image_size
    split_dict = builder.info.splits  # empty where the dataset is not prepared
    if not split_dict and name in PUBLISHED_SPLIT_SIZES:
        split_dict = _published_split_dict(name)
    count = functools.partial(_split_count, name, split_dict, builder)
    sizes = {split: count(split) for split in _available_splits(name, split_dict or {})}
    return DatasetInfo(
        name=name,
        num_classes=int(features["label"].num_classes),
        image_shape=(height, width, int(channels)),
        splits=SplitSizes(sizes, count),
    )
