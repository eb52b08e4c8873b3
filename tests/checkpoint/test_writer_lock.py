"""One writer per model_dir: a live writer refuses a second, a dead one's lock is taken over."""

import json
import os
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from helpers import make_mlp

import tftrain
from tftrain import checkpoint as checkpoint_lib
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
