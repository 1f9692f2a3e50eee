"""What ``bench/peer_nemo_gym_tau2.py`` measures on both sides alike: episodes posted to an agent's ``/run`` by one
client, the CPU time of a side's processes, and what each answer holds for training."""

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Posted:
    """One ``/run``: its HTTP status (0: no answer within the client's limit), answer and wall time."""

    status: int
    body: Any
    seconds: float
    error: str = ""


async def _post_all(url: str, rows: list[dict], concurrency: int, timeout_s: float) -> list[Posted]:
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:

        async def one(row: dict) -> Posted:
            async with gate:
                began = time.perf_counter()
                try:
                    async with http.post(f"{url}/run", data=orjson.dumps(row),
                                         headers={"content-type": "application/json"}) as response:  # fmt: skip
                        raw = await response.read()
                        body = orjson.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode(errors="replace")
                        return Posted(response.status, body, time.perf_counter() - began)
                except (TimeoutError, aiohttp.ClientError) as e:
                    return Posted(0, None, time.perf_counter() - began, f"{type(e).__name__}: {e}")

        return await asyncio.gather(*(one(row) for row in rows))


def post_all(url: str, rows: list[dict], concurrency: int, timeout_s: float = 300.0) -> tuple[list[Posted], float]:
    """Every row's ``/run``, ``concurrency`` at a time; the answers in row order and the wall seconds of all."""
    began = time.perf_counter()
    posted = asyncio.run(_post_all(url, rows, concurrency, timeout_s))
    return posted, time.perf_counter() - began


# --------------------------------------------------------------------------------------------------- CPU time


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def side_pids(root: int) -> set[int]:
    """``root``'s session and every descendant of it (a server that started a session of its own included)."""
    parents: dict[int, int] = {}
    sessions: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)], sessions[int(entry.name)] = int(fields[1]), int(fields[3])
    found = {pid for pid, session in sessions.items() if session == root} | {root}
    grown = True
    while grown:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        found |= children
        grown = bool(children)
    return found & set(parents)


def kill_side(root: int) -> None:
    """SIGKILL to what is left of a side: ``root``'s session and descendants (Ray's agents outlive ``ng_run``)."""
    for pid in side_pids(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def cpu_seconds(pids: set[int]) -> float:
    """User + system CPU of the processes, their reaped children's included."""
    total = 0
    for pid in pids:
        if (fields := _stat(pid)) is not None:
            total += sum(int(value) for value in fields[11:15])
    return total / CLOCK_TICKS


@dataclass
class CpuMeter:
    """CPU seconds a side's processes (found from its root at the start) spend between ``start`` and ``stop``."""

    root: int
    pids: set[int] = field(default_factory=set)
    began: float = 0.0

    def start(self) -> None:
        self.pids = side_pids(self.root)
        self.began = cpu_seconds(self.pids)

    def stop(self) -> float:
        return cpu_seconds(self.pids) - self.began


# ------------------------------------------------------------------------------------------------ training data


def _contiguous(turns: list[tuple[list[int], list[int]]]) -> list[bool]:
    """Per policy turn after the first: does its prompt begin with the previous turn's prompt + generation?"""
    return [
        later[0][: len(earlier[0]) + len(earlier[1])] == earlier[0] + earlier[1]
        for earlier, later in zip(turns, turns[1:], strict=False)
    ]


def our_turns(body: dict) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, generated ids) per policy turn of our answer: on its output's assistant items."""
    turns = []
    for item in body["response"]["output"]:
        if item.get("prompt_token_ids") and item.get("generation_token_ids"):
            turn = (list(item["prompt_token_ids"]), list(item["generation_token_ids"]))
            if not turns or turns[-1] != turn:  # a turn's text and tool-call items carry the same ids
                turns.append(turn)
    return turns


def their_turns(body: dict) -> tuple[list[tuple[list[int], list[int]]], bool]:
    """(prompt ids, generated ids) per policy turn of their answer, and whether any output item carries them: their
    output items hold none, so they are read from tau2's messages' ``raw_data`` (the model server's answer)."""
    on_items = any(item.get("prompt_token_ids") or item.get("generation_token_ids")
                   for item in body.get("response", {}).get("output", []))  # fmt: skip
    turns = []
    for message in (body.get("result") or {}).get("messages", []):
        if message.get("role") != "assistant" or not message.get("raw_data"):
            continue
        choice = (message["raw_data"].get("choices") or [{}])[0].get("message") or {}
        fields = {**(choice.get("provider_specific_fields") or {}), **choice}
        if fields.get("prompt_token_ids") and fields.get("generation_token_ids"):
            turns.append((list(fields["prompt_token_ids"]), list(fields["generation_token_ids"])))
    return turns, on_items


def training_data(turns: list[tuple[list[int], list[int]]], policy_turns: int, on_items: bool) -> dict:
    contiguous = _contiguous(turns)
    return {
        "policy_turns": policy_turns,
        "turns_with_token_ids": len(turns),
        "token_ids_on_output_items": on_items,
        "contiguous_turns": sum(contiguous) + (1 if turns else 0),
        "breaks": len(contiguous) - sum(contiguous),
    }
