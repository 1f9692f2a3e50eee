"""tau2's environments for the worker, built from one DB snapshot per domain instead of the DB file each time.

tau2 v1.0.1's domain constructors (``get_environment``) read and validate the DB file whenever they are called
without a ``db`` (airline: ~120 ms), and ``evaluate_simulation`` calls its domain's constructor three times per
verify, then hashes the predicted and the gold DB (``json.dumps(db.model_dump(), sort_keys=True)``, ~90 ms each
for airline). Exact shortcuts, each still running tau2's own code:

- **Snapshots.** Each served domain's DB files are loaded once, as tau2's ``DB.load`` loads the path its
  constructor reads (``model_validate(load_file(path))``), and never mutated. Every environment is tau2's
  constructor called with ``db=`` (and ``user_db=``) a new DB from it (:class:`_SnapshotCopies`): a *fork*
  (``session_db.fork_database``, the mechanism the v0.2.1 path uses: dict collections copy an entry the first time
  it is looked up by key, other fields are deep copies), or for a DB without dict collections (telecom) a fresh
  validation of the parsed file. tau2 v1.0.1's tools mutate only what they reach by key (iteration is read-only),
  so a fork's content is always what a fresh load plus the same calls gives. The constructor is registered with
  tau2's registry under its own name (``forked_domain``, ``registry.register_domain``), so ``evaluate_simulation``
  builds its three environments through it, unchanged.
- **Hashes by content.** A fork's DB is fully determined by its snapshot plus the entries that differ from it
  (by canonical JSON, what the hash serialises) and its non-dict fields. Each forked toolkit's ``get_db_hash``
  is tau2's own, memoised on that key: the first DB with a given content is hashed by tau2; a later DB with the
  same content (the gold DB of a task seen before, the predicted DB of an episode that reached it) reuses it.
- **Text read once.** A constructor that reads text files (telecom's two policy files, on every build) reads them
  through tau2's ``load_file`` memoised on the file's path, size and modification time (text only: a ``str`` is
  immutable, so every build gets the same value tau2 would read; parsed data files are read as tau2 reads them).
- **Documents parsed once.** banking_knowledge's constructor parses and validates its 698 knowledge-base files on
  every build (``get_knowledge_base``: 50 of the 57 ms a build takes, four builds an episode); the documents are
  only read afterwards (tau2 caches the texts it indexes itself). Each build gets a new ``KnowledgeBase`` over the
  documents the first build validated, as the DB snapshots are loaded once.
"""

import gc
import importlib.util
import inspect
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import tau2.utils
from tau2.registry import registry
from tau2.utils import load_file

_SESSION_DB = Path(__file__).resolve().parents[2] / "tau2_env" / "session_db.py"


