"""The training scripts' per-step console table: fixed-width columns of chosen metrics, ``-`` where one is absent."""

from collections.abc import Sequence

Column = tuple[str, str, str]  # (metric key, title, format)


def _width(key: str, fmt: str) -> int:
    return 5 if key == "step" else len(fmt.format(0))


def header(columns: Sequence[Column]) -> str:
    return " ".join(title.rjust(_width(key, fmt)) for key, title, fmt in columns)


def row(columns: Sequence[Column], step: int, metrics: dict) -> str:
    values = {"step": step, **metrics}
    cells = []
    for key, _, fmt in columns:
        value = values.get(key)
        cells.append(fmt.format(value) if isinstance(value, int | float) else "-".rjust(_width(key, fmt)))
    return " ".join(cells)
