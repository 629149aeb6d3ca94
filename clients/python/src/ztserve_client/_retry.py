"""When a request that failed is tried again: a few times for any transient failure, and for
as long as the client's `outage_secs` allows while the server cannot be reached."""

import random
import time

# Statuses a server answers while it cannot serve for now (a proxy before a restarted one).
_OUTAGE_STATUSES = (502, 503, 504)


class _Patience:
    """When a request that failed is tried again: `retries` times with backoff, and while the
    server is unreachable (an outage), until `outage_secs` have passed without progress."""

    def __init__(self, client, stopped=None):
        self.client = client
        # A threading.Event that, once set, ends the waiting at once (a stream closed).
        self.stopped = stopped
        self.attempt = 0
        self.failing_since = None

    def progressed(self):
        self.attempt, self.failing_since = 0, None

    def wait(self, outage, retry_after):
        """Sleeps before the next attempt and says True, or says False: give up (or stopped)."""
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        waited = now - self.failing_since
        if self.attempt >= self.client.retries and not (outage and waited < self.client.outage_secs):
            return False
        # An outage is looked at every 2 s or less, so a restarted server is found soon.
        delay = min(0.2 * 2 ** min(self.attempt, 10), 2.0 if outage else 10.0) * (1 + random.random() / 2)
        try:
            delay = max(delay, min(float(retry_after), 30.0)) if retry_after else delay
        except ValueError:
            pass
        if outage:
            delay = min(delay, max(self.client.outage_secs - waited, 0.0))
        if self.stopped is not None:
            if self.stopped.wait(delay):
                return False
        else:
            time.sleep(delay)
        self.attempt += 1
        return True

    def tried(self):
        return f"after {self.attempt + 1} attempts in {time.monotonic() - (self.failing_since or time.monotonic()):.1f} s"
