"""The memory plan as people read it (``--plan``): a table per device, GB = 10^9 bytes, apart from the arithmetic in
:mod:`nemo_tau2.models.memory_plan`."""

from nemo_tau2.models.memory_plan import GB, MemoryPlan


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def format_plan(plan: MemoryPlan) -> str:
    """The plan as a readable table (GB = 10^9 bytes)."""
    m = plan.model
    lines = [
        f"model {m.name}: {_count(m.parameters)} parameters ({m.num_blocks} blocks of {_count(m.block_parameters)}, "
        f"{_count(m.root_parameters)} outside them), from {m.source}",
        "memory in GB (10^9 bytes), estimated per device:",
    ]
    for device in plan.devices:
        lines.append(
            f"{device.what} x {device.count}, each within {device.budget_bytes / GB:.1f} GB ({device.budget_source}):"
        )
        lines += [f"  {value / GB:9.2f} GB  {name}" for name, value in device.items.items()]
        lines.append(f"  {device.total_bytes / GB:9.2f} GB  total: {'fits' if device.fits else 'DOES NOT FIT'}")
        lines += [f"  {value / GB:9.2f} GB  {name}, in host memory" for name, value in device.host_items.items()]
        lines += [f"  note: {note}" for note in device.notes]
    available = f" of {plan.gpus_available}" if plan.gpus_available is not None else ""
    lines.append(f"GPUs: {plan.gpus_needed}{available}")
    lines.append("plan: fits" if plan.fits else "plan: does not fit")
    lines += [f"  - {problem}" for problem in plan.problems]
    return "\n".join(lines)
