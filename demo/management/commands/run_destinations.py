"""``manage.py run_destinations``: the demo payment provider (HTTP) and SMTP sink."""

from __future__ import annotations

import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.core.servers.basehttp import (
    ThreadedWSGIServer,
    WSGIRequestHandler,
    get_internal_wsgi_application,
)

from demo import smtp_sink
from scheduler_core.runtime.process_signals import StopOnSignal


class _QuietHandler(WSGIRequestHandler):
    """Django's request handler without a line per request (the provider logs to a table)."""

    def log_message(self, format: str, *args: Any) -> None:
        return


class Command(BaseCommand):
    help = "Serve the demo destinations: the payment provider over HTTP and an SMTP sink."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--http-port", type=int, default=8765)
        parser.add_argument("--smtp-port", type=int, default=8025)

    def handle(self, *args: Any, **opts: Any) -> None:
        host = opts["host"]
        httpd = ThreadedWSGIServer((host, opts["http_port"]), _QuietHandler)
        httpd.daemon_threads = True
        httpd.set_app(get_internal_wsgi_application())
        smtp = smtp_sink.start(host, opts["smtp_port"])
        stop = threading.Event()
        StopOnSignal(stop.set).install()  # no lock taken in the handler (its module says why)
        server = threading.Thread(target=httpd.serve_forever, name="demo-http", daemon=True)
        server.start()
        self.stdout.write(
            f"payment provider on http://{host}:{opts['http_port']}/demo/pay/, "
            f"SMTP sink on {host}:{opts['smtp_port']}",
        )
        self.stdout.flush()
        stop.wait()
        httpd.shutdown()
        smtp.stop()
