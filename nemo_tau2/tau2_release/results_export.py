"""An evaluation's episodes as the tau2 release's own results files, one per domain, so tau2's tools work on them.

``tau2 view`` opens them, ``tau2 evaluate-trajs`` re-scores them (to the same rewards: the episodes were scored by
the same release from the same trajectories), ``tau2 submit prepare`` builds a leaderboard submission from them. The
release writes the file itself (``Results.save`` through its worker's ``export``), so the format is the release's.

Only scored episodes go in: an infrastructure error has no trajectory to score and leaves tau2's metrics, as in
tau2's own runs. Each episode needs the trajectory it was scored on (``tau2_messages``, kept with the transcript).
"""

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nemo_tau2.tau2_release.client import Tau2Worker
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig

RESULTS_DIR = "tau2_results"


def release_episode(record: dict[str, Any], seed: int | None) -> dict[str, Any]:
    """One rollout record in the fields the worker's ``export`` takes (``trial`` is the record's sample index)."""
    return {
        "task_id": str(record["task_id"]),
        "trial": int(record["sample_index"]),
        "seed": seed,
        "messages": record["tau2_messages"],
        "termination_reason": record["termination_reason"],
        "reward_info": record["reward_info"],
    }


def export_results(
    config: Tau2ReleaseConfig, records: Iterable[dict[str, Any]], directory: str | Path, run: dict[str, Any]
) -> dict[str, Path]:
    """Write ``<directory>/<domain>.json`` for each domain with a scored episode; returns domain -> file.

    ``run`` holds the release's run settings (``llm_agent``, ``llm_user``, ``num_trials``, ``max_steps``,
    ``max_errors``, ``seed``). Raises ``ValueError`` when a scored record lacks its trajectory (the eval ran with
    ``eval.keep_transcripts=false``).
    """
    by_domain: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["status"] != "ok":
            continue
        if record.get("tau2_messages") is None:
            raise ValueError(
                f"episode {record['domain']}/{record['task_id']} has no tau2 trajectory to export; "
                "run with eval.keep_transcripts=true"
            )
        by_domain.setdefault(str(record["domain"]), []).append(release_episode(record, run.get("seed")))
    if not by_domain:
        return {}
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    with Tau2Worker(config) as worker:
        for domain, episodes in sorted(by_domain.items()):
            episodes.sort(key=lambda episode: (episode["task_id"], episode["trial"]))
            path = folder / f"{domain}.json"
            partial = path.with_suffix(".json.partial")  # renamed into place whole: a crash leaves no torn file
            worker.request("export", path=str(partial), domain=domain, run=run, episodes=episodes)
            partial.replace(path)
            files[domain] = path
    return files
