"""The one base of every immutable document and IR record: frozen, unknown keys refused.

Frozen models hash and compare by value, so passes can share them without copying, and an
unexpected key in a file (a typo, a field from a newer version) is an error, not ignored.
"""

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
