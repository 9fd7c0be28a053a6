#!/usr/bin/env python3
"""A scripted gRPC C-core server (grpcio) for the interop test in main.rs beside this file.

Every method except the control ones runs one unary script handler with identity (raw
bytes) serializers, so a client needs no protobuf definitions. The request payload is a
JSON script that names the call and says what each of its attempts does:

    {"call": 3, "fail": [14, 14], "pushback": ["20", null], "delay": [0, 500]}

A "calls" object overrides these fields for some call ids, so that one payload template
(the probe replaces {call} with the call's index) can script each call differently:

    {"call": {call}, "calls": {"0": {"delay": [300]}, "2": {"fail": [13]}}}

Attempt i (zero-based, counted per call id by the server)
1. waits delay[i] ms, if given (the wait ends early when the client cancels);
2. if "await_call" names another call id, waits until an attempt of that call has ended
   (so a test can order calls without relying on timing);
3. fails with status code fail[i], if given and not 0 or null, with trailing metadata
   grpc-retry-pushback-ms: pushback[i] if given and not null (sent verbatim);
4. else answers OK with {"call": c, "attempt": i}.

Every attempt is recorded: call id, attempt index, method, the grpc-previous-rpc-attempts
metadata it carried (raw string or null), the time the client left it (from its
grpc-timeout, in ms, or null), arrival and end time in ms since the server started
(monotonic clock), whether the client cancelled it, and the status code it got.
/interop.Control/Records returns every record as a JSON array.

The server binds 127.0.0.1 on a port the OS picks, prints the port as the first line of
stdout, and runs until stdin reaches end of file (the test holds a pipe to it, so the
server ends with the test even when the test is killed) or --max-seconds pass.

Usage: python3 server.py [--max-seconds N]
"""

import argparse
import json
import sys
import threading
import time
from concurrent import futures

import grpc

RECORDS_METHOD = "/interop.Control/Records"
PUSHBACK_KEY = "grpc-retry-pushback-ms"
PREVIOUS_ATTEMPTS_KEY = "grpc-previous-rpc-attempts"
# No test needs more; a script cannot make the server wait longer.
MAX_DELAY_MS = 30_000

STATUS_BY_CODE = {status.value[0]: status for status in grpc.StatusCode}
START = time.monotonic()


def now_ms():
    return round((time.monotonic() - START) * 1000.0, 3)


class Recorder:
    """Every attempt, in arrival order; attempt indices counted per call id."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        self._records = []
        self._attempts = {}

    def begin(self, record):
        with self._lock:
            call = record["call"]
            record["attempt"] = self._attempts.get(call, 0)
            self._attempts[call] = record["attempt"] + 1
            self._records.append(record)
            return record["attempt"]

    def finish(self, record, code, cancelled):
        with self._lock:
            record["ended_ms"] = now_ms()
            record["code"] = code
            record["cancelled"] = cancelled
            self._ended.notify_all()

    def wait_for_end(self, call, timeout):
        """Waits until an attempt of `call` has ended; False if `timeout` seconds passed."""
        with self._lock:
            return self._ended.wait_for(
                lambda: any(r["call"] == call and r["ended_ms"] is not None for r in self._records),
                timeout,
            )

    def dump(self):
        with self._lock:
            return json.dumps(self._records).encode()


def entry(values, index):
    if isinstance(values, list) and 0 <= index < len(values):
        return values[index]
    return None


class ScriptHandler(grpc.GenericRpcHandler):
    def __init__(self, recorder):
        self._recorder = recorder
        self._records = grpc.unary_unary_rpc_method_handler(self._dump)

    def service(self, handler_call_details):
        method = handler_call_details.method
        if method == RECORDS_METHOD:
            return self._records
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: self._run(method, request, context)
        )

    def _dump(self, _request, _context):
        return self._recorder.dump()

    def _run(self, method, request, context):
        arrived = now_ms()
        try:
            script = json.loads(request)
            if not isinstance(script, dict) or not isinstance(script.get("call"), int):
                raise ValueError("the script must be an object with an integer call")
            call = script["call"]
        except (ValueError, KeyError, TypeError) as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad script: {error}")

        overrides = script.get("calls")
        if isinstance(overrides, dict) and isinstance(overrides.get(str(call)), dict):
            script = {**script, **overrides[str(call)]}

        metadata = dict(context.invocation_metadata())
        remaining = context.time_remaining()
        # Without a deadline grpcio reports a huge number of seconds rather than None.
        if remaining is not None and remaining > 1e9:
            remaining = None
        record = {
            "call": call,
            "method": method,
            "previous_attempts": metadata.get(PREVIOUS_ATTEMPTS_KEY),
            "timeout_ms": None if remaining is None else round(remaining * 1000.0, 3),
            "arrived_ms": arrived,
            "ended_ms": None,
            "cancelled": False,
            "code": None,
        }
        attempt = self._recorder.begin(record)

        # The callback runs when the RPC ends for any reason; before the answer, that is
        # the client cancelling (a won hedge, a deadline).
        ended = threading.Event()
        context.add_callback(ended.set)
        delay = entry(script.get("delay"), attempt)
        if isinstance(delay, (int, float)) and delay > 0:
            if ended.wait(min(delay, MAX_DELAY_MS) / 1000.0):
                self._recorder.finish(record, None, True)
                context.abort(grpc.StatusCode.CANCELLED, "cancelled by the client")

        other = script.get("await_call")
        if isinstance(other, int) and other != call:
            self._recorder.wait_for_end(other, MAX_DELAY_MS / 1000.0)

        code = entry(script.get("fail"), attempt)
        if isinstance(code, int) and code in STATUS_BY_CODE and code != 0:
            pushback = entry(script.get("pushback"), attempt)
            if isinstance(pushback, str):
                context.set_trailing_metadata(((PUSHBACK_KEY, pushback),))
            self._recorder.finish(record, code, False)
            context.abort(STATUS_BY_CODE[code], f"scripted failure of attempt {attempt}")

        self._recorder.finish(record, 0, False)
        return json.dumps({"call": call, "attempt": attempt}).encode()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-seconds", type=float, default=600.0)
    args = parser.parse_args()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    server.add_generic_rpc_handlers((ScriptHandler(Recorder()),))
    port = server.add_insecure_port("127.0.0.1:0")
    if port == 0:
        sys.exit("could not bind 127.0.0.1:0")
    server.start()
    print(port, flush=True)

    def stop_at_eof():
        sys.stdin.read()
        server.stop(0)

    threading.Thread(target=stop_at_eof, daemon=True).start()
    server.wait_for_termination(timeout=args.max_seconds)
    server.stop(0)


if __name__ == "__main__":
    main()
