"""tensorflow-datasets behind `tftrain.data.load` and `tftrain.data.info`, with fast, clear offline errors.

A dataset missing from `data_dir` is downloaded only when its download
servers accept a connection: tensorflow-datasets itself retries a failed
connection for minutes (measured here: 3.4 minutes for cifar10 with no
network) before it gives up.
"""

from __future__ import annotations

import os
import socket
import textwrap
import urllib.parse
import urllib.request
from collections.abc import Iterable

import tensorflow as tf

from tftrain.data.catalog import PUBLISHED_SPLIT_SIZES, SPLITS, DatasetInfo
from tftrain.errors import DatasetUnavailableError

CONNECT_TIMEOUT_S = 5.0
"""Seconds to wait for a download server to accept a connection."""

_SPLIT_ALIASES = {"imagenet2012": {"test": "validation"}}


def _tfds():
    import tensorflow_datasets as tfds

    return tfds


def _builder(name: str, data_dir: str | None):
    return _tfds().builder(name, data_dir=data_dir)


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
    missing = f"Dataset {name!r} is not in data_dir={root}"
    if builder.MANUAL_DOWNLOAD_INSTRUCTIONS:
        manual = manual_dir or os.path.join(root, "downloads", "manual")
        if not os.path.isdir(manual) or not os.listdir(manual):
            instructions = " ".join(textwrap.dedent(builder.MANUAL_DOWNLOAD_INSTRUCTIONS).split())
            raise DatasetUnavailableError(
                f"{missing} and cannot be downloaded automatically: manual_dir={manual} is "
                f"missing or empty. tensorflow-datasets says: {instructions} Pass that "
                f"directory as manual_dir to prepare the dataset. {_offline_advice(name)}",
                name=name,
                data_dir=root,
            )
    else:
        problem = _connection_problem(sorted(builder.url_infos or ()), CONNECT_TIMEOUT_S)
        if problem:
            raise DatasetUnavailableError(
                f"{missing} and could not be downloaded: {problem}. {_offline_advice(name)}",
                name=name,
                data_dir=root,
            )
    config = _tfds().download.DownloadConfig(manual_dir=manual_dir)
    try:
        builder.download_and_prepare(download_config=config)
    except Exception as error:  # any failure here means the data is not available
        raise DatasetUnavailableError(
            f"{missing} and could not be downloaded and prepared: {_one_line(error)}. "
            f"{_offline_advice(name)}",
            name=name,
            data_dir=root,
        ) from None


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
    """`tftrain.data.load` for a tensorflow-datasets name; arguments already validated there."""
    tfds_split = _SPLIT_ALIASES.get(name, {}).get(split, split)
    if num_examples is not None:
        tfds_split = f"{tfds_split}[:{num_examples}]"
    builder = _builder(name, data_dir)

    def read() -> tf.data.Dataset:
        return builder.as_dataset(split=tfds_split, as_supervised=True, shuffle_files=shuffle_files)

    try:
        dataset = read()
    except AssertionError:  # tensorflow-datasets: "could not find data in <data_dir>"
        if builder.is_prepared():
            raise
        _download_and_prepare(builder, name, manual_dir)
        dataset = read()
    if num_examples is not None:
        dataset = dataset.take(num_examples)
    if image_size is not None:
        dataset = dataset.map(
            lambda image, label: (_resize(image, image_size), label),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    return dataset


def tfds_info(name: str, *, data_dir: str | None, image_size: int | None) -> DatasetInfo:
    """`tftrain.data.info` for a tensorflow-datasets name; arguments already validated there."""
    builder = _builder(name, data_dir)
    features = builder.info.features
    height, width, channels = features["image"].shape
    if image_size is not None:
        height = width = image_size
    if builder.is_prepared():
        sizes = {split: info.num_examples for split, info in builder.info.splits.items()}
    else:
        sizes = PUBLISHED_SPLIT_SIZES[name]
    splits = {}
    for split in SPLITS[name]:
        source = _SPLIT_ALIASES.get(name, {}).get(split, split)
        if source in sizes:
            splits[split] = int(sizes[source])
    return DatasetInfo(
        name=name,
        num_classes=int(features["label"].num_classes),
        image_shape=(height, width, int(channels)),
        splits=splits,
    )
