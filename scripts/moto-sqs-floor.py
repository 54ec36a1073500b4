#!/usr/bin/env python3
"""The floor of moto's SQS under the relay benchmark: what moto alone takes to accept 100
messages into an emptied queue, sent by a bare boto3 client with no relay, no marks and no
DynamoDB, as 10 `SendMessageBatch` requests of 10 and as 100 `SendMessage` requests.

No relay sending to moto can publish 100 events faster than the first figure, so it bounds
the ratio `cargo bench --bench relay` can show on moto's SQS (BENCHMARKS.md).

Usage: scripts/moto-sqs-floor.py [--rounds N]   (starts moto's server on a free port; run it
with the moto venv's python: scripts/python-venv.sh builds it from ci/python/moto)
"""
import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import boto3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        sqs = boto3.client(
            "sqs",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )
        url = sqs.create_queue(QueueName="floor")["QueueUrl"]
        body = json.dumps({"event_id": "e" * 40, "type": "OrderPlaced", "payload": {"order": "o-1"}})

        def empty():
            while True:
                got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)
                messages = got.get("Messages", [])
                if not messages:
                    return
                sqs.delete_message_batch(
                    QueueUrl=url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
                )

        batched, single = [], []
        for _ in range(rounds):
            empty()
            start = time.perf_counter()
            for _ in range(10):
                sqs.send_message_batch(
                    QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": body} for i in range(10)]
                )
            batched.append((time.perf_counter() - start) * 1000)
            empty()
            start = time.perf_counter()
            for _ in range(100):
                sqs.send_message(QueueUrl=url, MessageBody=body)
            single.append((time.perf_counter() - start) * 1000)
        for name, runs in (("10 SendMessageBatch", batched), ("100 SendMessage", single)):
            print(f"100 messages as {name}: median {statistics.median(runs):.0f} ms {[round(r) for r in runs]}")
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
