"""The vllm backend against real vLLM (vLLM's CPU build, SmolLM2-135M-Instruct in float32): two replicas of our
entry point, started once, serving a chat template that rewrites history as Qwen3's does.

The servers come from ``start_generation`` with a ``policy.generation`` block, as in a run. The tests share them;
the last one (a reload that fails inside vLLM) stops them, so it stays last.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from nemo_tau2.evals.metrics import EpisodeRecord, compute_eval_metrics
from nemo_tau2.evals.results import EVALUATION_DATA_FILE, RolloutLog, record_of, write_evaluation_data
from nemo_tau2.experience.rollouts import OK, SamplingParams, run_nemo_gym_rollout_sync
from nemo_tau2.generation import GenerationConfig, start_generation
from nemo_tau2.generation.prefix import find_token_prefix
from nemo_tau2.generation.smollm2 import smollm2_hf_dir
from nemo_tau2.generation.surface_check import ToolCallProbe, call_json, check_surface
from nemo_tau2.generation.tiny_model import WEATHER_TOOL
from nemo_tau2.generation.vllm_launcher import EXTENSION_DIR, VllmReplicas, WeightUpdateError
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.tau2_env.gym_rows import task_row
from tests.history_rewriting_template import write_history_rewriting_template
from tests.vllm_env import vllm_python

from .conftest import TOOL_PROMPT
from .vllm_episodes import TASKS, mock_episodes

CALL_TIMEOUT_S = 300  # one call to a CPU server on a busy machine (call_json asks for its wait)

PERTURBED = "model.layers.3.mlp.down_proj.weight"
TIED = "model.embed_tokens.weight"  # SmolLM2 ties lm_head to it: vLLM's CPU reload alone leaves lm_head stale
PROMPT = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def model_dir():
    return smollm2_hf_dir()


@pytest.fixture(scope="module")
def vllm(model_dir, tmp_path_factory):
    template = write_history_rewriting_template(tmp_path_factory.mktemp("template"))
    cfg = GenerationConfig(
        backend="vllm",
        model_name=str(model_dir),
        temperature=1.0,
        top_p=1.0,
        vllm_cfg={
            "python": vllm_python(),
            "device": "cpu",
            "precision": "float32",
            "max_model_len": 4096,
            "cpu_kvcache_space_gb": 1,
            "data_parallel_size": 2,
            "http_server_serving_chat_kwargs": {"chat_template": template},
            # cache blocks of 32 tokens (CPU default 128: a turn's new history would rarely fill one), and each
            # answer's cached prompt tokens reported, for the routing test
            "extra_args": ["--block-size", "32", "--enable-prompt-tokens-details"],
        },
    )
    with start_generation(cfg) as handle:
        yield handle


def _greedy(handle, max_tokens: int = 12) -> dict:
    body = {"model": handle.model_name, "messages": PROMPT, "max_tokens": max_tokens, "temperature": 0.0}
    body |= {"logprobs": True, "return_token_ids": True}
    status, response = call_json("POST", f"{handle.base_urls[0]}/chat/completions", body, timeout_s=CALL_TIMEOUT_S)
    assert status == 200, response
    return response


def _vllm_logprobs(response: dict) -> torch.Tensor:
    return torch.tensor([entry["logprob"] for entry in response["choices"][0]["logprobs"]["content"]])


def _transformers_logprobs(folder, response: dict) -> torch.Tensor:
    """The logprobs transformers (float32) gives the tokens vLLM generated, on vLLM's own prompt ids."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt, generated = response["prompt_token_ids"], response["choices"][0]["token_ids"]
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(generated)[:, None])[:, 0]


def _checkpoint(model_dir, target, edit) -> str:
    """A copy of the served model folder whose tensors went through ``edit`` (a dict -> dict function)."""
    shutil.copytree(model_dir, target)
    tensors = edit(load_file(target / "model.safetensors"))
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return str(target)


