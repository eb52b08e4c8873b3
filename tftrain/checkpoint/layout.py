"""The paths under a `model_dir`: `tftrain.layout`, importable here too.

The layout lives below every package that writes under a `model_dir`
(`tftrain.summaries` among them), so that each builds its paths from it.
"""

from tftrain.layout import EVAL_RUN, LOCK_NAME, ModelDirLayout

__all__ = ["EVAL_RUN", "LOCK_NAME", "ModelDirLayout"]
