"""tau2's ``Tool.parse_data``, memoised for the worker's process.

tau2 v1.0.1 turns every tool method into a ``Tool`` whenever a toolkit lists its tools (``ToolKitBase.get_tools``):
``evaluate_simulation`` does it for the agent's and the user's toolkit on every score (``get_tool_types``), and
``build_user`` for the user's tools on every seed. Each ``Tool`` parses its method's docstring and builds two
pydantic models (``Tool.parse_data``: ``create_model`` for the parameters and the return), ~2 ms a tool, 25 ms a
verify. What ``parse_data`` returns is a function of its arguments alone (the signature, the docstring, the
predefined arguments): the memo calls tau2's own ``parse_data`` once per distinct argument triple and hands each
later call a fresh dict of the same values. Its models are classes that nothing mutates (``openai_schema`` and the
tool types read them); its lists are copied by the ``Tool``'s own validation.

``evaluate_simulation`` builds a fresh environment on every score only to read its tools' types
(``get_tool_types``: a ``Tool`` per tool, ~1 ms a verify for telecom's 40-odd tools). A tool's type is an attribute
its decorator set on the toolkit class's method, and the tool list is the class's (``ToolKitType`` collects it at
class creation), so the answer is a function of the toolkit's class: tau2's own ``get_tool_types`` runs once per
class and each call gets a fresh dict of its answer (``evaluate_simulation`` updates the dict it gets). A toolkit
whose instance shadows one of its tools (none of tau2's does) is asked afresh.
"""

import tau2.evaluator.evaluator as evaluator
from tau2.environment.tool import Tool

_parsed: dict = {}
_tool_types: dict = {}


def memoise_tool_parsing() -> None:
    """Replace ``Tool.parse_data`` with its memoised self (once; a second call changes nothing)."""
    tau2_parse_data = Tool.parse_data
    if getattr(tau2_parse_data, "nemo_tau2_memoised", False):
        return

    def parse_data(cls, sig, docstring, predefined):
        try:
            key = (cls, sig, docstring, tuple(sorted(predefined.items())))
            hash(key)
        except TypeError:  # an unhashable default or predefined value: parse as tau2 does, unmemoised
            return tau2_parse_data.__func__(cls, sig, docstring, predefined)
        if key not in _parsed:
            _parsed[key] = tau2_parse_data.__func__(cls, sig, docstring, predefined)
        return dict(_parsed[key])

    parse_data.nemo_tau2_memoised = True
    Tool.parse_data = classmethod(parse_data)


def memoise_tool_types() -> None:
    """Have ``evaluate_simulation`` read tool types through tau2's ``get_tool_types`` memoised by toolkit class."""
    tau2_get_tool_types = evaluator.get_tool_types
    if getattr(tau2_get_tool_types, "nemo_tau2_memoised", False):
        return

    def get_tool_types(tools):
        if set(vars(tools)) & set(tools._func_tools):  # an instance-level tool: not the class's answer
            return tau2_get_tool_types(tools)
        if type(tools) not in _tool_types:
            _tool_types[type(tools)] = tau2_get_tool_types(tools)
        return dict(_tool_types[type(tools)])

    get_tool_types.nemo_tau2_memoised = True
    evaluator.get_tool_types = get_tool_types
