"""The webhook's real aiohttp app over HTTPS, with watch caches replaced by a realistic static snapshot
(200 queues, 2,000 PodGroups, 50 Reservations, 3 windows), for the benchmark."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from aiohttp import web

from shared import keys
from shared.config import load_config
from shared.views import PodGroupView, PriorityClassView, QueueView, ReservationView
from webhook.lookup import Lookup
from webhook.server import Metrics, ReloadingTLS, make_app


def snapshot() -> Lookup:
    classes = {f"pc-{i}": PriorityClassView(f"pc-{i}", i * 100, i == 0, "PreemptLowerPriority") for i in range(10)}
    queues = {f"q-{i}": QueueView.from_obj({"metadata": {"name": f"q-{i}"},
                                            "spec": {"priorityClassName": f"pc-{i % 10}"}})
              for i in range(200)}
    podgroups = {(f"ns-{i % 20}", f"job-{i}"): PodGroupView.from_obj({
        "metadata": {"name": f"job-{i}", "namespace": f"ns-{i % 20}",
                     "annotations": {keys.RESERVEABLE: "true", keys.MAXIMUM_RUNTIME: "2h"}},
        "spec": {"minMember": 8, "queue": f"q-{i % 200}"}}) for i in range(2000)}
    reservations = {f"r-{i}": ReservationView.from_obj({
        "metadata": {"name": f"r-{i}"},
        "spec": {"owners": [{"labelSelector": {"matchLabels": {"app": f"svc-{i}"}}}],
                 "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "4"}}}]}}},
        "status": {"phase": "Available"}}) for i in range(50)}
    config = load_config("windows:\n" + "".join(
        f"- {{name: w{i}, resources: {{cpu: 32}}, schedule: '0 {i} * * *', duration: 1h}}\n" for i in range(3)))
    return Lookup(podgroups, queues, classes, reservations, config)


async def main(cert: Path, key: Path, port: int) -> None:
    lookup = snapshot()
    tls = ReloadingTLS(cert, key)
    runner = web.AppRunner(make_app(lambda: lookup, lambda: {"snapshot": True}, Metrics()), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls.context, backlog=2048).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(main(Path(args.cert), Path(args.key), args.port))
