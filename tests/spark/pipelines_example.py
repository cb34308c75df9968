"""A two-stage pipeline with fan-out and fan-in, used by the pipeline tests and the CLI test.

``orders`` (typed) fans out to ``big`` (orders over 100, as Big) and ``audit`` (one line per item
of every order: 0, 1 or many records); ``big`` and ``manual`` fan in to ``alerts`` (second stage).
"""

from __future__ import annotations

import os

from pydantic import BaseModel

from broker.client import OutgoingRecord, Record
from broker.pipeline import Pipeline, topic


class Order(BaseModel):
    id: int
    amount: int
    items: list[str]


class Big(BaseModel):
    id: int
    amount: int


def big_orders(order: Order) -> Big | None:
    return Big(id=order.id, amount=order.amount) if order.amount > 100 else None


def audit_lines(order: Order) -> list[str]:
    return [f"{order.id}:{item}" for item in order.items]


def alert_big(order: Big) -> OutgoingRecord:
    return OutgoingRecord(value=f"alert {order.model_dump_json()}", headers={"from": "big"})


def alert(record: Record) -> OutgoingRecord:
    return OutgoingRecord(value=b"alert " + record.value, headers={"from": record.topic})


PREFIX = os.environ.get("PIPELINE_TOPIC_PREFIX", "p")
orders = topic(f"{PREFIX}-orders", Order)
big = topic(f"{PREFIX}-big", Big)

pipeline = Pipeline([
    orders.pipe(big_orders).to(big),
    orders.pipe(audit_lines).to(topic(f"{PREFIX}-audit")),
    big.pipe(alert_big).to(topic(f"{PREFIX}-alerts")),
    topic(f"{PREFIX}-manual").pipe(alert).to(topic(f"{PREFIX}-alerts")),
], name=f"{PREFIX}-example")
