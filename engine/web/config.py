"""The ``[metrics]`` and ``[dashboard]`` sections: the HTTP server and what it serves.

The one home of these settings' defaults and documentation.
"""

from typing import ClassVar

import attrs

from engine.settings import Rule, boolean, enforce_section_rules, integer, setting, text

__all__ = ["DashboardConfig", "MetricsConfig"]


@attrs.frozen
class MetricsConfig:
    """The Prometheus metrics endpoint."""

    enabled: bool | None = setting(
        None,
        "Serve Prometheus metrics (and `/healthz`, `/readyz`) over HTTP. Unset: on for "
        "`python -m engine run`, off for an engine embedded with `engine.open` or "
        "`engine.serve`; `true` or `false` decides for both.",
        boolean(optional=True),
    )
    host: str = setting(
        "127.0.0.1",
        "Address the metrics server listens on; `0.0.0.0` exposes it on every interface.",
        text(1, 255),
    )
    port: int = setting(
        9464,
        "TCP port of the metrics server; 0 picks a free port (useful in tests).",
        integer(0, 65535),
    )


@attrs.frozen
class DashboardConfig:
    """The web dashboard, served by the metrics server (`metrics.host`, `metrics.port`).

    Off loopback the dashboard needs an access token or basic-auth credentials: the service
    refuses to start without them. `/metrics`, `/healthz` and `/readyz` never need them.
    """

    enabled: bool | None = setting(
        None,
        "Serve the dashboard pages on the metrics server. Unset: on for `python -m engine run` "
        "(and `python -m engine dashboard`), off for an engine embedded with `engine.open` or "
        "`engine.serve`; `true` or `false` decides for both. With `metrics.enabled = false` "
        "and this `true`, the server runs for the dashboard alone.",
        boolean(optional=True),
    )
    token: str | None = setting(
        None,
        "Access token: a request must send `Authorization: Bearer <token>`, or sign in once "
        "with it on the dashboard's sign-in page (a cookie then carries the session). "
        "Required (or `username` and `password`) when `metrics.host` is not a loopback address.",
        text(16, 500, optional=True),
    )
    username: str | None = setting(
        None,
        "Basic-auth user name (with `password`); it is also the actor recorded on changes made "
        "through the dashboard.",
        text(1, 200, optional=True),
    )
    password: str | None = setting(
        None,
        "Basic-auth password (with `username`).",
        text(8, 500, optional=True),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            ("dashboard.username", "dashboard.password"),
            "dashboard.username and dashboard.password go together: set both for basic auth, "
            "or neither",
            lambda v: (v["dashboard.username"] is None) == (v["dashboard.password"] is None),
        ),
    )
    """The rules among these fields."""

    def __attrs_post_init__(self) -> None:
        enforce_section_rules(self, self.rules)
