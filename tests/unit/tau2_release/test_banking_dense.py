"""banking_knowledge's dense variants on an embedding endpoint of the run's choosing (``tau2.embeddings``), here the
fake server's deterministic ``/v1/embeddings``: every reward and tool answer is tau2 v1.0.1's own, its reference
run pointed at the same endpoint tau2's way (``OPENAI_BASE_URL``); the corpus is embedded once per model and
corpus (a second start embeds no document); an endpoint that fails mid-episode is an infrastructure error (never a
tool answer the policy is scored on) and the retried call then answers as tau2 does; a missing key or an endpoint
that cannot embed is refused at start in one line; the eval's Gym servers serve the variant end to end."""

import json
import subprocess
from pathlib import Path

import pytest

from nemo_tau2.evals.eval import run_eval, setup_eval
from nemo_tau2.tau2_release.client import Tau2ServiceError, Tau2Worker, Tau2WorkerError, worker_environment
from nemo_tau2.tau2_release.config import EmbeddingsConfig, NLJudgeConfig, Tau2ReleaseConfig
from nemo_tau2.testing.fake_server import start_fake_server
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.banking_eval import banking_eval_config
from tests.unit.tau2_release.episode_scripts import episode_scripts
from tests.unit.tau2_release.test_parity_v1 import assert_same_as_tau2, reference_results, start_references
from tests.unit.tau2_release.worker_episodes import play, play_every_script, summary

DOMAIN = "banking_knowledge"
VARIANT = "openai_embeddings_grep"
MODEL = "text-embedding-3-large"  # the variant's own: tau2's reference asks for it too


@pytest.fixture(scope="module")
def embedder():
    with start_fake_server() as server:
        yield server


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("embeddings")


def _config(judge, embedder, cache_dir: Path, **embeddings) -> Tau2ReleaseConfig:
    return Tau2ReleaseConfig(
        version="v1.0.1",
        python=tau2_v1_python(),
        judge=NLJudgeConfig(model="scripted-judge", base_url=judge.base_url, max_attempts=1),
        retrieval_variant=VARIANT,
        embeddings=EmbeddingsConfig(base_url=embedder.base_url, cache_dir=str(cache_dir), **embeddings),
    )


@pytest.fixture(scope="module")
def dense_worker(judge, embedder, cache_dir):
    with Tau2Worker(_config(judge, embedder, cache_dir)) as worker:
        yield worker


def _same_as_tau2_on(worker: Tau2Worker, judge, endpoint: str, tmp_path: Path) -> list[str]:
    """Every ninth task, its oracle and perturbations (``extra_reads`` searches the knowledge base), played by
    ``worker`` and by tau2's own run of its variant pointed at ``endpoint`` tau2's way (``OPENAI_BASE_URL``):
    identical rewards, breakdowns and tool answers, every oracle 1.0. Returns the searches' answers."""
    greeting = worker.request("greeting")
    every = worker.request("tasks", domain=DOMAIN, split="base")
    tasks = [task for index, task in enumerate(every) if index % 9 == 0]
    tau2_endpoint = {"OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": "none"}
    variant = worker.retrieval["variant"]
    references = start_references({DOMAIN: tasks}, judge.base_url, tau2_endpoint, tmp_path, retrieval_variant=variant)
    ours = play_every_script(worker, DOMAIN, tasks, greeting)
    assert_same_as_tau2(ours, reference_results(references))
    assert all(ours[key]["reward"] == 1.0 for key in ours if key.endswith("/oracle"))
    return [ours[key]["tool_answers"][0]["content"] for key in ours if key.endswith("/extra_reads")]


def test_dense_retrieval_scores_and_answers_as_tau2_on_the_same_endpoint(dense_worker, judge, embedder, tmp_path):
    """Every ninth task, its oracle and perturbations (``extra_reads`` searches the knowledge base), ours and tau2's
    own run on the same endpoint: identical rewards, breakdowns and tool answers; the searches are dense ones."""
    assert dense_worker.retrieval["embeddings"]["counts"]["document_texts"] == 698  # a fresh cache: all embedded
    searches = _same_as_tau2_on(dense_worker, judge, embedder.base_url, tmp_path)
    assert searches and all("Score:" in answer for answer in searches)
    assert embedder.stats().texts_embedded_by_model[MODEL] >= 2 * 698  # both sides embedded through it


def test_a_second_start_embeds_no_document(judge, embedder, cache_dir, dense_worker):
    before = embedder.stats().texts_embedded_by_model[MODEL]
    with Tau2Worker(_config(judge, embedder, cache_dir)) as second:
        assert second.retrieval["embeddings"]["counts"]["document_texts"] == 0
        assert embedder.stats().texts_embedded_by_model[MODEL] == before
    assert [path.suffix for path in cache_dir.iterdir() if not path.name.startswith(".")] == [".npz"]


