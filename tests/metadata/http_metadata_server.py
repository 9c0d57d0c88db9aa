#!/usr/bin/python3
"""An HTTP metadata server speaking Mooncake's protocol (mooncake_http_metadata_server), for
Ferry's tests and by hand: one path (default /metadata), the key in the query, values kept in
memory (a restart loses them, as Mooncake's does).

    GET    /metadata?key=K          200 and the value, or 404 "metadata not found"
    PUT    /metadata?key=K  (body)  200 "metadata updated"; a second PUT of a key containing
                                    "rpc_meta" with another value is refused (400), the same
                                    value is 200 "metadata unchanged"
    DELETE /metadata?key=K          200 "metadata deleted", or 404 "metadata not found"
    no key                          400 "metadata key is required"

    /usr/bin/python3 tests/metadata/http_metadata_server.py --port 8080
    /usr/bin/python3 tests/metadata/http_metadata_server.py --port 0   # any free port

When it listens it prints one line to stdout, "READY http://127.0.0.1:PORT/metadata", and
flushes it; --ready-file PATH also writes that URL to PATH (written whole, then renamed). It binds
127.0.0.1 unless --host says otherwise; SIGTERM and SIGINT stop it. Bodies larger than
--max-body-bytes (default 1 MiB, aiohttp's default, which Mooncake's server keeps) get 413.
--log-level INFO logs every request.
Needs aiohttp (Debian: python3-aiohttp)."""

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from aiohttp import web


def make_app(path, max_body):
    store = {}
    lock = asyncio.Lock()

    async def handle(request):
        key = request.query.get("key", "").strip()
        if not key:
            return web.Response(text="metadata key is required", status=400, content_type="application/json")
        if request.method == "GET":
            async with lock:
                value = store.get(key)
            if value is None:
                return web.Response(text="metadata not found", status=404, content_type="application/json")
            return web.Response(body=value, status=200, content_type="application/json")
        if request.method == "PUT":
            data = await request.read()
            async with lock:
                if "rpc_meta" in key and key in store:
                    if store[key] == data:
                        return web.Response(text="metadata unchanged", status=200, content_type="application/json")
                    return web.Response(text="Duplicate rpc_meta key not allowed", status=400,
                                        content_type="application/json")
                store[key] = data
            return web.Response(text="metadata updated", status=200, content_type="application/json")
        if request.method == "DELETE":
            async with lock:
                if key not in store:
                    return web.Response(text="metadata not found", status=404, content_type="application/json")
                del store[key]
            return web.Response(text="metadata deleted", status=200, content_type="application/json")
        return web.Response(text="Method not allowed", status=405, content_type="application/json")

    app = web.Application(client_max_size=max_body)
    app.router.add_route("*", path, handle)
    return app


async def serve(args):
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    access_log = logging.getLogger("aiohttp.access") if args.log_level in ("DEBUG", "INFO") else None
    runner = web.AppRunner(make_app(args.path, args.max_body_bytes), access_log=access_log)
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    host = "[%s]" % args.host if ":" in args.host else args.host
    url = "http://%s:%d%s" % (host, sock.getsockname()[1], args.path)
    if args.ready_file:
        with open(args.ready_file + ".tmp", "w") as f:
            f.write(url + "\n")
        os.rename(args.ready_file + ".tmp", args.ready_file)
    print("READY " + url, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (0: any free port; default 8080)")
    p.add_argument("--path", default="/metadata", help="the endpoint's path (default /metadata)")
    p.add_argument("--max-body-bytes", type=int, default=1024 * 1024, help="largest PUT body (default 1 MiB)")
    p.add_argument("--ready-file", help="write the URL here once listening")
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                   help="as mooncake_http_metadata_server's (default WARNING)")
    args = p.parse_args()
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
    if not args.path.startswith("/"):
        sys.exit("--path must start with /")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
