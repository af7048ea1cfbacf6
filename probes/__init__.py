"""inferledger.probes: the event contract, emitting events with clock tags, samplers."""
from .events import EVENT_SCHEMA, SAMPLE_SCHEMA, VOCABULARY
from .probe import EventIds, ListSink, Probe, host_id, mono_clock

__all__ = ["EVENT_SCHEMA", "SAMPLE_SCHEMA", "VOCABULARY", "EventIds", "ListSink", "Probe", "host_id", "mono_clock"]