def test_an_endpoint_failing_mid_episode_is_an_infrastructure_error_and_the_retry_answers(dense_worker, embedder):
    task = next(t for t in dense_worker.request("tasks", domain=DOMAIN, split="base") if "extra_reads" in
                episode_scripts(t, "hi"))  # fmt: skip
    script = episode_scripts(task, dense_worker.request("greeting"))["extra_reads"]
    alone = summary(play(dense_worker, DOMAIN, task["id"], script))
    seeded = dense_worker.request("seed", domain=DOMAIN, task_id=task["id"])
    search = {"name": "KB_search", "arguments": {"query": "a query never embedded before"}}
    embedder.inject_fault("http_500", route="embeddings", count=None)
    try:
        with pytest.raises(Tau2ServiceError, match=r"^openai embeddings at .* failed \(InternalServerError.* while "
                           r"answering KB_search$"):  # fmt: skip
            dense_worker.request("call_tool", episode_id=seeded["episode_id"], **search)
    finally:
        embedder.clear_faults()
    answered = dense_worker.request("call_tool", episode_id=seeded["episode_id"], **search)
    assert "Score:" in answered["content"] and not answered["error"]
    dense_worker.request("end", episode_id=seeded["episode_id"])
    assert summary(play(dense_worker, DOMAIN, task["id"], script)) == alone  # the worker serves on as before


def test_a_missing_key_or_an_endpoint_that_cannot_embed_is_refused_at_start(judge, embedder, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    hosted = _config(judge, embedder, tmp_path).model_copy(update={"embeddings": EmbeddingsConfig()})
    with pytest.raises(Tau2WorkerError) as refused:
        Tau2Worker(hosted)
    assert str(refused.value) == (
        f"tau2.retrieval_variant '{VARIANT}' calls openai's API for its embeddings and it needs $OPENAI_API_KEY, "
        "which is not set: export it, or set tau2.embeddings.base_url to an OpenAI-compatible endpoint (vLLM, "
        "llama.cpp; docs/banking-knowledge.md)"
    )
    closed = _config(judge, embedder, tmp_path).model_copy(
        update={"embeddings": EmbeddingsConfig(base_url="http://127.0.0.1:9/v1", cache_dir=str(tmp_path))}
    )
    with pytest.raises(Tau2WorkerError) as refused:
        Tau2Worker(closed)
    message = str(refused.value)
    assert message.startswith("tau2.embeddings: openai embeddings at http://127.0.0.1:9/v1/ failed (APIConnection")
    assert message.endswith("while embedding the knowledge base") and "\n" not in message


def test_the_eval_serves_a_dense_variant_through_its_gym_servers(judge, embedder, cache_dir, release_tasks, tmp_path):
    """The oracle on five tasks through an eval's Gym servers, the ``tau2.embeddings`` block carried to the
    resources server's workers (which find the corpus embedded: the cache is this module's)."""
    before = embedder.stats().texts_embedded_by_model[MODEL]
    raw = banking_eval_config(
        tmp_path,
        judge,
        release_tasks,
        f"++tau2.retrieval_variant={VARIANT}",
        f"++tau2.embeddings.base_url={embedder.base_url}",
        f"++tau2.embeddings.cache_dir={cache_dir}",
        "data.num_tasks=5",
    )
    summary_, _ = run_eval(setup_eval(raw), raw)
    records = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines() if line.strip()]
    assert [r.get("reward") for r in records] == [1.0] * 5, [(r["task_id"], r.get("error")) for r in records]
    assert {r["retrieval_variant"] for r in records} == {VARIANT} and summary_["retrieval_variant"] == VARIANT
    prompts = json.loads((tmp_path / "system_prompts.json").read_text())
    assert "KB_search" in prompts["prompts"][0]
    assert embedder.stats().texts_embedded_by_model[MODEL] - before < 698  # queries at most: no corpus again


RERANKED = "bm25_reranker_grep"


@pytest.fixture(scope="module")
def reranked_worker(judge):
    """bm25_reranker_grep, its LLM reranker the scripted judge's endpoint (which rates as tau2's prompt asks)."""
    config = Tau2ReleaseConfig(
        version="v1.0.1",
        python=tau2_v1_python(),
        judge=NLJudgeConfig(model="scripted-judge", base_url=judge.base_url, max_attempts=1),
        retrieval_variant=RERANKED,
        reranker={"base_url": judge.base_url},
    )
    with Tau2Worker(config) as worker:
        yield worker


