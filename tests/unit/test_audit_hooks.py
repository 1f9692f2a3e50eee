"""No library our servers and trainer import installs a Python audit hook.

CPython calls every audit hook on every audited event, and ``id()`` is one: ``copy.deepcopy`` calls it for each
object it visits. filelock >= 3.30 installs such a hook at import (Ray imports filelock), which made tau2's state
copies (episode forks, copy-on-access DB entries, a pivot's branches) 1.6-1.8x slower in every Gym server
(``bench/audit_hook_cost.py``). pyproject.toml constrains it; this fails when a hook comes back, from filelock or any
other import of the stack.
"""

import subprocess
import sys

# What the Gym servers' processes import (the fork template: NeMo-Gym, Ray, tau2, our servers) and what brings
# filelock into the trainer (huggingface_hub, under transformers); torch itself is left out (seconds of import).
STACK = ["nemo_tau2.gym.resources_server.app", "nemo_tau2.gym.agent.app", "huggingface_hub"]

PROBE = f"""
import sys
installed = []
add = sys.addaudithook
def recording(hook):
    installed.append(f"{{getattr(hook, '__module__', '?')}}.{{getattr(hook, '__qualname__', hook)}}")
    add(hook)
sys.addaudithook = recording
import importlib
for name in {STACK!r}:
    importlib.import_module(name)
print("hooks:", installed)
"""


def test_importing_the_stack_installs_no_audit_hook():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("hooks:"))
    assert line == "hooks: []", f"{line}: every id() (each object copy.deepcopy visits) now runs these"
