"""One writer per model_dir: a live writer refuses a second, a dead one's lock is taken over."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import make_mlp

import tftrain
from tftrain import checkpoint as checkpoint_lib
from tftrain.checkpoint import writer_lock
from tftrain.checkpoint.writer_lock import LOCK_NAME, WriterLock, _process_start


def data():
    return np.zeros((8, 6), "float32"), np.zeros((8, 3), "float32")


def write_lock(model_dir, **fields):
    model_dir.mkdir(parents=True, exist_ok=True)
    record = {"host": socket.gethostname(), "since": time.time() - 60, "heartbeat": time.time(), **fields}
    (model_dir / LOCK_NAME).write_text(json.dumps(record))


@pytest.fixture
def live_process():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def test_a_live_writer_refuses_a_second_run_and_nothing_is_touched(tmp_path, live_process):
    write_lock(tmp_path, pid=live_process.pid, process_start=_process_start(live_process.pid))
    trainer = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", model_dir=str(tmp_path))
    with pytest.raises(checkpoint_lib.ModelDirInUseError, match=f"process {live_process.pid}, since"):
        trainer.fit(*data(), verbose=0)
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]
    assert int(trainer.model.optimizer.iterations) == 0


def test_a_dead_writers_lock_is_taken_over_and_released_at_the_end(tmp_path, live_process):
    write_lock(tmp_path, pid=live_process.pid, process_start=_process_start(live_process.pid))
    live_process.kill()
    live_process.wait()
    trainer = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", model_dir=str(tmp_path))
    with pytest.warns(UserWarning, match="Taking over"):
        trainer.fit(*data(), verbose=0)
    assert int(trainer.model.optimizer.iterations) == 1
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_reused_process_id_is_not_a_live_writer(tmp_path):
    write_lock(tmp_path, pid=os.getppid(), process_start="1")  # the parent's id, but another start time
    with pytest.warns(UserWarning, match="Taking over"):
        WriterLock(str(tmp_path)).close()


def test_another_hosts_lock_is_stale_only_without_heartbeat(tmp_path):
    write_lock(tmp_path, host="elsewhere", pid=1234)
    with pytest.raises(checkpoint_lib.ModelDirInUseError, match="elsewhere process 1234"):
        WriterLock(str(tmp_path))
    write_lock(tmp_path, host="elsewhere", pid=1234, heartbeat=time.time() - 3600)
    with pytest.warns(UserWarning, match="Taking over"):
        lock = WriterLock(str(tmp_path))
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.close()
    assert not (tmp_path / LOCK_NAME).exists()


def test_the_lock_is_released_when_fit_fails(tmp_path):
    trainer = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", model_dir=str(tmp_path))

    class Fail(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            assert (tmp_path / LOCK_NAME).exists()  # held while training
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(*data(), callbacks=[Fail()], verbose=0)
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_second_trainer_of_the_same_process_is_refused_while_the_first_runs(tmp_path):
    second = tftrain.Trainer(make_mlp(2), optimizer="sgd", loss="mse", model_dir=str(tmp_path))
    refused = []

    class StartTheSecond(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            with pytest.raises(
                checkpoint_lib.ModelDirInUseError, match="Another Trainer or thread of this process"
            ) as raised:
                second.fit(*data(), verbose=0)
            refused.append(raised.value)

    first = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", model_dir=str(tmp_path))
    first.fit(*data(), callbacks=[StartTheSecond()], verbose=0)
    assert len(refused) == 1 and f"its lock: {tmp_path / LOCK_NAME}" in str(refused[0])
    assert int(second.model.optimizer.iterations) == 0
    assert int(first.model.optimizer.iterations) == 1
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-1")
    assert not (tmp_path / LOCK_NAME).exists()
    second.fit(*data(), verbose=0)  # once the first has ended, the directory is free (and resumed)


def test_of_threads_taking_one_lock_at_once_exactly_one_holds_it(tmp_path):
    barrier = threading.Barrier(4)
    held, refused = [], []

    def take():
        barrier.wait()
        try:
            held.append(WriterLock(str(tmp_path)))
        except checkpoint_lib.ModelDirInUseError:
            refused.append(threading.current_thread().name)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(held) == 1 and len(refused) == 3
    with pytest.raises(checkpoint_lib.ModelDirInUseError, match="thread"):
        WriterLock(str(tmp_path))  # and from the main thread too
    held[0].close()
    WriterLock(str(tmp_path)).close()  # released: free again


def test_a_lock_of_this_process_that_nothing_holds_is_taken_over(tmp_path):
    write_lock(tmp_path, pid=os.getpid())  # left by an earlier run of this process that never released it
    with pytest.warns(UserWarning, match="an earlier run of this process left it"):
        WriterLock(str(tmp_path)).close()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_being_written_is_not_taken_over_until_it_is_old(tmp_path):
    (tmp_path / LOCK_NAME).write_text("")  # an exclusive create, not yet written (a filesystem without links)
    with pytest.raises(checkpoint_lib.ModelDirInUseError, match="is being written"):
        WriterLock(str(tmp_path))
    assert (tmp_path / LOCK_NAME).read_text() == ""
    old = time.time() - 60
    os.utime(tmp_path / LOCK_NAME, (old, old))  # never written: its writer was killed
    with pytest.warns(UserWarning, match="its writer could not be read"):
        WriterLock(str(tmp_path)).close()


def test_a_filesystem_without_hard_links_gets_the_lock_by_exclusive_create(tmp_path, monkeypatch):
    def no_links(source, target):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    lock = WriterLock(str(tmp_path))
    assert os.listdir(tmp_path) == [LOCK_NAME]  # the temporary file is gone
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.close()


def test_a_takeover_of_a_stale_lock_by_a_live_process_refuses_the_others(tmp_path, live_process, monkeypatch):
    monkeypatch.setattr(writer_lock, "_TAKEOVER_WAIT_S", 0.05)
    write_lock(tmp_path, pid=os.getppid(), process_start="1")  # stale
    claim = {"host": socket.gethostname(), "pid": live_process.pid, "since": time.time()}
    (tmp_path / (LOCK_NAME + writer_lock.TAKEOVER_SUFFIX)).write_text(
        json.dumps({**claim, "process_start": _process_start(live_process.pid)})
    )
    with pytest.raises(checkpoint_lib.ModelDirInUseError, match=f"process {live_process.pid}, since"):
        WriterLock(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME, LOCK_NAME + writer_lock.TAKEOVER_SUFFIX]


def test_a_takeover_left_by_a_killed_process_is_cleared_and_the_stale_lock_taken_over(tmp_path, live_process):
    write_lock(tmp_path, pid=os.getppid(), process_start="1")  # stale
    claim = {"host": socket.gethostname(), "pid": live_process.pid, "since": time.time()}
    (tmp_path / (LOCK_NAME + writer_lock.TAKEOVER_SUFFIX)).write_text(
        json.dumps({**claim, "process_start": _process_start(live_process.pid)})
    )
    live_process.kill()
    live_process.wait()
    with pytest.warns(UserWarning, match="Taking over"):
        lock = WriterLock(str(tmp_path))
    assert os.listdir(tmp_path) == [LOCK_NAME]
    lock.close()
