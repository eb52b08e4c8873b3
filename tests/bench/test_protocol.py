"""The benchmark's protocol on known inputs: intervals, verdicts, interleaving, agreement (no training)."""

import math
import threading

import pytest

from tftrain.bench import goals, report, segments, stats


def test_t_quantiles_match_the_tables():
    assert stats.t_quantile(0.975, 1) == pytest.approx(12.706, abs=1e-3)
    assert stats.t_quantile(0.975, 9) == pytest.approx(2.262, abs=1e-3)
    assert stats.t_quantile(0.95, 4) == pytest.approx(2.132, abs=1e-3)
    assert stats.t_quantile(0.025, 9) == pytest.approx(-2.262, abs=1e-3)
    assert stats.t_cdf(0.0, 5) == pytest.approx(0.5)


def test_ratio_interval_is_a_t_interval_on_paired_log_ratios():
    baseline = [1.0, 2.0, 1.5, 1.2]
    ratios = [1.01, 1.03, 1.02, 1.04]
    interval = stats.ratio_interval([b * r for b, r in zip(baseline, ratios, strict=True)], baseline)
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / 3)
    half = 3.182446 * sd / 2  # t(0.975, 3) * sd / sqrt(4)
    assert interval.estimate == pytest.approx(math.exp(mean))
    assert (interval.low, interval.high) == pytest.approx(
        (math.exp(mean - half), math.exp(mean + half)), rel=1e-6
    )
    assert interval.samples == 4 and interval.contains(interval.estimate)
    # The baseline's drift between rounds (1.0 to 2.0) does not widen the interval: only the paired ratios count.
    assert interval.high / interval.low < 1.05
    single = stats.ratio_interval([2.0], [1.0])
    assert single.estimate == 2.0 and single.low is None and not single.contains(2.0)
    assert stats.ratio_interval([], []) is None
    with pytest.raises(ValueError, match="Expected one per round"):
        stats.ratio_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="confidence=1.5"):
        stats.ratio_interval([1.0], [1.0], confidence=1.5)


def _interval(low, high):
    return stats.Interval(math.sqrt(low * high), low, high, 10, 0.95)


@pytest.mark.parametrize(
    "low, high, limit, strict, expected",
    [
        (0.98, 1.04, 1.05, False, stats.MET),
        (0.98, 1.05, 1.05, False, stats.MET),  # "at most" includes the limit
        (0.98, 1.05, 1.05, True, stats.UNDECIDED),  # "under" does not
        (1.06, 1.10, 1.05, False, stats.MISSED),
        (1.05, 1.10, 1.05, True, stats.MISSED),
        (1.00, 1.10, 1.05, False, stats.UNDECIDED),
        (0.40, 0.45, 0.50, False, stats.MET),
        (1.00, 1.10, None, False, stats.REPORTED),
    ],
)
def test_verdict_only_when_the_interval_excludes_the_goal(low, high, limit, strict, expected):
    assert stats.verdict(_interval(low, high), limit, strict) == expected


def test_verdict_without_an_interval():
    assert stats.verdict(None, 1.05) == stats.NOT_RUN
    assert stats.verdict(stats.Interval(0.5, None, None, 1, 0.95), 1.05) == stats.UNDECIDED


def test_median_interval_from_order_statistics():
    interval = stats.median_interval([float(v) for v in range(10, 0, -1)])
    # n = 10: [x_(2), x_(9)] covers the median with probability 1 - 2 * 11 / 1024 = 0.979 >= 0.95.
    assert (interval.estimate, interval.low, interval.high) == (5.5, 2.0, 9.0)
    assert stats.median_interval([1.0, 2.0, 3.0]).low is None  # too few values for 95%
    assert stats.median_interval([]) is None


