"""The conversation every PyTorch process of trainbench has with the C++ side that measures it (benchsuite's
PyTorch rows, peers.py; autotune's worker, worker.py): one JSON object a line in, one answer a line
out, until the other end closes. A request that is not JSON, or whose handling fails, is answered {"error": ...}
and the conversation goes on."""

from __future__ import annotations

import ctypes
import json
import os
import signal
from typing import Callable, TextIO


def answer(answers: TextIO, message: dict) -> None:
    answers.write(json.dumps(message) + "\n")
    answers.flush()


def converse(requests: TextIO, answers: TextIO, handle: Callable[[dict], dict],
             describe_failure: Callable[[BaseException], str] = str) -> int:
    """Answers each request with handle(request); 0 when the other end closed the conversation."""
    for line in requests:
        try:
            request = json.loads(line)
            answer(answers, handle(request) if isinstance(request, dict) else {"error": "a request is a JSON object"})
        except json.JSONDecodeError as e:
            answer(answers, {"error": f"not JSON: {e.msg}"})
        except Exception as e:   # noqa: BLE001 - the request fails, not the conversation
            answer(answers, {"error": describe_failure(e)})
    return 0


def die_with_parent() -> None:
    """The kernel ends this process when autotune ends, however it ends (kill -9 included): a worker never outlives
    its tune and never keeps a GPU's memory."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:          # the parent ended before the call
            os._exit(1)
    except (OSError, AttributeError):
        pass