def test_our_server_and_worker_extension_import_alone_in_vllms_python():
    """The vLLM process (Python 3.11 for vLLM's CPU build) imports these files of ours and nothing else of ours."""
    env = dict(os.environ, PYTHONPATH=str(EXTENSION_DIR))
    modules = "nemo_tau2_vllm_server, nemo_tau2_vllm_extension, nemo_tau2_token_splice"
    probe = f"import sys, {modules}; print(sys.version_info[:2], 'nemo_tau2' in sys.modules)"
    result = subprocess.run([vllm_python(), "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("False")


ROUND_TRIP_TEXTS = [
    "Hello world, how are you?",
    "  leading spaces,\ttabs\nand newlines  ",
    "Order #W2378156: 3 items, $1,024.50 total.",
    "Ünïcödé — émoji 🎉 中文",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "<|im_start|>user\nhi<|im_end|>\n",
]
_ROUND_TRIP = (
    "import json, sys\n"
    "from transformers import AutoTokenizer\n"
    "tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])\n"
    "out = []\n"
    "for text in json.loads(sys.argv[2]):\n"
    "    ids = tokenizer(text, add_special_tokens=True).input_ids\n"
    "    out.append([ids, tokenizer.decode(ids)])\n"
    "print(json.dumps([out, tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token]))\n"
)


def test_the_converted_tokenizer_round_trips_alike_in_our_environment_and_vllms(model_dir):
    """Text -> ids -> text is exact, no BOS is added, eos/pad are <|im_end|>, and vLLM's transformers (5.x) gives the
    same ids as ours (4.x): the GGUF import got all of this wrong (see nemo_tau2/generation/smollm2.py)."""
    answers = []
    for python in (sys.executable, vllm_python()):
        run = [python, "-c", _ROUND_TRIP, str(model_dir), json.dumps(ROUND_TRIP_TEXTS)]
        result = subprocess.run(run, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=""))
        assert result.returncode == 0, result.stderr[-2000:]
        answers.append(json.loads(result.stdout.strip().splitlines()[-1]))
    ours, theirs = answers
    assert ours == theirs
    pairs, eos, pad, _ = ours
    assert eos == pad == "<|im_end|>"
    for text, (ids, decoded) in zip(ROUND_TRIP_TEXTS, pairs, strict=True):
        assert decoded == text
        assert ids[0] != 1 or text.startswith("<|im_start|>")  # <|im_start|> (id 1) only where the text has it


def test_vllm_speaks_the_surface_with_token_ids_logprobs_tool_calls_and_context_errors(vllm):
    probe = ToolCallProbe(
        messages=TOOL_PROMPT, tools=[WEATHER_TOOL], tool_choice="required", expect_tool_calls_finish=False
    )
    # our entry point splices recorded ids as our other servers do; vLLM accepts stream/top_k/stop (see vllm_launcher)
    report = check_surface(vllm.base_urls[0], tool_probe=probe, check_splice=True, check_rejections=False)
    assert report.max_model_len == 4096  # so the context-length 400 (vLLM 0.32's nested error shape) was checked
    choice = report.tool_completion["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and isinstance(json.loads(call["function"]["arguments"]), dict)
    assert choice["token_ids"] and report.tool_completion["prompt_token_ids"]
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])


def test_vllm_logprobs_are_the_served_models_own(vllm, model_dir):
    response = _greedy(vllm)
    difference = (_vllm_logprobs(response) - _transformers_logprobs(model_dir, response)).abs().max()
    assert difference < 2e-3, f"vLLM and transformers disagree by {difference} on the same tokens"