def test_rounds_rotate_so_no_variant_always_runs_first():
    names = ("a", "b", "c")
    assert [segments.round_order(names, index) for index in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_interleave_runs_one_segment_at_a_time_in_rotated_order():
    log, running, lock = [], [], threading.Lock()

    def runner(name):
        def run(lane):
            log.append((name, "build"))
            for _ in range(lane.segments):
                lane.start()
                with lock:
                    running.append(name)
                    assert len(running) == 1  # no other variant runs inside a segment
                log.append((name, lane.steps))
                with lock:
                    running.remove(name)
                lane.stop()
                log.append((name, "between"))  # still this variant's turn
            return f"{name} done"

        return run

    lanes = segments.interleave({"a": runner("a"), "b": runner("b")}, {"a": 3, "b": 5}, segments=3)
    a, b = [("a", 3), ("a", "between")], [("b", 5), ("b", "between")]
    # Each turn runs one segment and what follows it; round 2 starts with b (rotated).
    assert log == [("a", "build"), *a, ("b", "build"), *b, *b, *a, *a, *b]
    assert [lanes[name].result for name in "ab"] == ["a done", "b done"]
    assert all(len(lane.measured) == 3 and lane.measured[0].gap_s is None for lane in lanes.values())
    assert all(segment.gap_s >= 0 and segment.wall_s >= 0 for segment in lanes["a"].measured[1:])


def test_interleave_reports_a_failing_variant_and_stops_the_others():
    def broken(lane):
        lane.start()
        raise ValueError("broken variant")

    def fine(lane):
        for _ in range(lane.segments):
            lane.start()
            lane.stop()

    with pytest.raises(ValueError, match="broken variant"):
        segments.interleave({"fine": fine, "broken": broken}, {"fine": 1, "broken": 1}, segments=3)

    # A variant that fails in its first turn, before the next one ever ran: no thread is left waiting.
    def broken_at_build(lane):
        raise ValueError("broken at build")

    outcome = {}

    def ask():
        try:
            segments.interleave(
                {"broken": broken_at_build, "late": fine}, {"broken": 1, "late": 1}, segments=2
            )
        except ValueError as error:
            outcome["error"] = error

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "interleave hung after a variant failed before another's first turn"
    assert "broken at build" in str(outcome["error"])

    def short(lane):
        lane.start()
        lane.stop()

    with pytest.raises(RuntimeError, match="short ran 1 segments; expected 2"):
        segments.interleave({"short": short}, {"short": 1}, segments=2)


def _variant(per_step_ms, steps=10, warmup_ms=50.0, cpu_share=0.9, gaps=None):
    segments_ = [{"wall_s": warmup_ms * steps / 1e3, "cpu_s": 0.0, "gap_s": None, "warmup": True}]
    for index, value in enumerate(per_step_ms):
        wall = value * steps / 1e3
        gap = None if gaps is None else gaps[index]
        segments_.append({"wall_s": wall, "cpu_s": wall * cpu_share, "gap_s": gap, "warmup": False})
    return {"eager": False, "steps_per_segment": steps, "segments": segments_}


def test_goals_from_hand_made_rounds():
    drift = [1.0, 1.3, 0.9, 1.1, 1.2, 1.0]  # the machine's speed changes between rounds
    variants = {
        "handwritten": _variant([2.0 * d for d in drift]),
        "graph": _variant(
            [2.0 * d * r for d, r in zip(drift, [1.01, 1.02, 1.0, 1.03, 1.02, 1.01], strict=True)]
        ),
        "handwritten_xla": _variant([2.0 * d for d in drift]),
        "xla": _variant(
            [2.0 * d * r for d, r in zip(drift, [1.10, 1.12, 1.11, 1.09, 1.13, 1.10], strict=True)]
        ),
        "handwritten_loop": _variant([1.0 * d for d in drift]),
        "graph_loop": _variant(
            [1.0 * d * r for d, r in zip(drift, [0.9, 1.2, 1.0, 1.1, 0.95, 1.05], strict=True)]
        ),
        "graph_loop_k1": _variant([2.0 * d for d in drift]),
        "graph_loop_k100": _variant([0.8 * d for d in drift]),
        "default": _variant(
            [0.8 * d * r for d, r in zip(drift, [1.0, 1.01, 0.99, 1.0, 1.02, 1.0], strict=True)]
        ),
        "keras_fit": _variant([2.2 * d for d in drift]),
        "graph_checkpoint": _variant([2.5 * d for d in drift], gaps=[0.03, 0.031, 0.029, 0.032, 0.03, 0.028]),
    }
    result = report.add_summaries({"name": "mlp", "variants": variants})
    targets = {target["name"]: target for target in result["targets"]}
    assert targets["graph_vs_handwritten"]["verdict"] == stats.MET  # 1.0-1.03 per round
    assert targets["xla_vs_handwritten_xla"]["verdict"] == stats.MISSED  # 1.09-1.13
    assert targets["graph_loop_vs_handwritten_loop"]["verdict"] == stats.UNDECIDED  # 0.9-1.2
    assert targets["graph_loop_vs_keras_fit_spe"]["verdict"] == stats.NOT_RUN
    auto = targets["auto_vs_best_fixed_k"]
    assert auto["baseline"] == "graph_loop_k100" and auto["verdict"] == stats.MET
    assert targets["default_vs_keras_fit"]["wall"]["estimate"] == pytest.approx(0.8 * 1.0033 / 2.2, rel=1e-2)
    assert targets["default_vs_keras_fit"]["verdict"] == stats.MET
    assert targets["graph_vs_handwritten"]["cpu"]["estimate"] == pytest.approx(
        targets["graph_vs_handwritten"]["wall"]["estimate"]
    )
    save = targets["checkpoint_save"]
    assert save["wall"]["estimate"] == pytest.approx(0.030) and save["verdict"] == stats.MET
    assert targets["graph_checkpoint_vs_graph"]["verdict"] == stats.REPORTED
    summary = variants["graph"]["summary"]
    assert summary["rounds"] == 6 and summary["warmup_s"] == pytest.approx(0.5)  # warmup left out
    assert variants["handwritten"]["summary"]["x_handwritten"] == pytest.approx(1.0)
    text = report.format_report(
        {
            "environment": {
                "tensorflow": "2",
                "keras": "3",
                "python": "3",
                "cpu_count": 2,
                "devices": ["CPU"],
            },
            "config": {"quick": False, "rounds": 6, "warmup_segments": 1},
            "workloads": {
                "mlp": {
                    **result,
                    "description": "d",
                    "num_train": 1,
                    "num_val": 1,
                    "batch_size": 1,
                    "segment_steps": 10,
                    "steps_per_loop": 20,
                    "num_params": 1,
                }
            },
        }
    )
    assert "[MET] Trainer graph" in text and "[MISSED] Trainer XLA" in text and "[UNDECIDED]" in text
    assert "xla/handwritten_xla" in text and "MISSED" in text.split("== goals")[1]


def test_timing_hook_goal_from_the_direct_measurement():
    met = goals.timing_hook_target(10e-6, [1e-3, 1.1e-3, 0.9e-3])  # 10 us of a 1 ms step
    assert met["wall"]["estimate"] == pytest.approx(1 / 0.99, rel=2e-3) and met["verdict"] == stats.MET
    missed = goals.timing_hook_target(30e-6, [1e-3, 1.1e-3, 0.9e-3])
    assert missed["verdict"] == stats.MISSED
    assert "30.0 us per host call" in report.format_target(missed)
    assert goals.timing_hook_target(10e-6, [])["verdict"] == stats.NOT_RUN


def _run(estimates):
    return {
        "workloads": {
            "mlp": {
                "targets": [
                    {"name": name, "wall": stats.Interval(estimate, low, high, 10, 0.95).to_dict()}
                    for name, (estimate, low, high) in estimates.items()
                ]
            }
        }
    }


def test_back_to_back_agreement():
    first = _run({"a": (1.00, 0.97, 1.03), "b": (0.50, 0.48, 0.52)})
    second = _run({"a": (1.02, 0.99, 1.05), "b": (0.56, 0.54, 0.58)})
    rows = goals.agreement(first, second)
    assert [(row["goal"], row["agree"]) for row in rows] == [("a", True), ("b", False)]
    lines = report.format_agreement(rows)
    assert "1 of 2 goals agree" in lines[0] and lines[-1].endswith("NO")
