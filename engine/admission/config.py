"""The ``[admission]`` section: the dispatcher and reaper of per-scope admissions.

The one home of these settings' defaults and documentation.
"""

import attrs

from engine.settings import number, setting

__all__ = ["AdmissionConfig"]


@attrs.frozen
class AdmissionConfig:
    """Admission: per-scope concurrency enforced before a task takes a worker slot."""

    dispatch_interval: float = setting(
        0.5,
        "Seconds between dispatcher passes that admit waiting tasks into free scope slots; a "
        "lease release also wakes it.",
        number(gt=0),
    )
    reap_interval: float = setting(
        5.0,
        "Seconds between the dispatcher's passes that fail the tasks that waited for "
        "admission longer than `admission.queue_timeout`.",
        number(gt=0),
    )
    stale_after: float = setting(
        45.0,
        "Seconds after which an admitted task that has not started gives its reserved slots "
        "back and waits again, keeping its place in line. Must exceed twice "
        "`worker.refresh_interval`.",
        number(gt=0),
    )
    queue_timeout: float | None = setting(
        None,
        "Seconds a task may wait for admission before it fails (error code `queue_timeout`, "
        "found at the next `admission.reap_interval` pass); unset means no limit.",
        number(gt=0, optional=True),
    )
