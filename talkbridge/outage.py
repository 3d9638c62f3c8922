"""A loop's store trouble, said once: the cluster's loops and the durable hook worker retry every
second or faster while Redis is down, and a warning on each retry (about four a second from one
node) buries what else is logged. Outside `talkbridge.cluster`, which needs the redis extra."""

from __future__ import annotations

import logging
import time


class Outage:
    """`failed` on each failure of one loop's Redis call, `worked` on each success: the first
    failure is a warning, the next ones are debug lines, and the recovery is said with how long
    it took."""

    def __init__(self, what: str, logger: logging.Logger) -> None:
        self.what = what
        self._log = logger
        self._since: float | None = None

    def failed(self, exc: BaseException) -> None:
        if self._since is None:
            self._since = time.monotonic()
            self._log.warning("%s failed: %s; retrying until it works again", self.what, exc)
        else:
            self._log.debug("%s failed again: %s", self.what, exc)

    def worked(self) -> None:
        if self._since is not None:
            took = time.monotonic() - self._since
            self._since = None
            self._log.info("%s works again, after %.1f s", self.what, took)
