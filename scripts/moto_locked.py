"""moto's server with every request under one lock.

moto applies a conditional write as a read and a write that concurrent requests can
interleave, so two claims of one key could both succeed; DynamoDB applies each atomically.
Serialising the requests restores that (and costs nothing that matters to a test suite).

    python moto_locked.py PORT
"""

import sys
import threading

from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

LOCK = threading.Lock()


class Locked:
    """A WSGI application that runs `app` one request at a time, its body read inside the lock."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        with LOCK:
            return [b"".join(self.app(environ, start_response))]


def main():
    port = int(sys.argv[1])
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        "127.0.0.1",
        port,
        Locked(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