def test_the_reranker_variant_scores_and_answers_as_tau2_and_a_failed_rating_is_infrastructure(
    reranked_worker, judge, tmp_path
):
    """Every ninth task as tau2's own run with its reranker on the same endpoint (tau2's way: ``OPENAI_BASE_URL``),
    searches reranked identically; then a rating endpoint failing: tau2 would silently drop the documents whose
    rating failed (a different search result scored as the policy's), here the search is an infrastructure error."""
    searches = _same_as_tau2_on(reranked_worker, judge, judge.base_url, tmp_path)
    assert searches and all("Score: " in answer for answer in searches)  # rated documents survived the reranker

    seeded = reranked_worker.request("seed", domain=DOMAIN, task_id="task_001")
    judge.inject("http_500", count=10_000, when="<start_query>")
    try:
        with pytest.raises(Tau2ServiceError, match=r"^reranker at .* failed \(InternalServerError.* answering KB_s"):
            reranked_worker.request(
                "call_tool", episode_id=seeded["episode_id"], name="KB_search", arguments={"query": "wire transfer"}
            )
    finally:
        judge.inject("http_500", count=0)
    answered = reranked_worker.request(
        "call_tool", episode_id=seeded["episode_id"], name="KB_search", arguments={"query": "wire transfer"}
    )
    assert "Score: " in answered["content"]
    reranked_worker.request("end", episode_id=seeded["episode_id"])


# The worker's reranker, connected to the judge, rates one document in tau2's own class after the OpenAI client's
# pydantic race (a PydanticUserError raised in the client) has hit its first attempt, then its first two.
RACING_RATINGS = """
import json, sys
import nemo_tau2_tau2_services as services
import tau2.knowledge.registry as registry
from pydantic.errors import PydanticUserError
from tau2.knowledge.postprocessors.pointwise_llm_reranker import PointwiseLLMReranker

services.connect_reranker(sys.argv[1], None, None, 30.0)
reranker = registry.POSTPROCESSORS["pointwise_llm_reranker"]()
tau2_rating, races = PointwiseLLMReranker._rate_passage, [0]

def racing(self, *args):
    if races[0]:
        races[0] -= 1
        raise PydanticUserError("BaseModel cannot be instantiated directly", code="base-model-instantiated")
    return tau2_rating(self, *args)

PointwiseLLMReranker._rate_passage = racing
for races[0] in (1, 2):
    try:
        rating = reranker._rate_passage("wire transfer limits", "doc_1", "Wire transfer limits are set per day.")
    except PydanticUserError as e:
        rating = type(e).__name__
    print(json.dumps({"rating": rating, "faults": services.take_faults()}))
"""


def test_a_rating_the_client_failed_on_its_own_half_built_classes_is_asked_again_once(judge):
    """The OpenAI client's `parse` builds its response classes per thread and pydantic's class building races
    (seen once in a CI run's reranker test): the rating is asked again once and answers as tau2's own rating does;
    a second failure in a row is recorded as an infrastructure fault, as any other."""
    done = subprocess.run([tau2_v1_python(), "-c", RACING_RATINGS, judge.base_url],
                          capture_output=True, text=True, timeout=180, env=worker_environment())  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    once, twice = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert once == {"rating": 10, "faults": []}
    (fault,) = twice["faults"]
    assert twice["rating"] == "PydanticUserError" and fault.startswith(f"reranker at {judge.base_url}")
    assert "failed (PydanticUserError: BaseModel cannot be instantiated directly" in fault


def test_tau2s_default_alltools_scores_and_answers_as_tau2_with_both_services(judge, embedder, cache_dir, tmp_path):
    """alltools, tau2's own default for the domain (BM25, dense search and the shell sandbox at once): every 24th
    task's oracle and perturbations identical to tau2's own run of it on the same embedding endpoint, each oracle
    1.0; the worker connects both services."""
    config = _config(judge, embedder, cache_dir).model_copy(update={"retrieval_variant": "alltools"})
    with Tau2Worker(config) as worker:
        assert worker.retrieval["variant"] == "alltools" and {"shell", "embeddings"} <= set(worker.retrieval)
        greeting = worker.request("greeting")
        tasks = worker.request("tasks", domain=DOMAIN, split="base")[::24]
        # tau2's way of naming the endpoint; its shell sandboxes (never removed) in the test's folder
        tau2_way = {"OPENAI_BASE_URL": embedder.base_url, "OPENAI_API_KEY": "none", "TMPDIR": str(tmp_path)}
        references = start_references(
            {DOMAIN: tasks}, judge.base_url, tau2_way, tmp_path, retrieval_variant="alltools"
        )
        ours = play_every_script(worker, DOMAIN, tasks, greeting)
    assert_same_as_tau2(ours, reference_results(references))
    assert len(tasks) == 5 and all(ours[key]["reward"] == 1.0 for key in ours if key.endswith("/oracle"))
