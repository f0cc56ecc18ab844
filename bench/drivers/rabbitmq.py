"""RabbitMQ (local, 5672) through pika: a durable classic queue, persistent messages
(delivery_mode=2), publisher confirms (each ``basic_publish`` waits for its confirm), and
manual acks after the handler (prefetch 10 per consumer; one ack per message, or one
``multiple=True`` ack per batch when batched)."""

from __future__ import annotations

import json
from typing import Any

from bench.common import AMQP_URL, QUEUE, Tally, payload
from bench.drivers import Driver


def _channel() -> tuple[Any, Any]:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)
    return conn, ch


class RabbitDriver(Driver):
    name = "rabbitmq"
    family = "rabbitmq"
    durability = "persistent messages on a durable classic queue; confirms after the disk write"
    startup_s = 0.3

    def reset(self) -> None:
        conn, ch = _channel()
        ch.queue_delete(QUEUE)
        ch.queue_declare(QUEUE, durable=True)
        conn.close()

    def settings(self) -> dict[str, Any]:
        import pika

        conn, ch = _channel()
        props = conn._impl.server_properties  # the broker's version, as it announced it
        version = props.get("version", b"?")
        conn.close()
        return {
            "rabbitmq": version.decode() if isinstance(version, bytes) else str(version),
            "pika": pika.__version__,
            "queue": "classic, durable",
            "delivery_mode": 2,
            "publisher_confirms": True,
            "prefetch": 10 if self.batch == 1 else self.batch,
        }

    def open_producer(self) -> Any:
        return _Producer()

    def consume(self, slot: int) -> None:
        conn, ch = _channel()
        prefetch = 10 if self.batch == 1 else self.batch
        ch.basic_qos(prefetch_count=prefetch)
        pending = [0]

        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            Tally.started(body)
            if self.batch == 1:
                ch.basic_ack(method.delivery_tag)
                Tally.done()
                return
            pending[0] += 1
            if pending[0] >= self.batch or conn._impl.is_closing:
                ch.basic_ack(method.delivery_tag, multiple=True)
                Tally.done(pending[0])
                pending[0] = 0

        ch.basic_consume(QUEUE, on_message, auto_ack=False)
        ch.start_consuming()


class _Producer:
    def __init__(self) -> None:
        import pika

        self.conn, self.ch = _channel()
        self.ch.confirm_delivery()
        self.props = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)

    def send(self, seqs: list[int]) -> None:
        for i in seqs:
            self.ch.basic_publish("", QUEUE, json.dumps(payload(i)).encode(), self.props)

    def close(self) -> None:
        self.conn.close()
