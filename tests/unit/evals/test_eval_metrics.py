"""pass@k / pass^k estimators and the eval summary, against numbers worked out by hand."""

import logging
import re

import numpy as np
import pytest

from nemo_tau2.evals.metrics import (
    EpisodeRecord,
    aggregate_tasks,
    compute_eval_metrics,
    format_summary_table,
    pass_at_k,
    pass_hat_k,
)

# ---------------------------------------------------------------- estimators


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 0.25),  # pass@1 = c/n
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
        (4, 0, 2, 0.0),  # c = 0
        (4, 4, 2, 1.0),  # c = n
        (4, 1, 4, 1.0),  # n = k: any success among all episodes
        (4, 0, 4, 0.0),  # n = k, c = 0
        (3, 2, 2, 1.0),  # fewer failures (1) than k (2): some success is certain
    ],
)
def test_pass_at_k_matches_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 0.25),  # pass^1 = c/n
        (4, 2, 2, 1 / 6),  # C(2,2)/C(4,2)
        (4, 3, 2, 0.5),  # C(3,2)/C(4,2) = 3/6
        (5, 3, 3, 0.1),  # C(3,3)/C(5,3) = 1/10
        (10, 7, 4, 35 / 210),  # C(7,4)/C(10,4)
        (4, 0, 2, 0.0),  # c = 0
        (4, 4, 3, 1.0),  # c = n
        (4, 3, 4, 0.0),  # n = k with one failure: not all succeed
        (4, 4, 4, 1.0),  # n = k, c = n
        (3, 1, 2, 0.0),  # fewer successes than k
    ],
)
def test_pass_hat_k_matches_hand_computed_values(n, c, k, expected):
    assert pass_hat_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("fn", [pass_at_k, pass_hat_k])
@pytest.mark.parametrize(
    ("n", "c", "k", "message"),
    [(3, 1, 4, "k=4 is larger than"), (3, 1, 0, "k must be >= 1"), (3, 4, 1, r"c=4 must lie in \[0, n=3\]"),
     (3, -1, 1, "c=-1")],
)  # fmt: skip
def test_estimators_reject_impossible_counts(fn, n, c, k, message):
    with pytest.raises(ValueError, match=message):
        fn(n, c, k)


@pytest.mark.parametrize("fn", [pass_at_k, pass_hat_k])
def test_estimators_reject_non_integer_counts(fn):
    with pytest.raises(TypeError, match="c must be an int, got 0.7"):
        fn(4, 0.7, 1)
    with pytest.raises(TypeError, match="c must be an int"):
        fn(4, True, 1)


# ---------------------------------------------------------------- records


def test_shaped_or_float_success_is_rejected():
    with pytest.raises(TypeError, match="success must be a bool, got 0.7 .*binarise"):
        EpisodeRecord("airline", "0", success=0.7, reward=0.7)
    with pytest.raises(TypeError, match="success must be a bool, got 1.0"):
        EpisodeRecord("airline", "0", success=1.0, reward=1.0)
    with pytest.raises(TypeError, match="success must be a bool, got 1 "):
        EpisodeRecord("airline", "0", success=1, reward=1.0)


def test_record_validates_status_and_reward():
    with pytest.raises(ValueError, match="status must be one of"):
        EpisodeRecord("airline", "0", success=True, reward=1.0, status="timeout")
    with pytest.raises(TypeError, match="reward must be a number"):
        EpisodeRecord("airline", "0", success=True, reward=None)
    with pytest.raises(TypeError, match="reward must be a number"):
        EpisodeRecord("airline", "0", success=True, reward=float("nan"))
    # infrastructure errors carry no verdict
    EpisodeRecord("airline", "0", success=None, reward=None, status="infrastructure_error")


def test_record_from_dict_accepts_numpy_bool_and_ignores_extra_keys():
    line = {"domain": "retail", "task_id": 7, "success": np.bool_(True), "reward": 1, "status": "ok"}
    line |= {"termination_reason": "user_stop", "num_turns": 3, "total_tokens": 90, "prompt": "..."}
    line |= {"token_contiguity_breaks": ["turn 2: ..."]}
    record = EpisodeRecord.from_dict(line)
    assert record.success is True and record.task_id == "7" and record.num_turns == 3
    with pytest.raises(ValueError, match=r"missing \['success'\]"):
        EpisodeRecord.from_dict({key: value for key, value in line.items() if key != "success"})
    assert record.token_contiguity_breaks == 1
    # no token ids asked (an eval's default): nothing was checked, so no break rate rather than a vacuous 0
    unchecked = EpisodeRecord.from_dict(line | {"token_contiguity_breaks": [], "trainable_turns": 0})
    assert unchecked.token_contiguity_breaks is None
    assert "eval/overall/token_contiguity_break_rate" not in compute_eval_metrics([unchecked], [1], num_bootstrap=0)
    assert compute_eval_metrics([record], [1], num_bootstrap=0)["eval/overall/token_contiguity_break_rate"] == 1.0


