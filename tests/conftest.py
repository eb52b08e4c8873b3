"""Shared test setup: quiet TensorFlow, tiny data, fresh seeds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from helpers import ENGINES  # noqa: E402
from tensorflow.python.framework import config as _tf_config  # noqa: E402


@pytest.fixture(params=sorted(ENGINES), ids=sorted(ENGINES))
def engine(request):
    """Trainer keyword arguments for each engine."""
    return ENGINES[request.param]


@pytest.fixture
def tiny_data():
    """(x, y): 50 examples of 6 features, 3 classes, learnable."""
    rng = np.random.RandomState(0)
    x = rng.rand(50, 6).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    return x, y


@pytest.fixture
def tiny_dataset(tiny_data):
    """The tiny data as a dataset of batches of 8 (the last batch has 2)."""
    return tf.data.Dataset.from_tensor_slices(tiny_data).batch(8)


@pytest.fixture(scope="module")
def deterministic():
    """Op determinism for the fit tests (process-global: switched back off afterwards)."""
    was_enabled = _tf_config.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    yield
    if not was_enabled:
        _tf_config.disable_op_determinism()


# The test tiers (setup.cfg registers the markers; README.md's Development section and
# docs/install.md say who runs which). A test function's representative case: of its parametrized
# cases the one on the default engine ("graph") where it has one, else its first.
# `floor`: what the oldest TensorFlow/Keras pair checks (docs/install.md, "Why these floors"): in
# full, the comparisons against Keras itself, distribution, mixed precision and the version shims
# (_FLOOR); every other test function's representative case. .ci/oldest-pair runs it.
# `fast`: the quick tier, a contributor's check (`pytest -n 2 -m fast`): the representative cases,
# less the programs', the benchmark's and the guides' tests (_NOT_FAST), the tests that share a
# module fixture of their file (jobs run once for several tests) and the functions that took over
# 10 s on 2 busy cores (_SLOW, `pytest --durations`: subprocess jobs, kills and resumes, two replicas).
_FLOOR = (
    "tests/compat/",
    "tests/fit_inputs/",
    "tests/test_trainer_parity.py",
    "tests/test_optimizer_features_parity.py",
    "tests/test_callbacks.py",
    "tests/test_distribute.py",
    "tests/test_trainer_mirrored.py",
    "tests/test_trainer_distributed_dataset.py",
    "tests/test_trainer_multiworker.py",
    "tests/test_precision.py",
    "tests/test_trainer_precision.py",
)
_NOT_FAST = (
    "tests/examples/",
    "tests/bench/",
    "tests/test_docs_guides.py",
    "tests/test_trainer_multiworker.py",
)
_SLOW = frozenset(
    {
        "tests/checkpoint/test_checkpoint_write_errors.py::test_a_fit_whose_save_fails_says_so_and_a_rerun_resumes_exactly",
        "tests/checkpoint/test_checkpoint_write_errors.py::test_a_full_disk_during_a_save_keeps_the_last_checkpoint_and_a_rerun_resumes_exactly",
        "tests/checkpoint/test_checkpointer.py::test_a_checkpoint_from_before_data_modes_resumes_its_iterator_exactly",
        "tests/checkpoint/test_checkpointer.py::test_resume_at_an_epoch_boundary_matches_an_uninterrupted_run",
        "tests/checkpoint/test_checkpointer.py::test_resume_from_a_chosen_checkpoint_continues_that_run_exactly",
        "tests/checkpoint/test_checkpointer.py::test_resume_from_refuses_what_it_cannot_use_before_any_step",
        "tests/checkpoint/test_checkpointer.py::test_the_best_checkpoint_follows_validations_every_n_steps",
        "tests/checkpoint/test_checkpointer.py::test_the_best_epoch_is_kept_apart_and_restore_model_loads_it",
        "tests/checkpoint/test_checkpointer.py::test_uncheckpointable_iterator_resumes_after_an_epoch_end_at_the_next_pass",
        "tests/checkpoint/test_checkpointer.py::test_uncheckpointable_iterator_warns_and_resume_skips_seen_batches",
        "tests/checkpoint/test_native_log.py::test_fit_with_checkpoints_prints_no_save_info_line",
        "tests/checkpoint/test_run_record.py::test_an_unchanged_call_has_no_differences",
        "tests/checkpoint/test_run_record.py::test_orders_recorded_from_several_threads_leave_tensorflows_shuffle_as_it_was",
        "tests/checkpoint/test_state.py::test_a_checkpoint_holding_the_services_states_under_timing_resumes_with_them",
        "tests/checkpoint/test_warm_start.py::test_fit_trains_from_the_warm_start_and_a_rerun_resumes_its_own_checkpoint",
        "tests/checkpoint/test_warm_start.py::test_the_encoder_is_loaded_bit_for_bit_and_the_new_head_is_untouched",
        "tests/engine/test_flops.py::test_mirrored_strategy_counts_every_replica",
        "tests/loops/test_dry_run.py::test_a_fit_after_a_check_of_shuffled_arrays_reads_the_same_order",
        "tests/loops/test_dry_run.py::test_a_nonfinite_first_loss_is_named_train",
        "tests/loops/test_dry_run.py::test_a_resumed_model_dir_is_untouched_and_resumes_as_before",
        "tests/loops/test_dry_run.py::test_a_validation_bug_is_named_and_a_fit_afterwards_is_bit_identical",
        "tests/loops/test_dry_run.py::test_custom_loop_style_state_is_put_back",
        "tests/loops/test_dry_run.py::test_each_stage_runs_and_is_timed_and_the_state_is_put_back",
        "tests/loops/test_dry_run.py::test_numpys_global_random_state_is_put_back",
        "tests/loops/test_dry_run.py::test_under_mirrored_strategy_on_two_cpus",
        "tests/loops/test_fit_loop.py::test_an_epoch_cut_by_the_budget_validates_without_losing_its_training_metrics",
        "tests/loops/test_lr_sweep.py::test_under_mirrored_strategy_on_two_cpus",
        "tests/loops/test_training_run.py::test_a_killed_step_budget_run_finishes_exactly",
        "tests/loops/test_training_run.py::test_no_handler_without_model_dir_or_with_no_signals",
        "tests/services/test_hparams.py::test_two_runs_under_one_log_root_are_two_rows_of_a_real_tensorboards_hparams_tab",
        "tests/services/test_loss_recovery.py::test_a_rollback_shows_in_the_progress_output",
        "tests/services/test_loss_recovery.py::test_a_run_killed_between_rollbacks_and_rerun_ends_bit_identical",
        "tests/test_distribute.py::test_num_cpu_devices_splits_the_cpu_into_mirrored_replicas",
        "tests/test_ema.py::test_rollback_and_averages_under_a_mirrored_strategy",
        "tests/test_evaluation.py::test_evaluates_alongside_a_training_process",
        "tests/test_flags.py::test_the_example_program_trains_from_a_flagfile_and_refuses_a_bad_flag",
        "tests/test_optimizer_features_parity.py::test_ema_and_accumulation_under_a_mirrored_strategy_behave_as_under_fit",
        "tests/test_trainer_distributed_dataset.py::test_distributed_datasets_under_two_replicas_match_model_fit_and_resume",
        "tests/test_trainer_mirrored.py::test_mirrored_two_replicas_match_one_device_and_resume",
        "tests/test_trainer_resume.py::test_a_kill_while_a_new_batch_size_is_converted_reruns_bit_identical",
        "tests/test_trainer_resume.py::test_killed_job_resumes_bit_identical",
    }
)


def _uses_a_module_fixture_of(item, path: str) -> bool:
    """Whether the test uses a module-scoped fixture its own file defines (one trained model, a job run once).

    Under `pytest -n 2 --dist loadgroup` such a file's tests share one process (its `xdist_group`), so
    the fixture is made once, and the two-worker jobs of tests/test_trainer_multiworker.py run one at a time.
    """
    for definitions in item._fixtureinfo.name2fixturedefs.values():
        if definitions and definitions[-1].scope != "function" and definitions[-1].baseid == path:
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups marked here
def pytest_collection_modifyitems(config, items):
    """Marks the `floor` and `fast` tiers (above) and groups the tests that share a module fixture."""
    representatives, shared = {}, set()
    for item in items:
        path = item.nodeid.split("::")[0]
        if path.startswith(_FLOOR):
            item.add_marker(pytest.mark.floor)
        if _uses_a_module_fixture_of(item, path):
            item.add_marker(pytest.mark.xdist_group(path))
            shared.add(item.nodeid.split("[")[0])
        function = item.nodeid.split("[")[0]
        params = getattr(getattr(item, "callspec", None), "params", {})
        if function not in representatives or params.get("engine") == "graph":
            representatives[function] = item
    for function, item in representatives.items():
        item.add_marker(pytest.mark.floor)
        path = function.split("::")[0]
        if not path.startswith(_NOT_FAST) and function not in _SLOW and function not in shared:
            item.add_marker(pytest.mark.fast)