@pytest.mark.parametrize("server", ["fast_vllm_model", "vllm_model"])
def test_a_tau2_episode_on_vllm_keeps_every_turn_contiguous(vllm, server):
    """Each policy turn's prompt extends the previous turn's prompt + generation, through each Gym model server,
    although the template re-renders history differently (the splice of recorded ids)."""
    fake_user = GenerationConfig(backend="fake", fake_cfg={}, temperature=0.0, top_p=1.0)
    spec = Tau2EnvironmentSpec(
        policy=vllm,
        user=fake_user,
        domains=["mock"],
        gym=NemoGymEnvConfig(max_steps=12, policy_model_server=server, return_token_ids=True),
    )
    sampling = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=48)  # greedy: two policy turns
    with Tau2Environment(spec) as environment:
        rows = [task_row("mock", "update_task_1", split="base")]
        (result,) = run_nemo_gym_rollout_sync(rows, environment.agent_urls, sampling, 1)
    assert result.status == OK, result.error
    generated = [message for message in result.message_log if message["role"] == "assistant"]
    assert len(generated) >= 2, "the episode needs several policy turns to check contiguity"
    assert result.token_contiguity_breaks == []
    assert len(generated) == result.num_turns  # every policy turn is trained on
    assert all(len(m["generation_logprobs"]) == len(m["token_ids"]) > 0 for m in generated)


def test_with_the_splice_every_turn_extends_the_last_and_without_it_the_template_breaks_episodes(
    vllm, model_dir, tmp_path
):
    spliced = mock_episodes(vllm, strip_token_ids=False)
    stripped = mock_episodes(vllm, strip_token_ids=True)  # what stock vLLM does: recorded ids ignored
    _check_the_records_name_the_cut(spliced.results, tmp_path / "spliced")  # the control: nothing cut
    _check_the_records_name_the_cut(stripped.results, tmp_path / "stripped")
    for run in (spliced, stripped):
        assert all(r.status == OK for r in run.results), [r.error for r in run.results]
        assert sum(r.num_turns > 1 for r in run.results) >= 2, "the check needs multi-turn episodes"
    assert [r.token_contiguity_breaks for r in spliced.results] == [[]] * len(spliced.results)
    assert all(sum(m["role"] == "assistant" for m in r.message_log) == r.num_turns for r in spliced.results)
    continued = 0
    for request, answer in spliced.completions():
        recorded = find_token_prefix(request["messages"])
        if recorded is not None:  # turn t+1 starts with turn t's prompt + generation, token for token
            assert answer["prompt_token_ids"][: len(recorded)] == recorded
            continued += 1
    assert continued >= 2
    broken = [r for r in stripped.results if r.token_contiguity_breaks]
    assert broken, "re-rendered from text, this template must break contiguity"
    assert all(sum(m["role"] == "assistant" for m in r.message_log) < r.num_turns for r in broken)
    # vLLM's logprobs of a later turn's generation are the model's on the spliced sequence
    request, answer = max(spliced.completions(), key=lambda pair: len(pair[1]["prompt_token_ids"]))
    assert find_token_prefix(request["messages"]) is not None
    served = _vllm_logprobs(answer)
    assert (served - _transformers_logprobs(model_dir, answer)).abs().max() < 2e-3


def _check_the_records_name_the_cut(results, save_dir):
    """What a reader of the results sees: each record's first break and trainable turns, the summary's share of
    episodes with a break, and evaluation_data.json's transcript with the policy turns past the cut marked."""
    rows = [task_row("mock", task, split="base") for task in TASKS]
    log = RolloutLog(save_dir)
    for result in results:
        log.append(record_of(result, keep_transcript=True))
        breaks = result.token_contiguity_breaks
        if breaks:
            assert result.trainable_turns == result.first_break_turn < result.num_turns
            assert breaks[0].startswith(f"turn {result.first_break_turn}:")
        else:
            assert result.first_break_turn is None and result.trainable_turns == result.num_turns
    log.close()
    records = RolloutLog(save_dir).read()
    metrics = compute_eval_metrics([EpisodeRecord.from_dict(r) for r in records], ks=[1], num_bootstrap=0)
    broken = sum(bool(r.token_contiguity_breaks) for r in results)
    assert metrics["eval/overall/token_contiguity_break_rate"] == broken / len(results)
    write_evaluation_data(save_dir, records, rows, 1, full_result=False)
    entries = json.loads((save_dir / EVALUATION_DATA_FILE).read_text())["evaluation_data"]
    assert len(entries) == len(results)
    for entry in entries:
        turns = [item for item in entry["message_log"] if item.get("generation_token_ids")]
        assert [item["trainable"] for item in turns] == [i < entry["trainable_turns"] for i in range(len(turns))]
        cut = entry["first_break_turn"]
        assert entry["trainable_turns"] == (len(turns) if cut is None else cut)  # the transcript itself is whole


