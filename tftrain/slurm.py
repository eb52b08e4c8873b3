"""SLURM: the cluster of a job step with several tasks, and requeueing a job.

`read_step` reads the variables `srun` sets in each task of a job step, with
the host-list helpers of TensorFlow's own
`tf.distribute.cluster_resolver.SlurmClusterResolver`, and returns a
TF_CONFIG-like cluster for `tftrain.distribute.setup_strategy`: a node's tasks
on consecutive ports, as that resolver places them. The resolver itself is not
used: it orders nodes as sorted strings (`node10` before `node9`) where `srun`
numbers tasks in node-list order, fails on a node without `nvidia-smi` or GPUs,
and cannot leave GPUs that SLURM bound to a task as they are. `requeue` runs `scontrol requeue` for the
job, bounded by a timeout, and says in one line what happened.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import warnings
from typing import Any

from tftrain.arguments import check_port
from tftrain.compat import tf_internals

_LOGGER = logging.getLogger("tftrain")

DEFAULT_PORT = 8888
"""The first port of a node's tasks (TensorFlow's `SlurmClusterResolver` default); task k of a node listens on it + k."""

PORT_VARIABLE = "TFTRAIN_SLURM_PORT"
"""The environment variable that overrides `DEFAULT_PORT` (`setup_strategy(slurm_port=...)` overrides both)."""

REQUEUE_TIMEOUT_S = 30.0
"""How long `requeue` waits for `scontrol` before it gives up (said in one line)."""

_STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")


@dataclasses.dataclass(frozen=True)
class SlurmStep:
    """One task of a SLURM job step with several tasks, as `read_step` found it.

    Attributes:
        config: The cluster as TF_CONFIG writes it: `{"cluster": {"worker":
            ["host:port", ...]}, "task": {"type": "worker", "index": i}}`;
            task 0 (the chief) is worker 0.
        job_id: `SLURM_JOB_ID` (None if unset).
        nodes: The step's nodes, in the order of `SLURM_STEP_NODELIST`.
        tasks_per_node: Tasks on each of `nodes`.
        rank: This task's `SLURM_PROCID`.
        port: The first port of each node.
        gpus: This task's GPUs (`CUDA_VISIBLE_DEVICES` entries), or None
            (the CPU, or GPUs SLURM already bound to this task, left as they are).
    """

    config: dict[str, Any]
    job_id: str | None
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    rank: int
    port: int
    gpus: tuple[str, ...] | None = None

    def describe(self) -> str:
        """The strategy's log line, e.g. "SLURM job 123 step: 2 tasks on nodes n1 (2 per node), ports from 8888; this is task 0"."""
        counts = sorted(set(self.tasks_per_node))
        per_node = (
            f"{counts[0]} per node"
            if len(counts) == 1
            else f"{'/'.join(map(str, self.tasks_per_node))} tasks"
        )
        gpus = f", GPUs {','.join(self.gpus)}" if self.gpus else ""
        return (
            f"SLURM job {self.job_id or '?'} step: {sum(self.tasks_per_node)} tasks on nodes "
            f"{','.join(self.nodes)} ({per_node}), ports from {self.port}; this is task {self.rank}"
            f"{' (the chief)' if self.rank == 0 else ''}{gpus}"
        )


def step_tasks() -> int:
    """The tasks of the SLURM job step this process runs in (`SLURM_STEP_NUM_TASKS`), 0 outside a step.

    A job's own `SLURM_NTASKS` does not count: a program started in the batch
    script without `srun` is one process, whatever the job asked for.

    Raises:
        ValueError: `SLURM_STEP_NUM_TASKS` is not a positive integer.
    """
    text = os.environ.get("SLURM_STEP_NUM_TASKS")
    if text is None:
        return 0
    return _positive("SLURM_STEP_NUM_TASKS", text, 1)


