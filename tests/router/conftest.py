"""Router test plumbing: run `async def` tests on a fresh event loop, bounded so a hang fails.

pytest-asyncio is not a dependency; this hook runs coroutine tests of this directory itself.
The bound is a safety net against deadlocks, not a performance assertion.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

HANG_GUARD_S = 60.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {n: pyfuncitem.funcargs[n] for n in names}
        asyncio.run(asyncio.wait_for(pyfuncitem.obj(**kwargs), HANG_GUARD_S))
        return True
    return None