def test_sticky_routing_keeps_each_episode_on_one_replica_and_hits_the_prefix_cache_more(vllm):
    sticky = mock_episodes(vllm, routing="sticky", temperature=1.0, samples=3)
    round_robin = mock_episodes(vllm, routing="round_robin", temperature=1.0, samples=3)
    hit_rates = {name: (run.later_turn_hit_rate(), run.hit_rate) for name, run in [("sticky", sticky),
                 ("round robin", round_robin)]}  # fmt: skip
    print("prefix cache hit rate, turns >= 2 / all turns (vLLM /metrics):", hit_rates)
    assert sticky.turns_off_their_replica() == 0
    assert round_robin.turns_off_their_replica() > 0  # the check can fail
    # the policy prompt and tools (shared by every episode) are cached on both replicas either way; what differs is
    # the episode's own history, which only the replica that served the previous turn holds
    assert sticky.later_turn_hit_rate() > round_robin.later_turn_hit_rate()
    assert sticky.hit_rate > round_robin.hit_rate


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"prompt_token_ids": "1 2 3"}, "messages[1].prompt_token_ids"),
        ({"prompt_token_ids": [1, 10**7]}, "messages[1].prompt_token_ids"),
        ({"generation_token_ids": [1.5]}, "messages[1].generation_token_ids"),
        ({"generation_token_ids": None}, "messages[1].generation_token_ids"),
        ({"prompt_token_ids": [2, 2, 2, 2, 2, 2, 2, 2, 2]}, "messages"),  # more turns than the conversation has
        ({"required_prefix_token_ids": [-1]}, "required_prefix_token_ids"),
    ],
)
def test_malformed_token_ids_are_a_400_naming_the_field_and_the_server_keeps_serving(vllm, edit, field):
    url = f"{vllm.base_urls[0]}/chat/completions"
    first = _greedy(vllm, max_tokens=4)
    assistant = {
        "role": "assistant",
        "content": first["choices"][0]["message"]["content"],
        "prompt_token_ids": first["prompt_token_ids"],
        "generation_token_ids": first["choices"][0]["token_ids"],
    }
    extra = {k: v for k, v in edit.items() if k == "required_prefix_token_ids"}
    assistant |= {k: v for k, v in edit.items() if k not in extra}
    messages = [*PROMPT, assistant, {"role": "user", "content": "And one more?"}]
    body = {"model": vllm.model_name, "messages": messages, "max_tokens": 4} | extra
    status, answer = call_json("POST", url, body, timeout_s=CALL_TIMEOUT_S)
    assert status == 400, answer
    assert answer["error"]["param"] == field and field in answer["error"]["message"]
    assert _greedy(vllm, max_tokens=4)["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]


def test_max_tokens_is_clamped_to_the_room_left_and_a_full_context_is_a_context_length_400(vllm):
    url = f"{vllm.base_urls[0]}/chat/completions"
    root = vllm.base_urls[0].removesuffix("/v1")
    words = 1000
    # a prompt that leaves less than 24 tokens of the 4096 (stock vLLM: 400 for max_tokens 1000); little room, few
    # tokens decoded at a 4k context (each ~0.2 s on the CPU build)
    for _ in range(4):
        messages = [{"role": "user", "content": "colour " * words}]
        status, tokens = call_json(
            "POST", f"{root}/tokenize", {"model": vllm.model_name, "messages": messages}, timeout_s=CALL_TIMEOUT_S
        )
        room = 4096 - len(tokens["tokens"])
        if 0 < room < 24:
            break
        words += int((4096 - 12 - len(tokens["tokens"])) * words / len(tokens["tokens"]))
    assert 0 < room < 24, room
    body = {"model": vllm.model_name, "messages": messages, "max_tokens": 1000, "temperature": 0.0}
    status, answer = call_json("POST", url, body, timeout_s=CALL_TIMEOUT_S)
    assert status == 200 and answer["usage"]["completion_tokens"] <= room, answer
    long = [{"role": "user", "content": "colour " * 5000}]
    status, answer = call_json(
        "POST", url, {"model": vllm.model_name, "messages": long, "max_tokens": 8}, timeout_s=CALL_TIMEOUT_S
    )
    assert status == 400 and "maximum context length" in answer["error"]["message"]


def test_a_reload_serves_the_new_weights_and_a_restore_the_old_ones_exactly(vllm, model_dir, tmp_path):
    baseline = _greedy(vllm)

    def perturb(tensors):
        generator = torch.Generator().manual_seed(0)
        noisy = {
            name: tensors[name] + torch.randn(tensors[name].shape, generator=generator) * tensors[name].std() / 4
            for name in (PERTURBED, TIED)
        }
        return tensors | noisy

    perturbed = _checkpoint(model_dir, tmp_path / "perturbed", perturb)
    assert baseline["weight_version"] == 0  # each completion names the weights that sampled it (vLLM's own record)
    assert vllm.update_weights(checkpoint_dir=perturbed, weight_version=7) == 7  # a trainer's step as the label
    moved = _greedy(vllm)
    assert moved["weight_version"] == 7
    served = _vllm_logprobs(moved)
    assert (served - _transformers_logprobs(perturbed, moved)).abs().max() < 2e-3  # the perturbed model's
    if moved["choices"][0]["token_ids"] == baseline["choices"][0]["token_ids"]:
        assert (served - _vllm_logprobs(baseline)).abs().max() > 1e-2  # and not the old one's

    assert vllm.update_weights(checkpoint_dir=str(model_dir)) == 8  # unlabelled: one more than the last
    restored = _greedy(vllm)
    assert restored["weight_version"] == 8
    assert restored["choices"][0]["token_ids"] == baseline["choices"][0]["token_ids"]
    assert torch.equal(_vllm_logprobs(restored), _vllm_logprobs(baseline))


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda t: {k: v for k, v in t.items() if k != PERTURBED}, "1 tensor(s) missing"),
        (lambda t: t | {PERTURBED: torch.zeros(3, 3)}, "of another shape"),
        (lambda t: t | {"model.layers.99.extra.weight": torch.zeros(2)}, "unexpected tensor"),
    ],
    ids=["missing", "reshaped", "extra"],
)
def test_a_checkpoint_vllm_cannot_load_whole_is_refused_and_the_old_weights_keep_serving(
    vllm, model_dir, tmp_path, edit, problem
):
    before = _greedy(vllm)
    bad = _checkpoint(model_dir, tmp_path / "bad", lambda tensors: {k: v * 2 for k, v in edit(tensors).items()})
    with pytest.raises(WeightUpdateError, match=rf"{re.escape(problem)}.*the previous weights keep serving"):
        vllm.update_weights(checkpoint_dir=bad)
    after = _greedy(vllm)
    assert torch.equal(_vllm_logprobs(after), _vllm_logprobs(before))


def test_a_truncated_checkpoint_is_refused_before_anything_is_sent(vllm, model_dir, tmp_path):
    bad = tmp_path / "torn"
    shutil.copytree(model_dir, bad)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightUpdateError, match="truncated"):
        vllm.update_weights(checkpoint_dir=str(bad))
    _greedy(vllm)


def test_a_reload_that_fails_inside_vllm_stops_every_replica_and_says_so(vllm, model_dir, tmp_path, monkeypatch):
    """Stops the module's server: keep this test last."""
    bad = _checkpoint(model_dir, tmp_path / "bad", lambda t: t | {PERTURBED: torch.zeros(3, 3)})
    monkeypatch.setattr(VllmReplicas, "check_checkpoint", lambda self, path: {})  # let vLLM itself meet it
    with pytest.raises(WeightUpdateError, match="every replica was stopped so that none serves mixed weights"):
        vllm.update_weights(checkpoint_dir=bad)
    with pytest.raises(OSError):  # nothing listens any more
        call_json("GET", vllm.base_urls[0].removesuffix("/v1") + "/health", timeout_s=5)
