"""A scripted chat-completions upstream for docker/check.sh (stdlib only).

Runs in a container of the image under test (``python3 check_upstream.py``)
on port 9000. Every ``POST …/chat/completions`` gets one fixed answer that
names how many messages arrived (so the check can tell a compacted request
from the client's own). A request for the model ``slow`` is first logged as
``slow request received`` and answered after ``SLOW_SECONDS`` (default 12):
the request a ``docker stop`` must let finish.
"""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOW_SECONDS = float(os.environ.get("SLOW_SECONDS", "12"))


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        if not self.path.endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        model, messages = body.get("model"), body.get("messages", [])
        print(f"chat model={model} messages={len(messages)}", flush=True)
        if model == "slow":
            print("slow request received", flush=True)
            time.sleep(SLOW_SECONDS)
        text = f"pong from the check upstream ({len(messages)} messages)"
        self._send(
            200,
            {
                "id": "chatcmpl-check",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )

    def _send(self, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # one line per request is enough
        pass


if __name__ == "__main__":
    print("check upstream on :9000", file=sys.stderr, flush=True)
    ThreadingHTTPServer(("0.0.0.0", 9000), Upstream).serve_forever()