def test_shaped_rewards_do_not_count_as_successes():
    # High shaped rewards but failed verdicts: pass@k counts success only, mean reward reports the rewards.
    records = [EpisodeRecord("retail", "0", success=False, reward=1.2) for _ in range(3)]
    records.append(EpisodeRecord("retail", "0", success=True, reward=1.0))
    metrics = compute_eval_metrics(records, [1, 4], num_bootstrap=0)
    assert metrics["eval/retail/pass@1"] == pytest.approx(0.25)
    assert metrics["eval/retail/pass^4"] == 0.0
    assert metrics["eval/retail/mean_reward"] == pytest.approx(4.6 / 4)


def test_infrastructure_errors_are_excluded_from_n_and_counted_apart():
    records = [
        EpisodeRecord("airline", "0", success=True, reward=1.0),
        EpisodeRecord("airline", "0", success=False, reward=0.0),
        EpisodeRecord("airline", "0", success=None, reward=None, status="infrastructure_error"),
    ]
    (task,) = aggregate_tasks(records)
    assert (task.num_episodes, task.num_successes, task.num_infra_errors) == (2, 1, 1)
    metrics = compute_eval_metrics(records, [1, 2], num_bootstrap=0)
    assert metrics["eval/airline/pass@1"] == 0.5  # 1/2, not 1/3
    assert metrics["eval/airline/pass@2"] == 1.0
    assert metrics["eval/airline/num_infra_errors"] == 1
    assert metrics["eval/airline/num_episodes"] == 2


# ---------------------------------------------------------------- summary


def _records(domain, task_id, successes, rewards=None, infra_errors=0, reason="user_stop", turns=None, tokens=None):
    rewards = rewards if rewards is not None else [float(s) for s in successes]
    ok = [
        EpisodeRecord(domain, task_id, s, r, termination_reason=reason, num_turns=turns, total_tokens=tokens)
        for s, r in zip(successes, rewards, strict=True)
    ]
    errors = [EpisodeRecord(domain, task_id, None, None, status="infrastructure_error")] * infra_errors
    return ok + errors


@pytest.fixture
def mixed_records():
    """Per-task numbers (n valid, c successes), worked out by hand in the tests below.

    airline/1: n=4 c=1, rewards 1, .6, .6, 0 -> pass@1 .25, pass@2 .5, pass^2 0, mean reward .55
    airline/2: n=4 c=2                         -> pass@1 .5,  pass@2 5/6, pass^2 1/6, mean reward .5
    retail/1:  n=4 c=4                         -> pass@1 1,   pass@2 1,  pass^2 1
    retail/2:  n=3 c=1 (+1 infra error)        -> pass@1 1/3, pass@2 1 - C(2,2)/C(3,2) = 2/3, pass^2 0
    retail/3:  n=1 c=0 (+3 infra errors)       -> pass@1 0, excluded from k=2
    telecom/1: n=0 (2 infra errors)            -> excluded everywhere
    """
    return [
        *_records("airline", "1", [True, False, False, False], [1.0, 0.6, 0.6, 0.0], turns=4, tokens=100),
        *_records("airline", "2", [True, True, False, False], reason="max_steps", turns=8, tokens=300),
        *_records("retail", "1", [True] * 4),
        *_records("retail", "2", [True, False, False], infra_errors=1),
        *_records("retail", "3", [False], infra_errors=3),
        *_records("telecom", "1", [], infra_errors=2),
    ]


def test_per_domain_overall_and_macro_means(mixed_records):
    m = compute_eval_metrics(mixed_records, [2, 1], num_bootstrap=0)
    expected = {
        "eval/airline/pass@1": 0.375,  # (.25 + .5) / 2
        "eval/airline/pass@2": 2 / 3,  # (.5 + 5/6) / 2
        "eval/airline/pass^2": 1 / 12,  # (0 + 1/6) / 2
        "eval/airline/mean_reward": 0.525,  # (.55 + .5) / 2
        "eval/retail/pass@1": 4 / 9,  # (1 + 1/3 + 0) / 3
        "eval/retail/pass@2": 5 / 6,  # (1 + 2/3) / 2, retail/3 excluded
        "eval/retail/pass^2": 0.5,  # (1 + 0) / 2
        "eval/overall/pass@1": 5 / 12,  # (.25 + .5 + 1 + 1/3 + 0) / 5
        "eval/overall/pass^1": 5 / 12,
        "eval/overall/pass@2": 0.75,  # (.5 + 5/6 + 1 + 2/3) / 4
        "eval/overall/pass^2": 7 / 24,  # (0 + 1/6 + 1 + 0) / 4
        "eval/overall/mean_reward": (0.55 + 0.5 + 1 + 1 / 3 + 0) / 5,  # = 0.47667
        "eval/macro/pass@1": (0.375 + 4 / 9) / 2,  # telecom has no eligible task
        "eval/macro/pass@2": 0.75,  # (2/3 + 5/6) / 2
    }
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, abs=1e-12), key
    assert "eval/telecom/pass@1" not in m and "eval/telecom/mean_reward" not in m


