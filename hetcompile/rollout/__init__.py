"""`hetcompile migrate OLD NEW`: carry out explain's migration steps with the real tools.

`plan.py` turns the Migration into actions (pure: sky argv, tables to route); `run.py` executes
them in order against `sky`, a health probe and the running router, with a journal so that a
re-run after a failure skips what is done.
"""

from hetcompile.rollout.plan import Action, RolloutError, rollout_plan
from hetcompile.rollout.run import Runner

__all__ = ["Action", "RolloutError", "Runner", "rollout_plan"]