def _load_session_db():
    """nemo-tau2's ``session_db`` (standard library and pydantic only), loaded by path: this environment has
    tau2 but not nemo-tau2."""
    spec = importlib.util.spec_from_file_location("nemo_tau2_session_db", _SESSION_DB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


session_db = _load_session_db()


def _db_files(domain: str) -> dict | None:
    """Constructor argument -> (DB class, path) as the domain's ``get_environment`` loads them without a ``db``."""
    if domain == "airline":
        from tau2.domains.airline.data_model import FlightDB
        from tau2.domains.airline.utils import AIRLINE_DB_PATH

        return {"db": (FlightDB, AIRLINE_DB_PATH)}
    if domain == "retail":
        from tau2.domains.retail.data_model import RetailDB
        from tau2.domains.retail.utils import RETAIL_DB_PATH

        return {"db": (RetailDB, RETAIL_DB_PATH)}
    if domain in ("telecom", "telecom-workflow"):
        from tau2.domains.telecom.data_model import TelecomDB
        from tau2.domains.telecom.user_data_model import TelecomUserDB
        from tau2.domains.telecom.utils import TELECOM_DB_PATH, TELECOM_USER_DB_PATH

        return {"db": (TelecomDB, TELECOM_DB_PATH), "user_db": (TelecomUserDB, TELECOM_USER_DB_PATH)}
    if domain == "mock":
        from tau2.domains.mock.data_model import MockDB
        from tau2.domains.mock.user_data_model import MockUserDB
        from tau2.domains.mock.utils import MOCK_DB_PATH, MOCK_USER_DB_PATH

        return {"db": (MockDB, MOCK_DB_PATH), "user_db": (MockUserDB, MOCK_USER_DB_PATH)}
    return None


class ContentHashes:
    """tau2's DB hash, memoised on the DB's content key (least recently used entries dropped past ``size``)."""

    def __init__(self, size: int = 4096):
        self._size = size
        self._hashes: OrderedDict = OrderedDict()
        self._snapshot_json = session_db.SnapshotJsonCache()
        self.computed = 0  # hashes tau2 computed (the rest were memoised)
        self.adopted = 0  # hashes tau2 computed in a warming child (``nemo_tau2_tau2_warming``), taken in here
        #: In a warming child: every (content key, hash) tau2 computes there, for its parent to adopt.
        self.fresh: list | None = None

    def content_key(self, db) -> tuple:
        """What the DB's canonical JSON is a function of: the snapshot collections it forks, the entries of each
        that differ from the snapshot (``None``: deleted) and the canonical JSON of every other field."""
        parts: list = [type(db)]
        for name in type(db).model_fields:
            value = getattr(db, name)
            if isinstance(value, session_db.CopyOnAccessDict):
                parts.append((name, id(value.snapshot), tuple(self._changed_entries(value))))
            else:
                parts.append((name, session_db.canonical_json(db.model_dump(include={name})[name])))
        return tuple(parts)

    def _changed_entries(self, collection) -> list:
        changed = []
        for key in sorted(collection.owned, key=repr):
            present = dict.__contains__(collection, key)
            if not present:
                if key in collection.snapshot:
                    changed.append((key, None))
                continue
            text = session_db.canonical_json(collection.peek(key))
            if key not in collection.snapshot or text != self._snapshot_json.entry(collection, key):
                changed.append((key, text))
        return changed

    def hash_of(self, toolkit, tau2_hash) -> str:
        key = self.content_key(toolkit.db)
        found = self._hashes.get(key)
        if found is None:
            found = tau2_hash()
            self.computed += 1
            self._remember(key, found)
            if self.fresh is not None:
                self.fresh.append((key, found))
        else:
            self._hashes.move_to_end(key)
        return found

    def adopt(self, entries: list) -> None:
        """Hashes a forked child of this process computed with tau2's code: its content keys name this process's
        snapshots (same objects, same ids: they existed before the fork)."""
        for key, found in entries:
            if key not in self._hashes:
                self._remember(key, found)
                self.adopted += 1

    def _remember(self, key: tuple, found: str) -> None:
        self._hashes[key] = found
        if len(self._hashes) > self._size:
            self._hashes.popitem(last=False)


def _forks_collections(db) -> bool:
    return any(isinstance(getattr(db, name), session_db.CopyOnAccessDict) for name in type(db).model_fields)


class _SnapshotCopies:
    """New DBs equal to ``db_class.load(path)`` (tau2's ``DB.load``: ``model_validate(load_file(path))``), the file
    read once. A DB with dict collections (airline, retail: megabytes) is a fork of the validated snapshot; one
    without (telecom's lists: kilobytes, where deep-copying the models costs more than validating) is validated
    afresh from a fresh copy of the file's parsed data (a validated model may hold parts of its input, which tools
    then mutate): unpickled from the parsed data pickled once, which for parsed file data (dicts, lists, strings,
    numbers, dates) is an equal, unshared copy, as ``copy.deepcopy`` gives, in a fifth of its time."""

    def __init__(self, db_class, path):
        self._db_class = db_class
        data = load_file(path)
        self._pickled = pickle.dumps(data, pickle.HIGHEST_PROTOCOL)
        self._snapshot = db_class.model_validate(data)
        self.forks = any(isinstance(getattr(self._snapshot, name), dict) for name in db_class.model_fields)

    def new(self):
        if self.forks:
            return session_db.fork_database(self._snapshot)
        return self._db_class.model_validate(pickle.loads(self._pickled))


class DomainSnapshots:
    """The worker's DB snapshots and forking constructors, one per domain, made on first use."""

    def __init__(self):
        self.hashes = ContentHashes()
        self._forked_names: dict[str, str] = {}
        self._memoised: set[str] = set()  # domains whose forked DBs' hashes are memoised (dict collections)

    def forked_domain(self, domain: str) -> str:
        """The registry name whose constructor is ``domain``'s, fed forks of the snapshot (``domain`` itself
        where tau2 loads no DB file this module knows)."""
        if domain not in self._forked_names:
            self._forked_names[domain] = self._register(domain)
        return self._forked_names[domain]

    def memoises_hashes(self, domain: str) -> bool:
        """Whether ``domain``'s DB hashes are memoised here (loading its snapshot first): a forked DB's are."""
        self.forked_domain(domain)
        return domain in self._memoised

    def _register(self, domain: str) -> str:
        files = _db_files(domain)
        constructor = registry.get_env_constructor(domain)
        _load_knowledge_once(inspect.getmodule(constructor))
        if files is None or not set(files) <= set(inspect.signature(constructor).parameters):
            return domain
        copies = {argument: _SnapshotCopies(db_class, path) for argument, (db_class, path) in files.items()}
        _read_text_once(inspect.getmodule(constructor))
        if any(source.forks for source in copies.values()):
            self._memoised.add(domain)
        gc.freeze()  # the snapshots live as long as the worker: keep the collector from walking their objects again

        def build_forked(**kwargs):
            env = constructor(**{argument: source.new() for argument, source in copies.items()}, **kwargs)
            for toolkit in (env.tools, env.user_tools):
                if toolkit is not None and _forks_collections(toolkit.db):
                    self._memoise_hash(toolkit)
            return env

        name = f"{domain}+nemo-tau2-snapshot"
        registry.register_domain(build_forked, name)
        return name

    def _memoise_hash(self, toolkit) -> None:
        tau2_hash = toolkit.get_db_hash  # tau2's bound method, called on a content key it has not seen
        toolkit.get_db_hash = lambda: self.hashes.hash_of(toolkit, tau2_hash)


_texts: dict = {}


def _read_text_once(module) -> None:
    """Have ``module`` (a domain's environment module) read text files through tau2's ``load_file`` memoised."""
    if getattr(module, "load_file", None) is not tau2.utils.load_file:
        return

    def load_file_memoised(path, **kwargs):
        if kwargs or os.path.splitext(str(path))[1] not in (".md", ".txt"):
            return tau2.utils.load_file(path, **kwargs)
        status = os.stat(path)
        key = (os.path.realpath(path), status.st_size, status.st_mtime_ns)
        if key not in _texts:
            _texts[key] = tau2.utils.load_file(path)
        return _texts[key]

    module.load_file = load_file_memoised


def _load_knowledge_once(module) -> None:
    """Have ``module`` (banking_knowledge's environment module) build each environment's knowledge base from the
    documents its first build parsed: a new ``KnowledgeBase`` (its own dict) over the same validated documents."""
    load = getattr(module, "get_knowledge_base", None)
    if load is None or getattr(load, "nemo_tau2_once", False):
        return
    parsed = []

    def get_knowledge_base_once():
        if not parsed:
            parsed.append(load())
        knowledge_base = parsed[0]
        return type(knowledge_base).model_construct(documents=dict(knowledge_base.documents))

    get_knowledge_base_once.nemo_tau2_once = True
    module.get_knowledge_base = get_knowledge_base_once