def test_counts_terminations_turns_and_tokens(mixed_records):
    m = compute_eval_metrics(mixed_records, [1, 2], num_bootstrap=0)
    assert m["eval/overall/num_tasks"] == 6
    assert m["eval/overall/num_episodes"] == 16
    assert m["eval/overall/num_infra_errors"] == 6
    assert m["eval/overall/num_tasks_without_valid_episodes"] == 1
    assert m["eval/overall/num_tasks_excluded@1"] == 1  # telecom/1
    assert m["eval/overall/num_tasks_excluded@2"] == 2  # retail/3, telecom/1
    assert m["eval/retail/num_tasks_excluded@2"] == 1
    assert m["eval/telecom/num_infra_errors"] == 2
    assert m["eval/overall/termination/user_stop"] == 12
    assert m["eval/overall/termination/max_steps"] == 4
    assert m["eval/airline/mean_num_turns"] == 6.0  # (4*4 + 4*8) / 8
    assert m["eval/airline/mean_total_tokens"] == 200.0
    assert "eval/retail/mean_num_turns" not in m  # no turn counts recorded


def test_tasks_below_k_are_logged(mixed_records, caplog):
    with caplog.at_level(logging.WARNING, logger="nemo_tau2.evals.metrics"):
        compute_eval_metrics(mixed_records, [2], num_bootstrap=0)
    assert "2 task(s) have fewer than 2 valid episodes" in caplog.text


def test_bootstrap_interval_of_constant_values_is_a_point():
    records = [*_records("airline", "1", [True, False]), *_records("airline", "2", [False, True])]
    m = compute_eval_metrics(records, [1], num_bootstrap=200, seed=3)
    assert m["eval/airline/pass@1"] == 0.5
    assert m["eval/airline/pass@1_ci95_low"] == 0.5 and m["eval/airline/pass@1_ci95_high"] == 0.5


def test_bootstrap_interval_for_two_tasks_matches_resampling_distribution():
    # Task means 0 and 1: a resample of 2 tasks has mean 0 (p=1/4), 0.5 (p=1/2) or 1 (p=1/4).
    # A 40% interval spans the 30th..70th percentiles, both 0.5; a 95% interval spans 0..1.
    records = [*_records("retail", "a", [False] * 2), *_records("retail", "b", [True] * 2)]
    m40 = compute_eval_metrics(records, [1], num_bootstrap=4000, confidence=0.4, seed=0)
    assert (m40["eval/retail/pass@1_ci40_low"], m40["eval/retail/pass@1_ci40_high"]) == (0.5, 0.5)
    m95 = compute_eval_metrics(records, [1], num_bootstrap=4000, seed=0)
    assert (m95["eval/retail/pass@1_ci95_low"], m95["eval/retail/pass@1_ci95_high"]) == (0.0, 1.0)


def test_bootstrap_is_seeded_and_brackets_the_estimate(mixed_records):
    a = compute_eval_metrics(mixed_records, [1, 2], num_bootstrap=300, seed=7)
    b = compute_eval_metrics(mixed_records, [1, 2], num_bootstrap=300, seed=7)
    c = compute_eval_metrics(mixed_records, [1, 2], num_bootstrap=300, seed=8)
    assert a == b
    assert a != c
    for scope in ("overall", "macro", "airline", "retail"):
        for name in ("pass@1", "pass@2", "pass^2", "mean_reward"):
            low, high = a[f"eval/{scope}/{name}_ci95_low"], a[f"eval/{scope}/{name}_ci95_high"]
            assert low <= a[f"eval/{scope}/{name}"] <= high, (scope, name)


def test_compute_eval_metrics_rejects_bad_arguments(mixed_records):
    with pytest.raises(ValueError, match="ks must be"):
        compute_eval_metrics(mixed_records, [0])
    with pytest.raises(ValueError, match="no episode records"):
        compute_eval_metrics([], [1])
    with pytest.raises(ValueError, match="reserved"):
        compute_eval_metrics(_records("overall", "1", [True]), [1])


