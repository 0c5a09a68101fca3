"""The shell's unit tests (devheal.kube, devheal.controller against the in-memory API server).

Every async test here runs in its own loop on virtual time (``tests.shell.virtual_time``);
a module opts in with ``pytestmark = pytest.mark.asyncio(loop_scope="function")``.
"""

from tests.shell.fixtures import api, kube, no_leaked_tasks, pytest_asyncio_loop_factories

__all__ = ["api", "kube", "no_leaked_tasks", "pytest_asyncio_loop_factories"]
