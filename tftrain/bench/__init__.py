"""`python -m tftrain.bench`: how fast each way of training is, on the same data.

Variants (eager, graph, XLA, k-step loops of `tftrain.Trainer`, `model.fit`,
a hand-written `tf.function` loop, ...) train the same models from the same
initial weights on one cached, synthetic input pipeline; repetitions
alternate and the report gives medians, ranges and ratios.

Library use (no flags):
    ```python
    from tftrain.bench import config, report, suite
    results = suite.run_benchmark(config.BenchmarkConfig(workloads="mlp", quick=True))
    print(report.format_report(results))
    ```

Importing this package (or `config`) does not load TensorFlow; the other
submodules do.
"""
