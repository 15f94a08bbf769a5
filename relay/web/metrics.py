"""`/metrics`: the ledger's figures in the Prometheus text format, written by the official
prometheus-client from a collector that reads the History on each scrape (nothing is counted in
memory, so a restart loses nothing and two scrapes of one ledger agree).

    relay_messages{state}                    messages by state (gauge)
    relay_deliveries_total                   envelopes written into inboxes
    relay_failures_total{reason}             failed messages by the kind of their reason
    relay_sheds_total{reason}                sheds by flow control's reason
    relay_bounces_total                      bounces owed to senders
    relay_queue_depth{agent}                 messages waiting for an agent (pending + unread)
    relay_queue_oldest_age_seconds{agent}    the oldest unread envelope's age
    relay_envelope_latency_seconds           sending (rename into the outbox) -> envelope written
    relay_acks_overdue                       copies whose acknowledgement waits past ack_overdue
    relay_federation_unacknowledged{node}    rows published to a node, awaiting its acknowledgement
    relay_federation_link_up                 1 while the link to the server is up (federated only)
"""
import time

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from relay.ledger.web import LATENCY_BUCKETS
from relay.operator import queues

# A failure's reason, by the words it starts with (the first that matches); any other: "other".
FAILURE_KINDS = (("unknown recipient", "unknown_recipient"), ("shed", "shed"), ("too large", "too_large"),
                 ("body", "body_size"), ("refused", "refused"), ("archived", "recipient_archived"),
                 ("expired", "expired"), ("cannot parse", "unreadable"), ("unreadable", "unreadable"),
                 ("not utf-8", "unreadable"), ("invalid", "invalid"), ("unknown sender", "unknown_sender"))


def failure_kind(error):
    text = (error or "").lower()
    for words, kind in FAILURE_KINDS:
        if words in text:
            return kind
    return "other"


class LedgerCollector:
    """A prometheus-client collector over a project: each collect() reads its ledger."""

    def __init__(self, reader, layout, cfg, clock=time.time):
        self.reader, self.layout, self.cfg, self.clock = reader, layout, cfg, clock

    def collect(self):
        history = self.reader()
        now = self.clock()
        states = GaugeMetricFamily("relay_messages", "Messages in the ledger by state.", labels=["state"])
        for state, n in history.counts().items():
            states.add_metric([str(state)], n)
        yield states
        yield CounterMetricFamily("relay_deliveries", "Envelopes written into inboxes.",
                                  value=history.web.delivery_count())
        failures = CounterMetricFamily("relay_failures", "Failed messages by the kind of their reason.",
                                       labels=["reason"])
        kinds = {}
        for error, n in history.web.failed_errors():
            kinds[failure_kind(error)] = kinds.get(failure_kind(error), 0) + n
        for kind, n in sorted(kinds.items()):
            failures.add_metric([kind], n)
        yield failures
        sheds = CounterMetricFamily("relay_sheds", "Sheds by flow control, by reason.", labels=["reason"])
        for reason, n in history.web.shed_reasons().items():
            sheds.add_metric([reason], n)
        yield sheds
        yield CounterMetricFamily("relay_bounces", "Bounces owed to senders.", value=history.web.bounce_count())
        yield from self.queues(history, now)
        yield self.latency(history)
        overdue = history.receipts.overdue_count(now - self.cfg.ack_overdue)
        yield GaugeMetricFamily("relay_acks_overdue", "Delivered copies whose acknowledgement, asked for, waits "
                                "longer than ack_overdue.", value=overdue)
        yield from self.federation(history)

    def queues(self, history, now):
        doc = queues.project(history, self.layout, self.layout.agent_names(self.cfg.agents), now)
        depth = GaugeMetricFamily("relay_queue_depth", "Messages waiting for an agent (pending + unread).",
                                  labels=["agent"])
        oldest = GaugeMetricFamily("relay_queue_oldest_age_seconds", "Age of the oldest unread envelope.",
                                   labels=["agent"])
        for r in doc["agents"]:
            depth.add_metric([r["agent"]], r["depth"])
            oldest.add_metric([r["agent"]], r["oldest_unread_age_s"] or 0.0)
        return [depth, oldest]

    def latency(self, history):
        counts, n, total = history.web.latency()
        buckets = [(repr(float(b)), c) for b, c in zip(LATENCY_BUCKETS, counts, strict=True)] + [("+Inf", n)]
        return HistogramMetricFamily("relay_envelope_latency_seconds",
                                     "Seconds from a message's sending (its rename into the outbox) to each "
                                     "envelope written.", buckets=buckets, sum_value=total)

    def federation(self, history):
        if not self.cfg.federation:
            return
        waiting = GaugeMetricFamily("relay_federation_unacknowledged",
                                    "Rows published to a node, awaiting its acknowledgement.", labels=["node"])
        for node, n in sorted(history.remote.unacknowledged().items()):
            waiting.add_metric([node], n)
        yield waiting
        link = history.remote.link()
        yield GaugeMetricFamily("relay_federation_link_up", "1 while the link to the federation server is up.",
                                value=1 if link is not None and link["connected"] else 0)


def registry(reader, layout, cfg, clock=time.time):
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LedgerCollector(reader, layout, cfg, clock))
    return reg


def exposition(reg):
    """(body, content type) of a scrape."""
    return generate_latest(reg), CONTENT_TYPE_LATEST
