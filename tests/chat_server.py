"""A scripted chat-completions server on 127.0.0.1 for tests of OpenAI-client callers (harness, ``agent run``).

    with ScriptedChat(lambda body, index: (200, payload)) as chat:   # chat.url: http://127.0.0.1:PORT/v1
        ...
    chat.requests                                                   # every request body, in order
"""

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedChat:
    """``reply(request body, index of the request) -> (status, body bytes)``; ``content_type`` None sends none."""

    def __init__(self, reply: Callable[[dict, int], tuple[int, bytes]],
                 content_type: str | None = "application/json") -> None:
        self.requests: list[dict] = []
        chat = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                chat.requests.append(body)
                status, payload = reply(body, len(chat.requests) - 1)
                self.send_response(status)
                if content_type:
                    self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self) -> "ScriptedChat":
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
