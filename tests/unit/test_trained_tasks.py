"""nemo_tau2/trained_tasks.py: the record an exported model carries of the tasks it trained on, and what an eval of
it says. The whole path (SFT then RFT on banking_knowledge, an eval of the result, its report) runs in
tests/unit/tau2_release/test_banking_training.py."""

import json

from nemo_tau2.trained_tasks import (
    TRAINED_ON_FILE,
    describe,
    evaluated_tasks_trained_on,
    read_trained_on,
    trained_on_record,
    write_trained_on,
)

PLAYED = {"tau2_version": "v1.0.1", "retrieval_variant": "bm25_grep"}


def test_a_record_names_its_rows_tasks_and_those_of_the_model_it_started_from(tmp_path):
    first = trained_on_record(PLAYED, [{"domain": "banking_knowledge", "task_id": "task_004"}], "Qwen/Qwen3-4B")
    assert first == PLAYED | {"train_tasks": ["banking_knowledge/task_004"]}  # a model name: nothing inherited
    write_trained_on(tmp_path, first)
    second = trained_on_record(PLAYED, [{"domain": "airline", "task_id": 3}, {"domain": "airline", "task_id": 3}],
                               tmp_path)  # fmt: skip
    assert second["train_tasks"] == ["airline/3", "banking_knowledge/task_004"]


def test_no_record_cut_short_or_malformed_says_nothing(tmp_path):
    assert read_trained_on(None) is None and read_trained_on(tmp_path) is None
    (tmp_path / TRAINED_ON_FILE).write_text('{"train_tasks": ["airl')
    assert read_trained_on(tmp_path) is None and evaluated_tasks_trained_on(tmp_path, ["airline/1"], None) is None
    (tmp_path / TRAINED_ON_FILE).write_text(json.dumps({"train_tasks": "airline/1"}))
    assert read_trained_on(tmp_path) is None


def test_an_eval_lists_the_tasks_it_played_that_were_trained_on_and_another_variant(tmp_path):
    write_trained_on(tmp_path, PLAYED | {"train_tasks": [f"banking_knowledge/task_00{i}" for i in range(8)]})
    played = [f"banking_knowledge/task_00{i}" for i in range(2, 10)]
    found = evaluated_tasks_trained_on(tmp_path, played + played, "grep_only")
    assert found["num_eval_tasks"] == 8 and found["eval_tasks_trained_on"] == played[:6]
    lines = describe(found).splitlines()
    assert lines[0].startswith("checkpoint: trained on 6 of these 8 tasks, not held out: banking_knowledge/task_002, ")
    assert "... (1 more)" in lines[0] and lines[1] == (
        "checkpoint: trained with retrieval variant bm25_grep, evaluated on grep_only"
    )
    held_out = evaluated_tasks_trained_on(tmp_path, ["airline/1"], None)
    assert describe(held_out).startswith("checkpoint: none of these 1 tasks was trained on (")
    # a summary an older version wrote (no played variant): described as far as it goes
    assert describe({"eval_tasks_trained_on": ["airline/1"], "num_eval_tasks": 1, "record": "r"}) == (
        "checkpoint: trained on 1 of these 1 tasks, not held out: airline/1 (r)"
    )
