"""tau2's ``Tool.parse_data``, memoised for the worker's process.

tau2 v1.0.1 turns every tool method into a ``Tool`` whenever a toolkit lists its tools (``ToolKitBase.get_tools``):
``evaluate_simulation`` does it for the agent's and the user's toolkit on every score (``get_tool_types``), and
``build_user`` for the user's tools on every seed. Each ``Tool`` parses its method's docstring and builds two
pydantic models (``Tool.parse_data``: ``create_model`` for the parameters and the return), ~2 ms a tool, 25 ms a
verify. What ``parse_data`` returns is a function of its arguments alone (the signature, the docstring, the
predefined arguments): the memo calls tau2's own ``parse_data`` once per distinct argument triple and hands each
later call a fresh dict of the same values. Its models are classes that nothing mutates (``openai_schema`` and the
tool types read them); its lists are copied by the ``Tool``'s own validation.
"""

from tau2.environment.tool import Tool

_parsed: dict = {}


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
