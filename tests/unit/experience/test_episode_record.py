"""The typed episode record end to end: the agent's ``/run`` answer -> ``RolloutResult`` -> ``rollouts.jsonl`` ->
the metrics, under the same field names, read with no defaults; a renamed field breaks the chain loudly."""

import dataclasses

import pytest
from pydantic import ValidationError

from nemo_tau2.evals.metrics import EpisodeRecord, compute_eval_metrics
from nemo_tau2.evals.results import RolloutLog, record_of
from nemo_tau2.experience.rollouts import SamplingParams, result_from_response, run_nemo_gym_rollout_sync
from nemo_tau2.generation import GenerationConfig
from nemo_tau2.gym.agent.episode_record import EpisodeData, EpisodeStatus
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.tau2_env.gym_rows import task_row

SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=512)
FAKE = GenerationConfig(backend="fake", fake_cfg={}, temperature=0.0, top_p=1.0)
ROWS = [task_row("airline", "0"), task_row("retail", "1")]


@pytest.fixture(scope="module", params=[True, False], ids=["token_ids", "usage_only"])
def episodes(request):
    """Two episodes through the real stack, with token ids from the policy's server and without (the demo's)."""
    spec = Tau2EnvironmentSpec(
        policy=FAKE, user=FAKE, domains=["airline", "retail"], gym=NemoGymEnvConfig(return_token_ids=request.param)
    )
    with Tau2Environment(spec) as env:
        return run_nemo_gym_rollout_sync(ROWS, env.agent_urls, SAMPLING, 1, keep_full_result=True)


def test_the_record_keeps_its_names_from_the_agent_to_rollouts_jsonl_to_the_metrics(episodes, tmp_path):
    log = RolloutLog(tmp_path)
    for result in episodes:
        assert result.status is EpisodeStatus.OK
        log.append(record_of(result, keep_transcript=False))
    log.close()
    lines = RolloutLog(tmp_path).read()
    for result, line in zip(episodes, lines, strict=True):
        agent = EpisodeData.from_response(result.full_result)
        for name, value in agent.model_dump(mode="json").items():  # every field of the agent's, same name and value
            if name in ("conversation_id", "token_contiguity"):  # kept in the transcript / as its breaks
                continue
            assert line[name] == value, name
        assert line["token_contiguity_breaks"] == agent.token_contiguity.breaks == []
        assert line["policy_model"] == "fake"  # as the policy's server names its model
        assert line["total_tokens"] > line["prompt_tokens"] > 0 and line["generation_tokens"] > 0  # real counts
        assert line["num_turns"] > 0 and line["num_steps"] > line["num_turns"]
    records = [EpisodeRecord.from_dict(line) for line in lines]
    assert [r.num_turns for r in records] == [r.num_turns for r in episodes]
    metrics = compute_eval_metrics(records, ks=[1], num_bootstrap=0)
    assert metrics["eval/overall/pass@1"] == 1.0
    assert metrics["eval/airline/mean_total_tokens"] == episodes[0].total_tokens


def test_a_renamed_field_breaks_the_chain(episodes):
    body = dict(episodes[0].full_result)
    body["num_errors"] = body.pop("num_tool_errors")  # the agent's old name
    with pytest.raises(ValidationError, match="num_tool_errors"):
        result_from_response(ROWS[0], 0, 0, 0, 200, body, keep_full_result=False)
    line = record_of(episodes[0], keep_transcript=False)
    line["turns"] = line.pop("num_turns")  # the metrics' old name
    with pytest.raises(ValueError, match="num_turns"):
        EpisodeRecord.from_dict(line)


def test_the_record_fields_are_the_same_on_both_sides():
    """Every field the agent writes is a RolloutResult field of the same name (contiguity travels as its breaks)."""
    rollout_fields = {field.name for field in dataclasses.fields(episodes_type())}
    assert set(EpisodeData.model_fields) - {"conversation_id", "token_contiguity"} <= rollout_fields
    metric_fields = {field.name for field in dataclasses.fields(EpisodeRecord)}
    assert metric_fields <= rollout_fields


def episodes_type():
    from nemo_tau2.experience.rollouts import RolloutResult

    return RolloutResult