def test_summary_table_lists_domains_in_tau2_order(mixed_records):
    table = format_summary_table(compute_eval_metrics(mixed_records, [1, 2], num_bootstrap=0))
    assert table.splitlines() == [
        "Metric        Overall  Airline  Retail  Telecom",
        "------------  -------  -------  ------  -------",
        "pass@1           41.7     37.5    44.4        -",
        "pass@2           75.0     66.7    83.3        -",
        "pass^1           41.7     37.5    44.4        -",
        "pass^2           29.2      8.3    50.0        -",
        "mean reward     0.477    0.525   0.444        -",
        "tasks               6        2       3        1",
        "episodes           16        8       8        0",
        "infra errors        6        0       4        2",
    ]


def test_summary_table_can_show_intervals():
    records = [*_records("airline", "1", [True, False]), *_records("airline", "2", [False, True])]
    table = format_summary_table(compute_eval_metrics(records, [1], num_bootstrap=50), show_ci=True)
    lines = table.splitlines()
    assert lines[0].split() == ["Metric", "Overall", "Airline"]
    assert lines[2].split() == ["pass@1", "50.0", "[50.0,", "50.0]", "50.0", "[50.0,", "50.0]"]


def test_bootstrap_is_stratified_by_domain():
    # Airline tasks all succeed, retail tasks all fail: every stratified resample keeps 2 + 2 tasks, so the
    # overall mean is exactly 0.5 in each (a pooled resample would range over 0..1).
    records = [
        *_records("airline", "a", [True] * 2),
        *_records("airline", "b", [True] * 2),
        *_records("retail", "a", [False] * 2),
        *_records("retail", "b", [False] * 2),
    ]
    m = compute_eval_metrics(records, [1], num_bootstrap=500)
    assert m["eval/overall/pass@1_ci95_low"] == m["eval/overall/pass@1"] == m["eval/overall/pass@1_ci95_high"] == 0.5
    assert m["eval/macro/pass@1_ci95_low"] == m["eval/macro/pass@1_ci95_high"] == 0.5


# ---------------------------------------------------------------- how episodes ended


def _ended(domain, kind, reason="user_stop", calls=1, hallucinated=0, transfer=False):
    if kind == "infrastructure":
        return EpisodeRecord(domain, "1", None, None, status="infrastructure_error", tau2_failure_kind=kind)
    counts = {"total": calls, "malformed": 0, "hallucinated": hallucinated, "transfer_to_human_agents": transfer}
    return EpisodeRecord(
        domain, "1", False, 0.0, termination_reason=reason, tau2_failure_kind=kind, agent_tool_calls=counts
    )


def test_failure_kind_shares_per_domain_under_nemo_gym_names_and_in_the_table():
    records = [
        _ended("airline", "ended_normally"),
        _ended("airline", "transfer", transfer=True),
        _ended("airline", "hallucinated_tool", hallucinated=2),
        _ended("airline", "infrastructure"),
        _ended("retail", "max_steps", reason="max_steps", calls=0),
        _ended("retail", "ended_normally"),
        EpisodeRecord.from_dict(  # a line written before kinds were recorded: left out of the shares, counted
            {"domain": "retail", "task_id": "2", "success": True, "reward": 1.0, "status": "ok"}
            | {"termination_reason": "user_stop", "num_turns": 2, "total_tokens": 9, "token_contiguity_breaks": []}
        ),
    ]
    m = compute_eval_metrics(records, [1], num_bootstrap=0)
    airline = {kind: m[f"eval/airline/failure_kind/{kind}/pct"] for kind in ("ended_normally", "transfer")}
    assert airline == {"ended_normally": 0.25, "transfer": 0.25}
    assert m["eval/airline/failure_kind/infrastructure/pct"] == m["eval/airline/failure_kind/hallucinated_tool/pct"]
    assert sum(v for k, v in m.items() if k.startswith("eval/retail/failure_kind/") and k.endswith("/pct")) == 1.0
    assert m["eval/retail/failure_kind/not_recorded/count"] == 1
    assert m["eval/overall/failure_kind/max_steps/pct"] == 1 / 6
    # NeMo-Gym's tau2 agent's names, over the played episodes (the infrastructure failure has no trajectory)
    assert m["eval/airline/trajectory_transfer_to_human_agents/pct"] == 1 / 3
    assert m["eval/airline/tool_call_hallucination/count/total"] == 2
    assert m["eval/retail/trajectory_missing_tool_call/pct"] == 0.5
    assert m["eval/retail/trajectory_termination_reason/max_steps/pct"] == 0.5
    table = {
        re.split(r"\s{2,}", line)[0]: re.split(r"\s{2,}", line)[1:] for line in format_summary_table(m).splitlines()
    }
    kinds = [label for label in table if label.endswith(" %")]
    assert kinds == ["infrastructure %", "max steps %", "transfer %", "hallucinated tool %", "ended normally %"]
    assert table["transfer %"] == ["16.7", "25.0", "0.0"]  # overall, airline, retail