def read_step(*, port: int | None = None, use_gpu: bool = False) -> SlurmStep:
    """Reads the cluster of the SLURM job step this task runs in.

    The tasks are numbered as `srun` numbers them with its default (block)
    distribution: the nodes in `SLURM_STEP_NODELIST`'s order, each node's
    tasks on consecutive ports from `port`. With `use_gpu`, a node's visible GPUs
    (`CUDA_VISIBLE_DEVICES`, else `nvidia-smi`) are split
    evenly among its tasks, as TensorFlow's resolver does, unless SLURM bound
    GPUs to each task (`--gpus-per-task`, `SLURM_GPUS_PER_TASK`): then each
    task keeps the ones it sees.

    Args:
        port: The first port of each node; None: `TFTRAIN_SLURM_PORT`, else 8888.
        use_gpu: Give each task its share of the node's GPUs.

    Returns:
        The `SlurmStep`; its `gpus` are what `CUDA_VISIBLE_DEVICES` must
        become for this task (None: leave it).

    Raises:
        ValueError: a SLURM variable is missing or malformed, or the node has
            fewer GPUs than tasks.
    """
    environ = os.environ
    expand_hostlist, expand_tasks_per_node, _ = tf_internals.slurm_host_lists()
    missing = [name for name in _STEP_VARIABLES if not environ.get(name)]
    if missing:
        raise ValueError(
            f"Invalid SLURM environment: {', '.join(missing)} unset. Received: "
            f"{ {name: environ.get(name) for name in _STEP_VARIABLES} }. Expected the variables `srun` sets in "
            "each task of a job step (launch the program with `srun`), or a TF_CONFIG."
        )
    num_tasks = _positive("SLURM_STEP_NUM_TASKS", environ["SLURM_STEP_NUM_TASKS"], 1)
    rank = _positive("SLURM_PROCID", environ["SLURM_PROCID"], 0)
    first_port = _port(port, environ)
    nodes = _expanded("SLURM_STEP_NODELIST", expand_hostlist, "a SLURM host list such as 'node[01-04],gpu7'")
    counts = _expanded("SLURM_STEP_TASKS_PER_NODE", expand_tasks_per_node, "tasks per node such as '2(x3),1'")
    if len(counts) != len(nodes) or len(set(nodes)) != len(nodes) or sum(counts) != num_tasks or rank >= num_tasks:
        raise ValueError(
            "Invalid SLURM environment: the step's variables disagree. Received: "
            f"SLURM_STEP_NODELIST={environ['SLURM_STEP_NODELIST']!r} ({len(nodes)} nodes), "
            f"SLURM_STEP_TASKS_PER_NODE={environ['SLURM_STEP_TASKS_PER_NODE']!r} ({sum(counts)} tasks on "
            f"{len(counts)} nodes), SLURM_STEP_NUM_TASKS={num_tasks}, SLURM_PROCID={rank}. Expected a count of "
            "tasks for each distinct node, summing to SLURM_STEP_NUM_TASKS, and SLURM_PROCID below it."
        )
    most = max(counts)
    visible = _visible() if use_gpu else []
    bound = use_gpu and bool(environ.get("SLURM_GPUS_PER_TASK"))
    per_task = len(visible) // most if use_gpu and not bound else 0
    if use_gpu and visible and not bound and per_task == 0:
        raise ValueError(
            f"Invalid SLURM job for use_gpu=True: {len(visible)} GPU(s) on the node for {most} tasks "
            f"(CUDA_VISIBLE_DEVICES={','.join(visible)!r}). Expected at least one GPU per task: ask for "
            "`--gpus-per-task`, or as many tasks per node as GPUs (`--ntasks-per-node`)."
        )
    places = [(host, local) for host, count in zip(nodes, counts, strict=True) for local in range(count)]
    local = places[rank][1]  # this task's place on its node
    gpus = tuple(visible[local * per_task : (local + 1) * per_task]) if per_task else None
    workers = [f"{host}:{first_port + local}" for host, local in places]
    return SlurmStep(
        config={"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}},
        job_id=environ.get("SLURM_JOB_ID"),
        nodes=tuple(nodes),
        tasks_per_node=tuple(counts),
        rank=rank,
        port=first_port,
        gpus=gpus,
    )


def _positive(name: str, text: str, minimum: int) -> int:
    if not text.strip().isdigit() or int(text) < minimum:
        raise ValueError(
            f"Invalid SLURM environment variable `{name}`. Received: {name}={text!r}. Expected an integer >= {minimum}."
        )
    return int(text)


def _port(port: int | None, environ: Any) -> int:
    if port is None:
        return check_port(PORT_VARIABLE, environ.get(PORT_VARIABLE, str(DEFAULT_PORT)), variable=True)
    return port  # checked by `setup_strategy`


def _expanded(name: str, expand: Any, expected: str) -> list[Any]:
    """A SLURM list variable expanded by TensorFlow's helper; a ValueError naming the variable where malformed."""
    text = os.environ[name]
    try:
        return expand(text)
    except ValueError as error:
        raise ValueError(
            f"Invalid SLURM environment variable `{name}`. Received: {name}={text!r}. Expected {expected} ({error})."
        ) from None


def _visible() -> list[str]:
    """The node's GPUs as CUDA_VISIBLE_DEVICES entries (from `nvidia-smi` where it is unset; none found: [])."""
    text = os.environ.get("CUDA_VISIBLE_DEVICES")
    if text is not None:
        return [entry.strip() for entry in text.split(",") if entry.strip()]
    try:
        return [str(index) for index in range(tf_internals.slurm_host_lists()[2]())]
    except (OSError, RuntimeError):  # no nvidia-smi: no GPU (setup_strategy warns that it trains on the CPU)
        return []


def requeue(*, timeout_s: float = REQUEUE_TIMEOUT_S) -> bool:
    """Puts this SLURM job back in the queue (`scontrol requeue $SLURM_JOB_ID`); says in one line how it went.

    Never raises for a failed requeue and never waits longer than
    `timeout_s`: no `SLURM_JOB_ID`, no `scontrol`, a non-zero exit or a
    timeout is warned of in one line; success is logged on the `tftrain`
    logger. SLURM then stops the job (SIGTERM to its tasks) and starts it
    again when it is scheduled; the job needs `--requeue` or a cluster that
    allows requeueing.

    Args:
        timeout_s: Seconds to wait for `scontrol`.

    Returns:
        Whether `scontrol` accepted the requeue.
    """
    job_id = os.environ.get("SLURM_JOB_ID")
    problem = None
    if not job_id:
        problem = "this process is in no SLURM job (SLURM_JOB_ID is unset)"
    else:
        try:
            done = subprocess.run(
                ["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=timeout_s,
                check=False,
            )  # fmt: skip
            if done.returncode != 0:
                said = " ".join((done.stderr or done.stdout).split())[:300]
                problem = f"`scontrol requeue {job_id}` exited with {done.returncode}: {said or 'no output'}"
        except FileNotFoundError:
            problem = "`scontrol` is not on PATH"
        except subprocess.TimeoutExpired:
            problem = f"`scontrol requeue {job_id}` did not answer within {timeout_s} s"
        except OSError as error:
            problem = f"`scontrol` could not run ({error})"
    if problem is not None:
        message = f"tftrain: the SLURM job was not requeued: {problem}; resubmit it to resume from its last checkpoint."
        warnings.warn(message, stacklevel=2)  # one line: not also logged
        return False
    _LOGGER.info(
        "tftrain: requeued SLURM job %s (scontrol requeue %s); it resumes when it starts again.",
        job_id,
        job_id,
    )
    return True
