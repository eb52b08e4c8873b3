"""Checks that a model and its data fit the strategy they are about to train under.

Run before the first step, so a misplaced model or an uneven global batch is a
clear error naming the fix, not a failure deep inside TensorFlow or a silently
wrong average.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tftrain.distribute import describe, is_default_strategy


def check_model_in_scope(model: Any, strategy: tf.distribute.Strategy, *, unbuilt_optimizer: bool = False) -> None:
    """Raises if the model's variables do not belong to `strategy`.

    Variables created outside the strategy's scope live on one device only;
    a step on every replica would then update one copy (or fail deep inside
    TensorFlow). And a model built in a strategy's scope cannot train under
    another one.

    Args:
        model: A (built or unbuilt) `keras.Model`.
        strategy: The strategy the model is about to train under.
        unbuilt_optimizer: Also check the variables an optimizer not built
            yet holds (a Keras optimizer makes its step counter when made);
            else they are not checked (`adopt_optimizer` may recreate it).

    Raises:
        ValueError: naming the first variable that does not belong, and the fix.
    """
    default = is_default_strategy(strategy)
    for variable in _model_variables(model, unbuilt_optimizer):
        value = getattr(variable, "value", variable)
        distributed = isinstance(value, tf.distribute.DistributedValues)
        if default and distributed:
            raise ValueError(
                f"The model's variable `{variable.path}` was created under a distribution strategy, "
                "but the Trainer got none. Expected `strategy=` the strategy whose scope built the "
                "model: `tftrain.Trainer(model, ..., strategy=strategy)`."
            )
        if not default and not strategy.extended.variable_created_in_scope(value):
            raise ValueError(
                f"The model's variable `{variable.path}` was not created in the scope of the "
                f"Trainer's {describe(strategy)}, so it would not be mirrored on the replicas. "
                "Expected the model (and its optimizer, if built) created under "
                "`with strategy.scope():`, e.g. `with strategy.scope(): model = make_model()`."
            )


def _model_variables(model: Any, unbuilt_optimizer: bool) -> list[Any]:
    variables = list(model.variables) if model.built else []
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and (unbuilt_optimizer or getattr(optimizer, "built", False)):
        variables += list(optimizer.variables)
    return variables


def check_global_batch(element_spec: Any, strategy: tf.distribute.Strategy, argument: str) -> None:
    """Raises if a dataset's static batch size cannot be split evenly over the replicas.

    An uneven split gives replicas different batch sizes, so losses averaged
    per replica no longer average the global batch (and TPUs need equal shapes).
    A batch size unknown until run time (a possibly short last batch) is not checked.

    Args:
        element_spec: The batched dataset's `element_spec`.
        strategy: The strategy the data is distributed over.
        argument: The argument's name, for the error.

    Raises:
        ValueError: naming the batch size, the replicas and the fix.
    """
    replicas = strategy.num_replicas_in_sync
    if replicas <= 1:
        return
    for spec in tf.nest.flatten(element_spec):
        shape = getattr(spec, "shape", None)
        if shape is None or shape.rank in (None, 0) or shape[0] is None:
            continue
        if shape[0] % replicas:
            raise ValueError(
                f"Invalid batch size in `{argument}`. Received: global batches of {shape[0]} examples "
                f"for {replicas} replicas. Expected a global batch size divisible by {replicas}, so each "
                f"replica gets the same number of examples: batch by a multiple of {replicas} "
                f"(e.g. {shape[0] - shape[0] % replicas or replicas})."
            )
        return


def _outside_scope(variable: Any, strategy: tf.distribute.Strategy) -> bool:
    return not strategy.extended.variable_created_in_scope(getattr(variable, "value", variable))


def adopt_optimizer(optimizer: Any, strategy: tf.distribute.Strategy) -> Any:
    """An optimizer instance usable under `strategy`: itself, or its twin made in the strategy's scope.

    `model.fit` trains with an optimizer created outside the strategy's scope.
    A Keras optimizer creates its step counter (and learning-rate variable)
    when constructed, so such an optimizer's variables are not mirrored. While
    it holds no state yet (not built, no step taken), it is recreated from
    its config inside the scope, which loses nothing; the caller's object is
    then not the one that trains (read `trainer.optimizer`).

    Args:
        optimizer: A Keras optimizer, a name, or None.
        strategy: The strategy training runs under.

    Returns:
        The optimizer to train with.

    Raises:
        ValueError: the optimizer already holds state outside the scope, or
            cannot be recreated from its config (e.g. an unregistered custom
            learning-rate schedule).
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer
    default = is_default_strategy(strategy)
    if default or not any(_outside_scope(v, strategy) for v in optimizer.variables):
        return optimizer
    where = (
        f"Optimizer {optimizer.name!r} was created outside the scope of the Trainer's {describe(strategy)}"
    )
    fix = 'Create the optimizer inside `with strategy.scope():`, or pass its name (e.g. optimizer="adam").'
    if optimizer.built or int(optimizer.iterations.numpy()) != 0:
        raise ValueError(
            f"{where} and already holds state (it has taken {int(optimizer.iterations.numpy())} steps"
            f"{' and built its slot variables' if optimizer.built else ''}), which cannot be moved onto "
            f"the replicas. {fix}"
        )
    try:
        with strategy.scope():
            return type(optimizer).from_config(optimizer.get_config())
    except Exception as error:  # any failure of a user's config round trip
        raise ValueError(
            f"{where}, and recreating it in the scope from its config failed: {error}. {fix}"
        ) from error
