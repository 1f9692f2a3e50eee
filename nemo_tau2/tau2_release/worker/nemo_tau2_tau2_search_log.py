"""What an episode of a knowledge domain retrieved and unlocked, read from the trajectory tau2 scores.

tau2 v1.0.1 scores banking_knowledge on the final DB and the gold actions only; it never says whether the agent found
the task's ``required_documents`` or which discoverable tools it unlocked. This summary, returned with each verdict,
lets a report put success beside retrieval. It reads the same messages ``evaluate_simulation`` reads, and the
documents and file names tau2's own knowledge base and sandbox use:

- ``KB_search*`` and ``grep`` return documents by id (tau2's ``ID: <doc_id>`` line per result);
- ``shell`` returns a document when its output shows the document's text: a grep-style line ``<file>:<text>``
  (``grep -c``'s ``<file>:<count>`` lines and bare file names, as from ``ls`` or ``grep -l``, show no text), or the
  document's title (or, as JSON, its ``"id"``) from a command that names its file (``cat``, ``head``).

A call counts only when its answer is not an error. Recall is None when the task names nothing to find.
"""

import json
import re

from nemo_tau2_tau2_retrieval import KNOWLEDGE_DOMAINS

SEARCH_TOOLS = ("KB_search", "KB_search_bm25", "KB_search_dense", "grep", "shell")
_LISTED_ID = re.compile(r"^\s*ID: (\S+)\s*$", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z0-9_-]+")  # a file name's stem, as tau2's sandbox writes it, is one such word
_FILE_LINE = re.compile(r"^(?:\S*/)?([^\s:/]+)\.(?:md|txt|json)[:-](.*)$", re.MULTILINE)


class KnowledgeFiles:
    """The knowledge base's documents by id, and by the file name tau2's sandbox exports each one under."""

    def __init__(self) -> None:
        self._titles: dict[str, str] | None = None
        self._by_stem: dict[str, str] = {}

    def _load(self) -> dict[str, str]:
        if self._titles is None:
            from tau2.domains.banking_knowledge.environment import get_knowledge_base
            from tau2.knowledge.sandbox_manager import SandboxManager

            documents = get_knowledge_base().get_all_documents()
            self._titles = {doc.id: doc.title for doc in documents}
            # tau2's own file-name rule (it reads no instance state)
            self._by_stem = {SandboxManager._sanitize_filename(None, doc.id): doc.id for doc in documents}
        return self._titles

    def in_answer(self, tool: str, arguments: dict, answer: str) -> list:
        """The documents a retrieval call's answer shows, in the order it shows them."""
        titles = self._load()
        if tool != "shell":
            return list(dict.fromkeys(doc for doc in _LISTED_ID.findall(answer) if doc in titles))
        shown = [
            self._by_stem[stem]
            for stem, text in _FILE_LINE.findall(answer)
            if stem in self._by_stem and not text.strip().isdigit()
        ]
        named = set(_WORD.findall(str(arguments.get("command", ""))))
        for stem in named & self._by_stem.keys():
            doc = self._by_stem[stem]
            if titles[doc] in answer or f'"id": "{doc}"' in answer:  # md/txt show the title, json the id
                shown.append(doc)
        return list(dict.fromkeys(shown))


def _arguments(raw) -> dict:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _recall(found: list, wanted: list):
    return None if not wanted else round(len(set(found) & set(wanted)) / len(set(wanted)), 6)


def _gold(task, name: str, key: str) -> list:
    actions = (task.evaluation_criteria.actions if task.evaluation_criteria else None) or []
    return list(dict.fromkeys(str(a.arguments.get(key)) for a in actions if a.name == name and key in a.arguments))


def search_log(task, messages: list, files: KnowledgeFiles) -> dict:
    """The episode's searches (tool, arguments, documents shown), the documents found against the task's
    ``required_documents``, and the discoverable tools unlocked, called and given against the gold actions."""
    answers = {m.id: m for m in messages if getattr(m, "role", None) == "tool"}
    searches, unlocked, called, given = [], [], [], []
    calls = [call for m in messages if getattr(m, "role", None) == "assistant" for call in m.tool_calls or []]
    for call in calls:
        answer = answers.get(call.id)
        text = (answer.content or "") if answer is not None else ""
        failed = answer is None or answer.error or text.startswith("Error")
        arguments = _arguments(call.arguments)
        if call.name in SEARCH_TOOLS:
            documents = [] if failed else files.in_answer(call.name, arguments, text)
            searches.append({"tool": call.name, "arguments": arguments, "documents": documents})
        elif failed:
            continue
        elif call.name == "unlock_discoverable_agent_tool":
            unlocked.append(str(arguments.get("agent_tool_name")))
        elif call.name == "call_discoverable_agent_tool":
            called.append(str(arguments.get("agent_tool_name")))
        elif call.name == "give_discoverable_user_tool":
            given.append(str(arguments.get("discoverable_tool_name")))
    found = list(dict.fromkeys(doc for search in searches for doc in search["documents"]))
    required = list(task.required_documents or [])
    gold_unlocks = _gold(task, "unlock_discoverable_agent_tool", "agent_tool_name")
    unlocked = list(dict.fromkeys(unlocked))
    return {
        "searches": searches,
        "documents_found": found,
        "required_documents": required,
        "document_recall": _recall(found, required),
        "tools_unlocked": unlocked,
        "gold_unlocks": gold_unlocks,
        "unlock_recall": _recall(unlocked, gold_unlocks),
        "extra_unlocks": [tool for tool in unlocked if tool not in gold_unlocks],
        "agent_tools_called": list(dict.fromkeys(called)),
        "gold_agent_tool_calls": _gold(task, "call_discoverable_agent_tool", "agent_tool_name"),
        "user_tools_given": list(dict.fromkeys(given)),
        "gold_user_tools_given": _gold(task, "give_discoverable_user_tool", "discoverable_tool_name"),
    }


_FILES = KnowledgeFiles()


def retrieval_of(domain: str, task, messages: list) -> dict:
    """``{"retrieval": search_log(...)}`` for a knowledge domain's episode, else nothing."""
    return {"retrieval": search_log(task, messages, _FILES)} if domain in KNOWLEDGE_DOMAINS else {}
