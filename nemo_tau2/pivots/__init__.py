"""Turn-level RL on tau2 (PivotRL): pivots out of stored trajectories, profiled by a frozen policy, rewarded by what
an action does in a fork of its state (docs/pivot-rl.md).

- :mod:`.actions`: one assistant turn as an action, in NeMo-Gym's pivot row contract (``expected_action``);
- :mod:`.sources`: trajectories read from our rollouts, tau2's results files and SFT conversations;
- :mod:`.gold`: tau2's gold demonstrations as trajectories;
- :mod:`.candidates`: every assistant turn of a trajectory as a pivot row: the prompt, the demonstrated action and
  what rebuilds its state; :mod:`.prepare` writes them for a release, each marked with its tau2 split;
- :mod:`.profile`: K samples per candidate from an OpenAI-compatible endpoint, each scored by the resources server's
  functional verdict (``/verify_pivot``), and PivotRL's filter.
"""
