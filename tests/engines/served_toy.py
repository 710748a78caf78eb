"""An engine process with nothing of an engine in it (started by tests/engines/test_served.py): its
requests wait, or hold the interpreter, for as long as they are told; ``echo`` answers any rank,
several askers at once."""

import ctypes
import time

from drmas.engines.service import serve as serve_requests


class Toy:
    batched = {"echo": "echo_many"}  # what any rank may ask, several askers' requests in one call

    def echo_many(self, calls):
        return [call["value"] for call in calls]

    def wait(self, seconds: float) -> float:
        time.sleep(seconds)  # lets the interpreter go: the heartbeat beats on
        return seconds

    def hold(self, seconds: float) -> float:
        # a native call that keeps the interpreter (a PyDLL's functions hold the GIL): no beat
        ctypes.PyDLL(None).sleep(int(seconds))
        return seconds


def serve(fd: str) -> None:
    serve_requests(fd, lambda: (Toy(), {}))
