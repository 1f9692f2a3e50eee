"""The two fields every tau2 request names its task with (rows, /seed_session, /run)."""

from typing import Any

from pydantic import BaseModel, field_validator


class Tau2TaskFields(BaseModel):
    domain: str
    task_id: str

    @field_validator("task_id", mode="before")
    @classmethod
    def _task_id_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) else value  # airline/retail ids are numbers written as text
