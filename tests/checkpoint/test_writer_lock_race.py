"""Two processes taking one writer lock at the same instant: exactly one holds it, in every trial.

This process and one contender process (started once: it imports TensorFlow)
take the lock of a directory together, many times over: a fresh directory, and
a directory holding the stale lock of a dead process. Each trial starts both at
once (each marks itself ready, then spins until the other is; then each pauses
at random after its filesystem calls, as preemption would), and checks that
exactly one holds the lock, the lock names it, and the other left nothing in
the directory.
"""

import json
import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

import tftrain
from tftrain.checkpoint.writer_lock import LOCK_NAME, _process_start

SOURCE = os.path.dirname(os.path.dirname(tftrain.__file__))

TRIALS = 40

# Runs in both processes: take `directory`'s lock together with the other process. A process
# can be preempted between any two system calls: each filesystem call here is followed, at
# random, by a pause of up to 0.2 ms (seeded per trial), so that interleavings a quiet machine
# rarely shows come up within a few trials (a lock taken in non-atomic steps is then held by both in 1 trial in 3 to 6).
CONTEND = """
import builtins, contextlib, functools, os, random, time, warnings
from tftrain.checkpoint.writer_lock import WriterLock
from tftrain.errors import ModelDirInUseError

PAUSED = [(os, name) for name in ("open", "close", "write", "fsync", "link", "rename", "replace", "remove",
          "unlink", "kill")] + [(builtins, "open")]

@contextlib.contextmanager
def preempted(rng):
    def pausing(call):
        @functools.wraps(call)
        def paused(*args, **kwargs):
            try:
                return call(*args, **kwargs)
            finally:
                if rng.random() < 0.5:
                    time.sleep(rng.random() * 2e-4)
        return paused
    originals = [(module, name, getattr(module, name)) for module, name in PAUSED]
    for module, name, call in originals:
        setattr(module, name, pausing(call))
    try:
        yield
    finally:
        for module, name, call in originals:
            setattr(module, name, call)

def contend(directory, me, other, seed):
    rng = random.Random(seed)
    open(f"{directory}.sync/{me}", "w").close()
    while not os.path.exists(f"{directory}.sync/{other}"):
        pass
    with preempted(rng), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the winner over a stale lock is warned
        time.sleep(rng.random() * 2e-4)
        try:
            return WriterLock(directory)
        except ModelDirInUseError:
            return None
"""

CONTENDER = (
    CONTEND
    + """
import sys
held = None
for line in sys.stdin:
    if held is not None:
        held.close()
    directory, seed = line.split()
    held = contend(directory, "child", "parent", seed)
    print("held" if held is not None else "refused", os.getpid(), flush=True)
"""
)

_namespace = {}
exec(CONTEND, _namespace)  # the same code, in this process
contend = _namespace["contend"]


@pytest.fixture(scope="module")
def contender():
    """The other process: takes the lock of each directory written to its stdin, and says whether it holds it."""
    process = subprocess.Popen(
        [sys.executable, "-c", CONTENDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "PYTHONPATH": SOURCE,
        },  # this tftrain, from any directory
    )
    yield process
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def dead_process():
    """The id and start time of a process that has ended (the start time tells a reused id apart)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    start = _process_start(process.pid)
    process.kill()
    process.wait()
    return {"pid": process.pid, "process_start": start}


def stale_lock(directory, dead_process):
    record = {
        "host": socket.gethostname(),
        "since": time.time() - 60,
        "heartbeat": time.time(),
        **dead_process,
    }
    (directory / LOCK_NAME).write_text(json.dumps({**record, "token": uuid.uuid4().hex}))


def race(contender, directory, seed):
    """Both processes take `directory`'s lock at once.

    Returns the pids holding the lock, the pid the lock names, and what the directory holds.
    """
    (directory.parent / f"{directory.name}.sync").mkdir()
    contender.stdin.write(f"{directory} child{seed}\n")
    contender.stdin.flush()
    mine = contend(str(directory), "parent", "child", f"parent{seed}")
    answer = contender.stdout.readline()
    assert answer, "the contender process ended (its error is in the captured stderr)"
    outcome, child_pid = answer.split()
    holders = [os.getpid()] * (mine is not None) + [int(child_pid)] * (outcome == "held")
    listing = sorted(os.listdir(directory))
    named = json.loads((directory / LOCK_NAME).read_text())["pid"] if LOCK_NAME in listing else None
    if mine is not None:
        mine.close()
    return holders, named, listing


@pytest.mark.parametrize("start", ["fresh directory", "stale lock of a dead process"])
def test_of_two_processes_taking_the_lock_at_once_exactly_one_holds_it(
    tmp_path, contender, dead_process, start
):
    for trial in range(TRIALS):
        directory = tmp_path / str(trial)
        directory.mkdir()
        if start != "fresh directory":
            stale_lock(directory, dead_process)
        holders, named, listing = race(contender, directory, seed=trial)
        assert len(holders) == 1, f"trial {trial}: {len(holders)} processes hold the lock"
        assert named == holders[0] and listing == [LOCK_NAME], f"trial {trial}: {listing}"
