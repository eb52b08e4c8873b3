"""absl flags for a program's Trainer: every option, `fit`'s budget and the strategy, defined from their own definitions.

One call in a program's module defines a flag for each `tftrain.Trainer`
option, named as the argument, with its default, its type (from the
argument's annotation) and its help (from the argument's docstring): no
second list to keep in step. Another call turns the parsed flags into the
Trainer's keyword arguments. A bad value fails when the flags are parsed,
with the Trainer's own check and message (`tftrain.trainer.check_options`),
so a typo is found before a model is built, not hours into a run. absl's
`--flagfile` reads any of them from a file.

Example:
    ```python
    from absl import app

    import tftrain
    from tftrain import flags

    flags.define_trainer_flags()

    def main(argv):
        strategy = flags.strategy_from_flags()
        with strategy.scope():
            model = make_model()
        trainer = tftrain.Trainer(model, "adam", "mse", strategy=strategy, **flags.trainer_kwargs())
        trainer.fit(x, y, **flags.fit_kwargs())

    app.run(main)
    ```

Library code still takes plain arguments: only a program's `main` reads flags.
"""

from __future__ import annotations

import inspect
import re
import shlex
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from absl import flags as absl_flags

from tftrain import distribute
from tftrain.arguments import check_int
from tftrain.checkpoint.run_record import COMMAND_LINE, TRAINER_FLAGS_PREFIX
from tftrain.trainer import OPTION_NAMES, Trainer, check_options

__all__ = [
    "BUDGET_NAMES",
    "STRATEGY_NAMES",
    "define_trainer_flags",
    "fit_kwargs",
    "program_hparams",
    "strategy_from_flags",
    "trainer_kwargs",
]

BUDGET_NAMES = ("epochs", "total_steps", "validation_every_steps")
"""`Trainer.fit`'s arguments that set a run's budget, defined as flags too."""

STRATEGY_NAMES = ("use_gpu", "use_tpu", "tpu", "num_cpu_devices")
"""`tftrain.distribute.setup_strategy`'s arguments defined as flags (TF_CONFIG is read from the environment)."""


def _arg_help(function: Any) -> dict[str, str]:
    """Each argument's text in a Google-style docstring's `Args:` section, whitespace collapsed."""
    doc = inspect.getdoc(function) or ""
    section = re.search(r"^Args:\n(.*?)(?:^\S|\Z)", doc, flags=re.MULTILINE | re.DOTALL)
    if section is None:
        return {}
    helps: dict[str, str] = {}
    name = None
    for line in section.group(1).splitlines():
        entry = re.match(r"^    (\w+)(?: \([^)]*\))?: (.*)$", line)
        if entry:
            name, text = entry.groups()
            helps[name] = text
        elif name is not None and line.strip():
            helps[name] += " " + line.strip()
    # The Trainer's docstring groups arguments by the options object that holds them: not a flag's help.
    grouping = re.compile(r"\s*Each of `\w+` to here is a field of\s+`[\w.]+`(, which says exactly what it does)?\.")
    return {name: grouping.sub("", text) for name, text in helps.items()}


def _parse_bool_or_auto(raw: Any) -> Any:
    text = str(raw).strip().lower()
    return {"true": True, "false": False, "auto": "auto"}.get(text, raw)


def _parse_int_or_auto(raw: Any) -> Any:
    text = str(raw).strip()
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def _parse_int_pair(raw: Any) -> Any:
    if raw is None:
        return None
    parts = [str(part).strip() for part in raw]
    return tuple(int(part) for part in parts) if all(re.fullmatch(r"-?\d+", p) for p in parts) else tuple(parts)


def _parse_signals(raw: Any) -> Any:
    return tuple(int(part) if str(part).isdigit() else str(part).strip() for part in raw or ())


