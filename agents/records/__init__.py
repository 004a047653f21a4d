"""The agent's records: the recorder (store journal → catalog) and the outbox drain
(store outbox → Kafka `meridian.changes`). Both are `Lifecycle` duties the daemon
starts beside its API:

    recorder = Recorder(store, catalog, metrics, region, RecorderSettings())
    drain = OutboxDrain(store, KafkaProducer(bootstrap), metrics, region,
                        OutboxSettings(origin_agent="host:port"))
    await recorder.start(); await drain.start()   # ... stop() both on SIGTERM

(the producer is started and stopped by its owner; `drain.notify()` after a
standard write's commit publishes it without waiting for the next poll).
"""

from agents.records.outbox import BatchProducer, OutboxDrain, track_outbox
from agents.records.recorder import Recorder
from agents.records.setaside import SetAside
from agents.records.settings import OutboxSettings, RecorderSettings
from agents.records.transfer import TransferFacts, read_transfer

__all__ = [
    "BatchProducer",
    "OutboxDrain",
    "OutboxSettings",
    "Recorder",
    "RecorderSettings",
    "SetAside",
    "TransferFacts",
    "read_transfer",
    "track_outbox",
]
