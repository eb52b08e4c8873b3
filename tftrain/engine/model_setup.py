"""What the Trainer checks and builds on a model before its first step.

The default steps (Keras's and `CustomModel`'s) need a compiled model; data
must fit the model and the strategy; variables are created before the first
trace, as `model.fit` creates them.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf

from tftrain import distribute, precision
from tftrain.arguments import check_jit_compile
from tftrain.compat import keras_internals
from tftrain.engine import strategy_checks
from tftrain.fit_inputs import fit_checks, inputs
from tftrain.model import CustomModel

MODEL_STEPS = {"train": "train_step", "eval": "test_step", "predict": "predict_step"}
"""The model's step that the Trainer's default step of each kind of call (train, eval, predict) calls."""

_DEFAULT_MODEL_STEPS = {
    "train_step": (keras.Model.train_step, CustomModel.train_step),
    "test_step": (keras.Model.test_step, CustomModel.test_step),
}


def uses_default_step(model: keras.Model, name: str) -> bool:
    """Whether the model's `name` step is Keras's (or `CustomModel`'s) own, not the user's."""
    return getattr(type(model), name) in _DEFAULT_MODEL_STEPS[name]


_CUSTOM_MODEL_PIECES = (
    "unpack_batch",
    "forward",
    "compute_loss",
    "track_loss",
    "compute_gradients",
    "apply_gradients",
    "compute_metrics",
)


def model_step_is_user_code(model: keras.Model, name: str) -> bool:
    """Whether the model's `name` step runs code of the user's, which the Trainer converts with AutoGraph.

    True where the model's class overrides Keras's step, or runs
    `CustomModel`'s default step with one of its pieces (`forward`,
    `compute_loss`, ...) overridden: converting the step reaches them.
    Keras's own steps and an unchanged `CustomModel`'s are library code,
    left unconverted (converting `CustomModel`'s took about 0.3 s of a first
    `fit`).
    """
    model_class = type(model)
    step = getattr(model_class, name)
    if step is getattr(keras.Model, name):
        return False
    if step is getattr(CustomModel, name):
        return any(
            getattr(model_class, piece) is not getattr(CustomModel, piece) for piece in _CUSTOM_MODEL_PIECES
        )
    return True


def check_compiled_for(model: keras.Model, model_step: str, trainer_step: str) -> None:
    """Raises unless a model whose default `model_step` runs is compiled (with an optimizer to train)."""
    if not uses_default_step(model, model_step):
        return
    if not model.compiled:
        raise ValueError(
            f"The model is not compiled, and its default `{model_step}` needs a loss"
            f"{' and an optimizer' if model_step == 'train_step' else ''}. Pass "
            "`optimizer=` and `loss=` to `tftrain.Trainer(...)`, call `model.compile(...)`, "
            f"or override `{model_step}` (tftrain.CustomModel) or `Trainer.{trainer_step}`."
        )
    if model_step == "train_step" and getattr(model, "optimizer", None) is None:
        raise ValueError(
            "The model was compiled without an optimizer, and its default `train_step` "
            "needs one. Pass `optimizer=` to `tftrain.Trainer(...)` or to `model.compile`."
        )


def check_data(
    model: keras.Model,
    dataset: tf.data.Dataset,
    argument: str,
    strategy: tf.distribute.Strategy,
    *,
    default_step: bool,
) -> None:
    """Data checks before any step: batched, targets where the loss needs them, an even global batch."""
    spec = dataset.element_spec
    fit_checks.check_batched_for_model(model, spec, argument)
    if default_step:
        fit_checks.check_targets(model, spec, argument)
    if strategy.num_replicas_in_sync > 1:  # one replica takes any batch
        strategy_checks.check_global_batch(spec, strategy, argument)


def build_variables(
    model: keras.Model,
    dataset: tf.data.Dataset,
    strategy: tf.distribute.Strategy,
    *,
    default_train_step: bool,
    checked: Mapping[int, weakref.ref] | None = None,
) -> None:
    """Creates the model's, metrics' and optimizer's variables before the first trace.

    Creating them inside the first `tf.function` call would trace it twice.
    Keras's own symbolic build (what `fit` uses) does this for compiled
    models with default steps and dense inputs; otherwise the optimizer is
    built if it can be (and the first trace creates the rest).

    The variables it creates, in `strategy`'s scope, belong to it; the
    model's and its optimizer's are checked (`check_model_in_scope`) where
    one that existed before is not among `checked` (`prepare_model`'s): a
    recompile's new optimizer is checked, whether built or not.

    Raises:
        ValueError: the model's variables do not belong to `strategy`.
    """
    spec: Any = inputs.optionals_to_none(dataset.element_spec)
    dense = all(type(leaf) is tf.TensorSpec for leaf in tf.nest.flatten(spec))
    if any(_unchecked(checked or {}, key, variable) for key, variable in _variables(model).items()):
        # Before the build (what it creates is in the scope): a recompile's optimizer, built or not, too.
        strategy_checks.check_model_in_scope(model, strategy, unbuilt_optimizer=True)
    with strategy.scope():
        if default_train_step and model.compiled and dense:
            keras_internals.symbolic_build(model, spec)
        elif model.built and getattr(model, "optimizer", None) is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)


def checked_variables(model: keras.Model) -> dict[int, weakref.ref]:
    """The model's and its optimizer's variables (built or not), as weak references by id.

    An id may be reused by a new variable once the old one is freed (a
    recompile's new optimizer); a weak reference to the old one then no
    longer returns the new variable.
    """
    return {key: weakref.ref(variable) for key, variable in _variables(model).items()}


def _variables(model: keras.Model) -> dict[int, Any]:
    optimizer = getattr(model, "optimizer", None)  # a Keras optimizer has variables before its build
    return {id(v): v for v in [*(model.variables if model.built else []), *getattr(optimizer, "variables", [])]}


def _unchecked(checked: Mapping[int, weakref.ref], key: int, variable: Any) -> bool:
    reference = checked.get(key)
    return reference is None or reference() is not variable


def resolve_jit_compile(
    jit_compile: bool | str,
    model: keras.Model,
    strategy: tf.distribute.Strategy,
    *,
    use_tf_function: bool,
) -> bool:
    """The Trainer's `jit_compile` as a bool: `"auto"` resolved as `model.compile(jit_compile="auto")` resolves it.

    `"auto"` is off for an eager Trainer (`use_tf_function=False`, as
    `compile(run_eagerly=True)`), off under a `tf.distribute` strategy other
    than the default (the Trainer's, or the model's), and otherwise what
    Keras's own resolution gives for `model`: off on a machine without a GPU
    or TPU, off where a layer does not support XLA or op determinism is on.
    A Trainer subclass's own `train_step` is not inspected (Keras inspects
    the model's layers only).

    Args:
        jit_compile: True, False or `"auto"`.
        model: The model whose layers decide `"auto"`.
        strategy: The strategy the steps run under.
        use_tf_function: Whether the steps run in `tf.function`.

    Returns:
        Whether the steps are compiled with XLA.

    Raises:
        ValueError: `jit_compile` is not True, False or `"auto"`.
    """
    jit_compile = check_jit_compile(jit_compile)
    if jit_compile != "auto":
        return jit_compile
    default_strategy = distribute.is_default_strategy(strategy)
    if not use_tf_function or not default_strategy:
        return False
    return keras_internals.resolve_auto_jit_compile(model)


def prepare_model(
    model: keras.Model,
    strategy: tf.distribute.Strategy,
    *,
    optimizer: Any = None,
    loss: Any = None,
    metrics: Any = None,
    mixed_precision: str | None = None,
) -> dict[int, weakref.ref]:
    """Readies a model for the Trainer under `strategy`: its dtype policy, `compile`, and an optimizer of the strategy.

    The model is compiled with `optimizer`, `loss` and `metrics` if any is
    given (else used as compiled); an optimizer created outside the
    strategy's scope that holds no state yet is recreated in it; with
    `"mixed_float16"` the optimizer is wrapped in a `LossScaleOptimizer`.

    Returns:
        The variables checked or made in the strategy's scope here
        (`checked_variables`): a fit's `build_variables` checks none of them
        again.

    Raises:
        ValueError: the model's variables do not belong to `strategy`.
    """
    strategy_checks.check_model_in_scope(model, strategy)
    with strategy.scope():  # a LossScaleOptimizer creates variables
        precision.apply_policy(model, mixed_precision)
        if optimizer is not None or loss is not None or metrics is not None:
            optimizer = strategy_checks.adopt_optimizer(optimizer, strategy)
            model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
        elif getattr(model, "optimizer", None) is not None:
            model.optimizer = strategy_checks.adopt_optimizer(model.optimizer, strategy)
        precision.wrap_model_optimizer(model, mixed_precision)
    # The model's checked above; its optimizer checked (built), or holding no state and made in the scope.
    return checked_variables(model)