# How a flag of each annotation is defined and read: (absl's DEFINE function, flag default from
# the argument's default, value from the parsed flag).
_KINDS: dict[str, tuple[Callable[..., Any], Callable[[Any], Any], Callable[[Any], Any]]] = {
    "bool": (absl_flags.DEFINE_boolean, lambda default: default, lambda raw: raw),
    "int": (absl_flags.DEFINE_integer, lambda default: default, lambda raw: raw),
    "int | None": (absl_flags.DEFINE_integer, lambda default: default, lambda raw: raw),
    "float": (absl_flags.DEFINE_float, lambda default: default, lambda raw: raw),
    "float | None": (absl_flags.DEFINE_float, lambda default: default, lambda raw: raw),
    "str": (absl_flags.DEFINE_string, lambda default: default, lambda raw: raw),
    "str | None": (absl_flags.DEFINE_string, lambda default: default, lambda raw: raw),
    "bool | str": (absl_flags.DEFINE_string, lambda default: str(default).lower(), _parse_bool_or_auto),
    "int | str": (absl_flags.DEFINE_string, str, _parse_int_or_auto),
    "tuple[int, int] | None": (absl_flags.DEFINE_list, lambda default: default, _parse_int_pair),
    # `preemption_signals`: signal names or numbers.
    "Any": (
        absl_flags.DEFINE_list,
        lambda default: [signal.Signals(number).name for number in default],
        _parse_signals,
    ),
}


def _parameters(function: Any, names: Iterable[str]) -> dict[str, inspect.Parameter]:
    parameters = inspect.signature(function).parameters
    return {name: parameters[name] for name in names}


def _groups() -> dict[str, tuple[Any, dict[str, inspect.Parameter]]]:
    """The flags' sources: the Trainer's options, `fit`'s budget, the strategy's setup; each with its docstring's owner."""
    return {
        "trainer": (Trainer, _parameters(Trainer.__init__, OPTION_NAMES)),
        "budget": (Trainer.fit, _parameters(Trainer.fit, BUDGET_NAMES)),
        "strategy": (distribute.setup_strategy, _parameters(distribute.setup_strategy, STRATEGY_NAMES)),
    }


def _kind(parameter: inspect.Parameter) -> tuple[Callable[..., Any], Callable[[Any], Any], Callable[[Any], Any]]:
    return _KINDS[str(parameter.annotation)]


def define_trainer_flags(
    *,
    prefix: str = "",
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    flag_values: absl_flags.FlagValues = absl_flags.FLAGS,
    program_values: Callable[[], Mapping[str, Any]] | None = None,
) -> tuple[str, ...]:
    """Defines an absl flag for each `Trainer` option, `fit`'s budget and the strategy's setup.

    Each flag is named as its argument (after `prefix`), with the
    argument's default, type and docstring; `--helpfull` lists them under
    this module. A bad value (or combination) fails when the flags are
    parsed, with the message `tftrain.Trainer(...)` would give
    (`tftrain.trainer.check_options`).

    Args:
        prefix: Put before each flag's name (e.g. `"trainer_"`), to keep
            clear of a program's own flags.
        only: Define only these (argument names); None: all of them
            (`tftrain.trainer.OPTION_NAMES`, `BUDGET_NAMES`, `STRATEGY_NAMES`).
        exclude: Argument names not to define (a program that sets them itself).
        flag_values: The registry to define them in (absl's global `FLAGS` by default).
        program_values: For a program that sets options of `exclude` itself,
            from flags of its own: returns those options' values (argument
            name -> value) when the flags are parsed, so that the check sees
            the options the Trainer will get (`--on_nonfinite=rollback` needs
            the program's `model_dir`), e.g.
            `lambda: {"model_dir": FLAGS["model_dir"].value}`.

    Returns:
        The names of the flags defined.

    Raises:
        ValueError: `only` or `exclude` names an argument that is none of these.
        absl.flags.DuplicateFlagError: the program already defines a flag of
            that name; the message names both flags and the way out
            (`exclude=` or `prefix=`). Nothing is defined then.
    """
    groups = _groups()
    known = [name for _, parameters in groups.values() for name in parameters]
    chosen = list(known if only is None else only)
    unknown = sorted(set(chosen) - set(known)) + sorted(set(exclude) - set(known))
    if unknown:
        raise ValueError(
            f"Invalid value for argument `only`/`exclude`. Received: names {unknown}, which are no Trainer "
            f"option, fit budget or strategy argument. Expected some of {known}."
        )
    chosen = [name for name in chosen if name not in set(exclude)]
    _check_no_clash(prefix, chosen, flag_values)
    defined = []
    for owner, parameters in groups.values():
        helps = _arg_help(owner)
        for name, parameter in parameters.items():
            if name not in chosen:
                continue
            define, flag_default, _ = _kind(parameter)
            help_text = helps.get(name, f"`{name}` of `tftrain.Trainer`.")
            define(prefix + name, flag_default(parameter.default), help_text, flag_values=flag_values)
            defined.append(prefix + name)
    _register_checks(prefix, tuple(defined), flag_values, program_values)
    return tuple(defined)


def _values(group: str, prefix: str, flag_values: absl_flags.FlagValues, raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """The arguments of one group that have flags, read as the arguments' types (`raw`: flag name -> value, else the parsed flags)."""
    _, parameters = _groups()[group]
    values = {}
    for name, parameter in parameters.items():
        flag = prefix + name
        if raw is not None:
            if flag in raw:
                values[name] = _kind(parameter)[2](raw[flag])
        elif flag in flag_values:
            values[name] = _kind(parameter)[2](getattr(flag_values, flag))  # absl's error if not parsed yet
    return values


def _check_no_clash(prefix: str, chosen: list[str], flag_values: absl_flags.FlagValues) -> None:
    """Refuses to define a flag the program (or another call) already defines, naming both and the way out."""
    clashes = [name for name in chosen if prefix + name in flag_values]
    if not clashes:
        return
    owners = ", ".join(
        f"--{prefix + name} (defined in {flag_values.find_module_defining_flag(prefix + name, 'an unknown module')})"
        for name in clashes
    )
    raise absl_flags.DuplicateFlagError(
        f"Cannot define tftrain's flags for the Trainer options {clashes}: the program already defines {owners}. "
        f"Expected flag names of their own. Pass `define_trainer_flags(exclude={clashes})` to keep the "
        "program's flags (give their values to the Trainer yourself, and to the check with "
        f"`program_values=`), or `prefix=\"trainer_\"` to define --trainer_{clashes[0]} beside them."
    )


def _blamed_flag(message: str, prefix: str, defined: tuple[str, ...]) -> str | None:
    """The defined flag whose argument the check's message names first (`name=` or `` `name` ``), or None."""
    found = []
    for flag in defined:
        name = re.escape(flag[len(prefix) :])
        match = re.search(rf"(?<![\w`])(`{name}`|{name}=)", message)
        if match:
            found.append((match.start(), flag))
    return min(found)[1] if found else None


def _register_checks(
    prefix: str,
    defined: tuple[str, ...],
    flag_values: absl_flags.FlagValues,
    program_values: Callable[[], Mapping[str, Any]] | None,
) -> None:
    """Checks the flags as the Trainer and `fit` check their arguments, when the flags are parsed.

    absl's message for a failed check starts with the flags it covers: each
    flag has a validator of its own that raises the check's error where the
    error names its argument first, so the message reads `flag --name=value:
    the reason`. An error that names none of them (a program's own value,
    through `program_values`) is raised by one validator over all of them.
    """
    if not defined:
        return
    checked: dict[str, Exception | None] = {}  # the values' repr -> the check's error: one check per parse

    def error_of() -> Exception | None:
        raw = {flag: flag_values[flag].value for flag in defined}
        key = repr(sorted(raw.items()))
        if key not in checked:
            checked.clear()
            checked[key] = _check_values(raw, prefix, flag_values, program_values)
        return checked[key]

    def check_blamed(flag: str | None) -> Callable[[Any], bool]:
        """A validator that raises the check's error where it blames `flag` (None: where it blames none)."""

        def check(_: Any) -> bool:
            error = error_of()
            if error is not None and _blamed_flag(str(error), prefix, defined) == flag:
                raise absl_flags.ValidationError(str(error)) from error
            return True

        return check

    for flag in defined:
        absl_flags.register_validator(flag, check_blamed(flag), flag_values=flag_values)
    absl_flags.register_multi_flags_validator(list(defined), check_blamed(None), flag_values=flag_values)


def _check_values(
    raw: dict[str, Any],
    prefix: str,
    flag_values: absl_flags.FlagValues,
    program_values: Callable[[], Mapping[str, Any]] | None,
) -> Exception | None:
    """The error the Trainer and `fit` raise for these flag values (and the program's), or None."""
    try:
        program = dict(program_values()) if program_values is not None else {}
        check_options(**{**program, **_values("trainer", prefix, flag_values, raw)})
        budget = _values("budget", prefix, flag_values, raw)
        if "epochs" in budget:
            check_int("epochs", budget["epochs"], 0)
        for name in ("total_steps", "validation_every_steps"):
            if name in budget:
                check_int(name, budget[name], optional=True)
    except (TypeError, ValueError) as error:
        return error
    return None


def trainer_kwargs(*, prefix: str = "", flag_values: absl_flags.FlagValues = absl_flags.FLAGS) -> dict[str, Any]:
    """The parsed flags as `Trainer` keyword arguments (those defined by `define_trainer_flags`).

    Where they give a `model_dir`, they also hold `hparams`: the program's
    flags and command line (`program_hparams`), recorded with the run and
    shown in TensorBoard's HParams tab.

    Example:
        `tftrain.Trainer(model, optimizer, loss, **flags.trainer_kwargs())`

    Raises:
        absl.flags.UnparsedFlagAccessError: the flags are not parsed yet (call it in `main`).
    """
    kwargs = _values("trainer", prefix, flag_values)
    if kwargs.get("model_dir"):
        kwargs["hparams"] = program_hparams(flag_values)
    return kwargs


# Flags that these packages define (absl's `--flagfile`, `--verbosity`, TensorFlow's own) are no program's.
_LIBRARY_PACKAGES = ("absl", "tensorflow", "keras", "tensorboard", "tensorflow_datasets")


def program_hparams(flag_values: absl_flags.FlagValues = absl_flags.FLAGS) -> dict[str, Any]:
    """The program's command line and the value of each of its flags, as `Trainer(hparams=...)` takes them.

    Every parsed flag is in it but those absl, TensorFlow, Keras,
    TensorBoard and tfds define. The program's own flags are under their
    names, with their values (a list flag is one comma-separated string);
    the flags `define_trainer_flags` defined are under
    `trainer.<argument>` (whatever their prefix), each as the Trainer or
    `fit` takes it (`trainer.steps_per_loop`: 8, `trainer.jit_compile`:
    False; a pair or a list of signals as one comma-separated string). A
    resume says which flag changed; the command line itself is recorded
    but not compared (its form changes with a flag's order or a flagfile).

    Returns:
        The values by name: `command_line` (e.g. `train.py --lr=0.1 --steps_per_loop=8`),
        then each flag's (e.g. `lr`: 0.1, `trainer.steps_per_loop`: 8).

    Raises:
        absl.flags.UnparsedFlagAccessError: the flags are not parsed yet (call it in `main`).
    """
    values: dict[str, Any] = {COMMAND_LINE: shlex.join(sys.argv)}  # recorded, not compared at a resume
    trainer_flags = _trainer_flags(flag_values)
    for module, module_flags in flag_values.flags_by_module_dict().items():
        if module.split(".")[0] in _LIBRARY_PACKAGES:
            continue
        for flag in module_flags:
            value = getattr(flag_values, flag.name)
            if flag.name in trainer_flags:
                name, parameter = trainer_flags[flag.name]
                values[TRAINER_FLAGS_PREFIX + name] = _one_value(_kind(parameter)[2](value))
            else:
                values[flag.name] = _one_value(value)
    return values


def _one_value(value: Any) -> Any:
    """A flag's value as one plain value: a list or tuple as one comma-separated string."""
    return ",".join(map(str, value)) if isinstance(value, list | tuple) else value


def _trainer_flags(flag_values: absl_flags.FlagValues) -> dict[str, tuple[str, inspect.Parameter]]:
    """The flags `define_trainer_flags` defined (this module's), by flag name: their argument's name and parameter."""
    parameters = {name: parameter for _, group in _groups().values() for name, parameter in group.items()}
    found = {}
    for flag in flag_values.get_flags_for_module(__name__):
        # The argument the flag's name ends with, after its prefix (the longest: `use_tpu`, not `tpu`).
        names = [name for name in parameters if flag.name.endswith(name)]
        if names:
            name = max(names, key=len)
            found[flag.name] = (name, parameters[name])
    return found


def fit_kwargs(*, prefix: str = "", flag_values: absl_flags.FlagValues = absl_flags.FLAGS) -> dict[str, Any]:
    """The parsed budget flags (`epochs`, `total_steps`, `validation_every_steps`) as `Trainer.fit` keyword arguments."""
    return _values("budget", prefix, flag_values)


def strategy_from_flags(*, prefix: str = "", flag_values: absl_flags.FlagValues = absl_flags.FLAGS) -> Any:
    """The strategy the parsed flags ask for: `tftrain.distribute.setup_strategy` with them (TF_CONFIG from the environment).

    Returns:
        The `tf.distribute.Strategy` (the default strategy when no flag asks for another).
    """
    return distribute.setup_strategy(**_values("strategy", prefix, flag_values))
