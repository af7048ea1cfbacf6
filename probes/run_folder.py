"""The run folder's JSON records as one typed schema: the manifest, the partition layout record, the
study folder's index. Each is a model that reads and writes itself, with a schema version (`format`);
their file names are spelled here and nowhere else in the library.

- `Manifest` (`manifest.json`, in a run folder): what a run is (its source, state, workload, model,
  engine configuration, device, clocks, the registered prediction, ...). Every top-level key is one
  of `MANIFEST_KEYS`, each with its type and meaning (docs/ARCHITECTURE.md "The run directory" lists
  them, generated from this table). A capture writes it from its first second and again as the run
  goes (state starting, running, complete or interrupted); a manifest written before the version was
  recorded reads as version 1.
- `Layout` (`events/layout.json`): the partitioned layout's bucket count and what was written in
  each partition folder (probes/run_dir.py `check_layout` holds the folders against it).
- `StudyIndex` (`study.json`, in a study folder): the study, its runs and its comparison's tables
  (probes/study_dir.py).

Reading refuses what the schema cannot hold (a value of the wrong type, a newer version) with a
`RunFolderError` naming the file and the key; a manifest key the schema does not know is kept as it is
(another writer's run folder may say more than ours), while our own writers may write only declared keys. A run folder without a manifest reads as
an empty one: the ledger rebuilds any run directory, our capture's or another writer's.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from inferledger.probes.model_shape import ModelShape, ShapeError, shape_differences

MANIFEST_FILE = "manifest.json"
LAYOUT_FILE = "layout.json"
STUDY_FILE = "study.json"
ROUTER_SPANS_FILE = "router-spans.jsonl"  # a capture's --router-traces, copied into the run as the router wrote it
FILE_NAMES = (MANIFEST_FILE, LAYOUT_FILE, STUDY_FILE, ROUTER_SPANS_FILE)  # the run folder's records: spelled only here

MANIFEST_FORMAT = 1
LAYOUT_FORMAT = 2  # 2: with `parts`; a record of format 1 (no parts) is still read
STUDY_FORMAT = 1
STATES = ("starting", "running", "complete", "interrupted")  # a manifest's `state`
STUDY_STATES = ("running", "complete", "failed", "interrupted")
FIGURE_KINDS = ("timeline", "curve", "kv_blocks")  # what the report knows how to draw from a study
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")


class RunFolderError(ValueError):
    """A record of a run or study folder cannot be read as its schema says; the message names the file
    and the key."""


def write_json_atomic(obj: dict, path: Path) -> None:
    """JSON under a temporary name in the same folder, renamed into place: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def _load(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot read ({exc.strerror})") from None
    except (ValueError, RecursionError) as exc:
        raise RunFolderError(f"{path}: not valid JSON ({exc})") from None


@dataclass(frozen=True)
class Key:
    """One key of a record: its JSON type(s) and what it holds; `keys`: the keys inside it a reader uses."""
    name: str
    kinds: tuple[type, ...]
    doc: str
    keys: tuple["Key", ...] = ()


_NONE = type(None)
_NUM = (int, float)
_JSON_NAMES = {dict: "object", list: "array", str: "string", int: "integer", float: "number", bool: "boolean",
               _NONE: "null"}


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = []
    for k in kinds:
        name = _JSON_NAMES[k]
        if not (k is int and float in kinds) and name not in names:
            names.append(name)
    return " or ".join(names)


def _has_kind(value, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds)


def _check(doc: dict, keys: tuple[Key, ...], where: str, prefix: str = "") -> None:
    for k in keys:
        if k.name in doc and not _has_kind(doc[k.name], k.kinds):
            raise RunFolderError(f"{where}: {prefix}{k.name}: expected {_kind_names(k.kinds)}, "
                                 f"got {_JSON_NAMES.get(type(doc[k.name]), type(doc[k.name]).__name__)}")
        if k.keys and isinstance(doc.get(k.name), dict):
            _check(doc[k.name], k.keys, where, f"{prefix}{k.name}.")


_SLO = Key("slo", (dict,), "vLLM-style goodput thresholds in ms (after calibration); the ledger's `good` column "
           "and goodput hold each attempt against them (before the workload's `workload.spec.slo`)",
           tuple(Key(k, (*_NUM, _NONE), f"the {k.removesuffix('_ms')} threshold, ms") for k in SLO_KEYS))

MANIFEST_KEYS: tuple[Key, ...] = (
    Key("format", (int,), f"the manifest's schema version ({MANIFEST_FORMAT}; absent in manifests written "
        "before it was recorded, which read as version 1)"),
    Key("run_id", (str,), "the run's id (else the ledger uses the run folder's name)"),
    Key("source", (str,), "what wrote the run: `inferledger capture`, `inferledger serve`, `inferledger simulated "
        "clock`, `e0-import`, `peer-import`, `inferledger import --from otlp`, a benchmark"),
    Key("state", (str,), f"one of {', '.join(STATES)}: a capture rewrites the manifest as it goes, so a "
        "killed run says how far it got"),
    Key("interrupted", (str, _NONE), "what stopped an interrupted run (the signal, or the reason)"),
    Key("wall_s", _NUM, "the run's wall time, s"),
    Key("flushed", (dict,), "rows on disk at the last periodic flush (events, samples, flushes, at_unix_s): what "
        "a reader of a killed run can count on"),
    Key("target", (dict, str), "what was driven: {kind: embedded|url, url} for a capture, `http` for a server"),
    Key("workload", (dict,), "the workload: path, name, sha256, spec (the file as read), taskset (the task-set "
        "file used and its sha256), replay (a replay file: path, sha256 of the lines read, sha256_bytes, "
        "file_bytes), arrivals, n_tasks, classes, requests, trace (what was done to a trace's rows); a simulation's plan",
        (Key("spec", (dict,), "the workload file as read",
             (Key("slo", (dict,), "the workload's [slo] section: the thresholds where the manifest has no `slo`",
                  _SLO.keys),)),
         Key("context", (dict,), "the check of each class's prompt and output lengths against the model's context "
             "window before the run: the window, where it was read, or why the check was skipped (a URL target)"))),
    _SLO,
    Key("prompts", (dict,), "how prompt tokens were counted: tokenizer hash, tokenizer_source, exact_prompt_tokens"),
    Key("calibration", (dict, _NONE), "the workload's calibration against the engine's measured speed"),
    Key("client", (dict,), "the load client: its clock, event-loop lag (p99, max, wakes, trace period), "
        "client_bound and its rule, pacing error, switch interval, result counts, warmups (requests sent before "
        "the run opened: n, output_tokens, wall_s; never attempts), its loop's thread",
        (Key("thread", (dict,), "the event loop's thread over the run (Linux schedstat): cpu_ms (on a CPU), "
             "wait_ms (runnable, waiting for one), wall_ms, cpu_share and wait_share (of wall_ms); a client held "
             "back by other processes has a high wait_share, one busy itself a high cpu_share; {unknown: why} "
             "where schedstat is hidden"),)),
    Key("clock_mappings", (list,), "clock mappings estimated by round trips (from_clock, to_clock, offset_ns, "
        "epsilon_ns, method)"),
    Key("clock_mappings_failed", (list,), "clock syncs that failed (label, reason)"),
    Key("system_under_test", (dict,), "what is inside and outside the system measured"),
    Key("host", (dict, str), "the host: name, boot_id (the kernel's: one boot of one host is one CLOCK_MONOTONIC), "
        "platform, python, processor (a name alone for an OTLP import)"),
    Key("evidence", (dict,), "for each kind of fact, how it is known: observed, declared, reported, simulated"),
    Key("device_params", (dict,), "the device measured at capture start and again over the run (the host's "
        "microbenchmarks), or {skipped: why}; the roofs read device_name, memcpy_gbps.peak and matmul_tflops.peak",
        (Key("device_name", (str, _NONE), "the device's name"),
         Key("memcpy_gbps", (dict,), "memory bandwidth: peak (GB/s, the best of every measurement), start_peak "
             "(the start's), best_at (start, idle or end), label"),
         Key("matmul_tflops", (dict,), "matmul rate: peak (TFLOP/s, the best of every measurement), start_peak, "
             "best_at, label"),
         Key("llc_bytes", (int, _NONE), "the last-level cache, bytes (/sys/devices/system/cpu/cpu0/cache); the "
             "stream's buffer is at least 4 times it"),
         Key("repeats", (dict,), "every measurement over the run: clock (of start_ns, end_ns), runs (at: start, "
             "idle or end; memcpy_gbps, matmul_tflops; start_ns, end_ns; overlapped: a task arrived during it, "
             "not used), each marked in the samples by microbench.running 1 / 0"))),
    Key("declared_roofs", (dict,), "roofs a person declared: tflops, gbps, label",
        (Key("tflops", _NUM, "compute roof, TFLOP/s"), Key("gbps", _NUM, "memory roof, GB/s"),
         Key("label", (str,), "where the figures come from"))),
    Key("prediction", (dict,), "the registered prediction: sha256 of prediction.json and its registration time "
        "on the host's monotonic clock (docs/MODEL.md \"Registration\"), or {skipped: why}",
        (Key("sha256", (str,), "the registered file's sha256"),)),
    Key("step_fit", (dict,), "a step-time fit declared from another run (costmodel/fit.py `StepFit.to_dict`): "
        "every step of this run is then held out"),
    Key("energy", (dict,), "the energy samplers: GPU names and UUIDs, RAPL zones, the rate and the clock"),
    Key("host_samples", (dict,), "the host sampler (probes/host.py): rate, clock, which /proc files it read (or "
        "why not), clk_tck, cpus, and whether its samples describe the server's host (applies_to_server, "
        "applies_why: not for a URL target on another host, --engine-host)"),
    Key("engine_evidence", (dict,), "another engine's evidence about itself: OTLP spans (reporter, clock, join "
        "summary), /metrics scrapes"),
    Key("engine_config", (dict,), "the engine's configuration as declared, and `resolved` on this device "
        "(device, dtype, num_blocks, graphs, compile, attention, linear, CPU placement)",
        (Key("block_size", (int,), "tokens per KV block"), Key("resolved", (dict,), "as resolved on the device"))),
    Key("model", (dict,), "the model's identity: name, path, sha256, format, quantization, architecture (the "
        "shape, probes/model_shape.py), dtype (weights, activations, kv, accumulation, resolved_by), tokenizer, "
        "chat template, kv_bytes_per_token",
        (Key("architecture", (dict,), "the model's shape under the engine's names (n_layers, d_model, n_heads, "
             "n_kv_heads, head_dim, ffn_dim, vocab_size, tie_embeddings) and its other fields"),
         Key("dtype", (dict,), "element types: weights, activations, kv"),
         Key("kv_bytes_per_token", (int,), "K and V bytes of one token across all layers"))),
    Key("model_shape", (dict,), "the shape of a model a person declared for a run without our engine's identity "
        "(ModelShape.declared_entry, evidence declared)"),
    Key("device_clock", (dict,), "the device timer: the device's UUID and the clock drift"),
    Key("drain", (dict,), "how the server drained at the end (the serving drain rule)"),
    Key("served_model_name", (str, _NONE), "the model name the server answers to"),
    Key("server", (dict,), "the server's address, admission limit, whether it checks an API key"),
    Key("servers", (dict,), "a capture's `--server` folders (`serve --out`) joined to its URL target: per folder "
        "its server_id, path, state, host (name, boot_id), clock (the domain its events are on in the run, "
        "same_domain and why, the round-trip mappings and failures), attempts (joined, covered), events and "
        "samples copied; the bound waited (wait_s, waited_s), the attempts the server answered and those joined; "
        "with several folders, each folder's replica_id (its events' attrs.replica_id), url (its own address) and "
        "unseen_tries (a router's tries the client never saw)"),
    Key("router", (dict,), "a capture's `--router-metrics`: the router's /metrics scraped before and after the load "
        "(url, scrapes, failures, last_error, file, refused_file, types), replicas (worker host:port -> replica id)"),
    Key("router_traces", (dict,), "a capture's `--router-traces`: the router's spans joined after the load (file, "
        "copied_as, clock, spans, refused, waited_s, attempts_without_spans, requests, tries, held_by_folders, "
        "events, unseen_tries)"),
    Key("deployment", (dict,), "a capture through a router to several replicas: router (the target), router_metrics, "
        "replicas (each: replica_id, url, kind ours / vllm / llamacpp / blackbox, what the capture records of it, "
        "its /metrics scrape summary)"),
    Key("simulation", (dict,), "a simulated run: its clock, step model, steps, end time"),
    Key("archive", (dict,), "an imported E0 archive: path, sha256"),
    Key("counts", (dict, _NONE), "what an import read, wrote and refused"),
    Key("importer", (dict,), "the E0 importer: module, version, lenient"),
    Key("clocks", (dict,), "an E0 archive's clock domains: host and kind each"),
    Key("file", (str,), "the OTLP file an import read"),
    Key("tool", (str,), "the peer load tool imported (aiperf, guidellm, vllm-bench)"),
    Key("tool_version", (str, _NONE), "its version"),
    Key("reporter", (str, _NONE), "who reported the peer's events"),
    Key("command", (str, list, _NONE), "the peer tool's command line"),
    Key("input", (dict,), "the peer tool's file: path, sha256, what else it said"),
    Key("join", (dict,), "the peer import's join with a server run: key rules, the server run"),
    Key("clock", (dict,), "the peer tool's clock, its kind and its mapping"),
    Key("server_manifest", (dict, _NONE), "the joined server run's manifest"),
    Key("lenient", (bool,), "whether the import kept going past refused records"),
    Key("study_point", (dict,), "a study run's place on its curve, declared beside it (multiple of capacity, "
        "offered rate, deadline)"),
)
_MANIFEST_NAMES = {k.name for k in MANIFEST_KEYS}


@dataclass
class Manifest:
    """A run's manifest: `body` is the JSON object (without `format`, which `write` adds), `path` the
    file it was read from, for messages."""
    body: dict = field(default_factory=dict)
    path: Path | None = None

    def __post_init__(self) -> None:
        where = str(self.path) if self.path else MANIFEST_FILE
        if not isinstance(self.body, dict):
            raise RunFolderError(f"{where}: expected a JSON object, got {_JSON_NAMES.get(type(self.body), '?')}")
        _check(self.body, MANIFEST_KEYS, where)
        version = self.body.get("format", MANIFEST_FORMAT)
        if version != MANIFEST_FORMAT:
            raise RunFolderError(f"{where}: format: {version} is not {MANIFEST_FORMAT}, the version this "
                                 "inferledger reads")
        if "state" in self.body and self.body["state"] not in STATES:
            raise RunFolderError(f"{where}: state: {self.body['state']!r} is not one of {', '.join(STATES)}")
        self.body = {k: v for k, v in self.body.items() if k != "format"}

    @staticmethod
    def file(run_dir: str | os.PathLike) -> Path:
        return Path(run_dir) / MANIFEST_FILE

    @classmethod
    def exists(cls, run_dir: str | os.PathLike) -> bool:
        return cls.file(run_dir).is_file()

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> "Manifest":
        """The run folder's manifest; an empty one when the folder has none."""
        path = cls.file(run_dir)
        if not path.exists():
            return cls({}, path)
        return cls(_load(path), path)

    def check_declared(self, where: str | os.PathLike = MANIFEST_FILE) -> None:
        """RunFolderError when the body holds a key the schema does not declare (what `write` refuses)."""
        unknown = sorted(set(self.body) - _MANIFEST_NAMES)
        if unknown:
            raise RunFolderError(f"{where}: {unknown[0]}: not a key of the run manifest (declare it in "
                                 "probes/run_folder.py MANIFEST_KEYS before writing it)")

    def to_json(self) -> dict:
        return {"format": MANIFEST_FORMAT, **self.body}

    def write(self, run_dir: str | os.PathLike) -> Path:
        """Write it whole (renamed into place). Our writers declare every key they write: a key outside
        the schema is refused here, while a reader keeps another writer's extra keys as they are."""
        path = self.file(run_dir)
        self.check_declared(path)
        write_json_atomic(self.to_json(), path)
        return path

    # -- what the readers take from it, each in one place ---------------------------------------
    def get(self, key: str, default=None):
        assert key in _MANIFEST_NAMES, f"{key}: not a manifest key"
        return self.body.get(key, default)

    @property
    def where(self) -> str:
        return str(self.path) if self.path else MANIFEST_FILE

    @property
    def run_id(self) -> str | None:
        return self.body.get("run_id") or None

    def block(self, key: str) -> dict:
        """A top-level object (`{}` when absent or null)."""
        value = self.get(key)
        return value if isinstance(value, dict) else {}

    @property
    def recording(self) -> bool:
        """The run is still being recorded: its state is starting or running (a capture in progress, or
        one killed before it could say otherwise); a run without a state is a finished one."""
        return self.body.get("state") in ("starting", "running")

    @property
    def slo(self) -> dict:
        """The SLO thresholds: the manifest's `slo`, else its workload's `[slo]` section (`workload.spec.slo`)."""
        return self.block("slo") or (self.block("workload").get("spec") or {}).get("slo") or {}

    @property
    def offered_rps(self) -> float | None:
        """The planned arrival rate of an open-loop Poisson or gamma workload, req/s, after calibration
        (None for a closed loop, a replay or trace, or a manifest that does not say)."""
        workload = self.block("workload")
        if workload.get("arrivals") not in ("poisson", "gamma"):
            return None
        after = self.block("calibration").get("after") or {}
        rate = after.get("rate_rps", ((workload.get("spec") or {}).get("arrivals") or {}).get("rate_rps"))
        return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None

    @property
    def kv_block_bytes(self) -> int | None:
        """Bytes of one KV block, as the engine declared it (None when the run does not say)."""
        per_token = self.block("model").get("kv_bytes_per_token")
        block = self.block("engine_config").get("block_size")
        return int(per_token) * int(block) if per_token and block else None

    def model_shape(self) -> ModelShape:
        """The model's shape: the engine's `model` block (architecture and dtype), else a declared
        `model_shape`; ShapeError naming the key when neither holds one."""
        model = self.block("model")
        if not model.get("architecture") and "model_shape" in self.body:
            return ModelShape.from_declared(self.body["model_shape"], MANIFEST_FILE)
        arch, dtype = model.get("architecture"), model.get("dtype")
        if not isinstance(arch, dict) or not isinstance(dtype, dict):
            raise ShapeError(f"{MANIFEST_FILE}: no model.architecture / model.dtype block (the engine's model identity)")
        return ModelShape.from_architecture(arch, dtype, MANIFEST_FILE)

    @property
    def step_fit(self) -> dict | None:
        """A step fit declared from another run, or None."""
        return self.body.get("step_fit")

    @property
    def registered_prediction(self) -> dict | None:
        """The prediction block when the capture registered one (None when absent or {skipped: why})."""
        block = self.body.get("prediction")
        return None if block is None or set(block) == {"skipped"} else block

    @property
    def replica_kinds(self) -> dict[str, str]:
        """A deployment's replicas: replica id -> kind (ours, vllm, llamacpp, blackbox); empty without one."""
        reps = self.block("deployment").get("replicas")
        return {r["replica_id"]: r.get("kind") for r in reps if isinstance(r, dict) and r.get("replica_id")} \
            if isinstance(reps, list) else {}

    @property
    def device_name(self) -> str | None:
        """The device the engine ran on (microbenchmarks' record, then the engine's, then the host's CPU)."""
        resolved = self.block("engine_config").get("resolved") or {}
        host = self.block("host")
        return self.block("device_params").get("device_name") or resolved.get("device_name") \
            or host.get("cpu_model") or None

    @property
    def engine(self) -> dict:
        """What a step fit of this run belongs to: the model's shape (ModelShape.to_dict: its element sizes are
        the compute dtype's), the device's name and the engine's thread count; None where it records none."""
        try:
            shape = self.model_shape().to_dict()
        except ShapeError:
            shape = None
        return {"shape": shape, "device": self.device_name, "threads": self.engine_threads}

    @property
    def engine_threads(self) -> int | None:
        """The engine's intra-op thread count on the CPU (engine_config.resolved.cpu_placement.threads), else
        the microbenchmarks' (device_params.threads: measured in a thread placed as the step thread); None."""
        placement = (self.block("engine_config").get("resolved") or {}).get("cpu_placement")
        threads = thread_count(placement.get("threads") if isinstance(placement, dict) else None)
        return threads if threads is not None else thread_count(self.block("device_params").get("threads"))

    @property
    def weights_dtype(self) -> str:
        return (self.block("model").get("dtype") or {}).get("weights") or ""


@dataclass(frozen=True)
class PartRecord:
    """One part as the layout wrote it: its file name, rows, size and the sha256 of its Parquet footer
    (the footer holds every row group's statistics and offsets: a rewritten part has another one)."""
    name: str
    rows: int
    bytes: int
    footer_sha256: str


_PART_RECORD_KINDS = {"name": str, "rows": int, "bytes": int, "footer_sha256": str}


@dataclass(frozen=True)
class Layout:
    """The partitioned layout's record (`events/layout.json`): the bucket count, the events placed, and
    per partition folder (`bucket-NNNN`, `engine-<id>`, `run`) the parts written (None: an older
    record that did not keep them)."""
    buckets: int
    events: int | None = None
    parts: dict[str, tuple[PartRecord, ...]] | None = None

    @staticmethod
    def file(events: str | os.PathLike) -> Path:
        return Path(events) / LAYOUT_FILE

    @classmethod
    def read(cls, events: str | os.PathLike) -> "Layout | None":
        """The record in `events/`, or None for a run written unpartitioned."""
        f = cls.file(events)
        if not f.exists():
            return None
        doc = _load(f)
        fix = "`inferledger repartition` rewrites it"
        if not isinstance(doc, dict):
            raise RunFolderError(f"{f}: not a layout record (expected a JSON object); {fix}")
        unknown = sorted(set(doc) - {k.name for k in LAYOUT_KEYS})
        if unknown:
            raise RunFolderError(f"{f}: {unknown[0]}: not a key of the layout record; {fix}")
        if doc.get("format", 1) not in (1, LAYOUT_FORMAT) or isinstance(doc.get("format"), bool):
            raise RunFolderError(f"{f}: format: {doc['format']} is not 1 or {LAYOUT_FORMAT}, the versions this "
                                 "inferledger reads")
        buckets = doc.get("buckets")
        if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 1:
            raise RunFolderError(f"{f}: buckets: not a layout record (buckets must be a whole number >= 1); {fix}")
        if doc.get("events") is not None and not isinstance(doc["events"], int):
            raise RunFolderError(f"{f}: events: expected integer; {fix}")
        return cls(buckets, doc.get("events"), cls._parts(doc.get("parts"), f, fix))

    @staticmethod
    def _parts(doc, f: Path, fix: str) -> dict[str, tuple[PartRecord, ...]] | None:
        if doc is None:
            return None
        if not isinstance(doc, dict):
            raise RunFolderError(f"{f}: parts: expected an object of partition folders; {fix}")
        out = {}
        for folder, records in doc.items():
            if not isinstance(records, list):
                raise RunFolderError(f"{f}: parts.{folder}: expected a list of parts; {fix}")
            for i, r in enumerate(records):
                bad = [k for k, kind in _PART_RECORD_KINDS.items() if not isinstance(r, dict)
                       or not isinstance(r.get(k), kind) or isinstance(r.get(k), bool)]
                if bad or set(r) != set(_PART_RECORD_KINDS):
                    key = bad[0] if bad else sorted(set(r) ^ set(_PART_RECORD_KINDS))[0]
                    raise RunFolderError(f"{f}: parts.{folder}[{i}].{key}: not a part record (name, rows, bytes, "
                                         f"footer_sha256); {fix}")
            out[folder] = tuple(PartRecord(**r) for r in records)
        return out

    def write(self, events: str | os.PathLike) -> Path:
        f = self.file(events)
        doc = {"format": LAYOUT_FORMAT, "buckets": self.buckets, "events": self.events}
        if self.parts is not None:
            doc["parts"] = {folder: [asdict(r) for r in records] for folder, records in self.parts.items()}
        f.write_text(json.dumps(doc) + "\n")
        return f


STUDY_KEYS: tuple[Key, ...] = (
    Key("format", (int,), f"the study index's schema version ({STUDY_FORMAT})"),
    Key("name", (str,), "the study's name"),
    Key("question", (str,), "the question it answers"),
    Key("knob", (str,), "the one knob its runs differ in"),
    Key("state", (str,), f"one of {', '.join(STUDY_STATES)}"),
    Key("runs", (list,), "its runs: name, dir (the run folder, relative), knob (the setting)"),
    Key("tables", (list,), "the comparison's tables, the key table first"),
    Key("figures", (list,), f"the figures to draw (kind: one of {', '.join(FIGURE_KINDS)})"),
    Key("options", (dict,), "the options it ran with"),
    Key("reading", (str,), "how to read its answer"),
    Key("error", (str,), "why a failed study failed"),
    Key("interrupted", (str,), "what stopped an interrupted study and the runs it had finished (`inferledger "
        "study NAME --resume DIR` continues it)"),
    Key("created", (str,), "when it was started"),
)
_STUDY_REQUIRED = ("format", "name", "question", "knob", "state", "runs")
_STUDY_RUN_KEYS = {"name": str, "dir": str, "knob": dict}


@dataclass
class StudyIndex:
    """A study folder's index (`study.json`): `doc` is its JSON object, checked."""
    doc: dict
    path: Path | None = None

    def __post_init__(self) -> None:
        file, doc = str(self.path) if self.path else STUDY_FILE, self.doc
        if not isinstance(doc, dict):
            raise RunFolderError(f"{file}: expected a JSON object")
        for key in _STUDY_REQUIRED:
            if key not in doc:
                raise RunFolderError(f"{file}: {key}: missing")
        unknown = sorted(set(doc) - {k.name for k in STUDY_KEYS})
        if unknown:
            raise RunFolderError(f"{file}: {unknown[0]}: not a key of the study index")
        _check(doc, STUDY_KEYS, file)
        if doc["format"] != STUDY_FORMAT:
            raise RunFolderError(f"{file}: format: {doc['format']} is not {STUDY_FORMAT}, the format this version reads")
        if doc["state"] not in STUDY_STATES:
            raise RunFolderError(f"{file}: state: {doc['state']!r} is not one of {', '.join(STUDY_STATES)}")
        for i, run in enumerate(doc["runs"]):
            for key, kind in _STUDY_RUN_KEYS.items():
                if not isinstance(run, dict) or not isinstance(run.get(key), kind):
                    raise RunFolderError(f"{file}: runs[{i}].{key}: expected {kind.__name__}")
        for i, fig in enumerate(doc.get("figures", [])):
            if not isinstance(fig, dict) or fig.get("kind") not in FIGURE_KINDS:
                raise RunFolderError(f"{file}: figures[{i}].kind: expected one of {', '.join(FIGURE_KINDS)}")

    @staticmethod
    def file(folder: str | os.PathLike) -> Path:
        return Path(folder) / STUDY_FILE

    @classmethod
    def exists(cls, folder: str | os.PathLike) -> bool:
        return cls.file(folder).is_file()

    @classmethod
    def read(cls, folder: str | os.PathLike) -> "StudyIndex":
        path = cls.file(folder)
        if not path.exists():
            raise RunFolderError(f"{path}: no {STUDY_FILE} (is {path.parent} a study folder written by "
                                 "`inferledger study`?)")
        return cls(_load(path), path)

    def write(self, folder: str | os.PathLike) -> Path:
        path = self.file(folder)
        write_json_atomic(self.doc, path)
        return path


def key_table(keys: tuple[Key, ...]) -> list[tuple[str, str, str]]:
    """(key, JSON type, meaning) of every key, the keys inside a block after it as block.key: the rows
    the run folder's documentation is generated from."""
    rows = []

    def walk(ks, prefix):
        for k in ks:
            rows.append((prefix + k.name, _kind_names(k.kinds), k.doc))
            walk(k.keys, f"{prefix}{k.name}.")
    walk(keys, "")
    return rows


# -- the documentation of the keys, generated from the tables above -----------------------------
DOC_BEGIN = "<!-- run folder keys: generated by `python -m inferledger.probes.run_folder --write`; edit probes/run_folder.py, not this -->"
DOC_END = "<!-- end of the run folder keys -->"
LAYOUT_KEYS: tuple[Key, ...] = (
    Key("format", (int,), f"the layout record's schema version ({LAYOUT_FORMAT}; absent in older records)"),
    Key("buckets", (int,), "the number of task buckets (`bucket-NNNN/` folders)"),
    Key("events", (int, _NONE), "the events placed when the layout was written"),
    Key("parts", (dict, _NONE), "per partition folder (`bucket-NNNN`, `engine-<id>`, `run`), the parts written "
        "there: a list of {name, rows, bytes, footer_sha256 (the sha256 of the Parquet footer)}; `reconstruct` "
        "refuses a recorded part that is missing or differs, and rebuilds a part newer than the record with a gap"),
)


def key_reference() -> str:
    """The run folder's keys as Markdown tables, between the markers docs/ARCHITECTURE.md holds."""
    out = [DOC_BEGIN, ""]
    for title, keys in ((f"`{MANIFEST_FILE}` (`Manifest`, format {MANIFEST_FORMAT})", MANIFEST_KEYS),
                        (f"`events/{LAYOUT_FILE}` (`Layout`, format {LAYOUT_FORMAT})", LAYOUT_KEYS),
                        (f"`{STUDY_FILE}` in a study folder (`StudyIndex`, format {STUDY_FORMAT})", STUDY_KEYS)):
        out += [f"**{title}**", "", "| key | type | what it holds |", "| --- | --- | --- |"]
        out += [f"| `{k}` | {t} | {d.replace('|', '/')} |" for k, t, d in key_table(keys)]
        out.append("")
    return "\n".join(out + [DOC_END]) + "\n"


def splice_reference(doc: str) -> str:
    """`doc` with the text between the markers replaced by the current key reference."""
    if DOC_BEGIN not in doc or DOC_END not in doc:
        raise SystemExit(f"the markers of the generated key reference are missing:\n{DOC_BEGIN}\n{DOC_END}")
    head, rest = doc.split(DOC_BEGIN, 1)
    tail = rest.split(DOC_END, 1)[1].lstrip("\n")
    return head + key_reference() + ("\n" + tail if tail else "")


def thread_count(value) -> int | None:
    """A recorded thread count: an integer (not a bool), else None (unknown)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def engine_differences(fitted, other: dict, whose: str) -> list[str]:
    """How engine `other` (Manifest.engine's keys) differs from `fitted`, the engine a step fit was trained on
    (StepFit.engine, which a file may carry malformed: what is not a dict is not compared): each field of the
    model's shape, the device and the thread count both sides know, as 'what OTHER (WHOSE: FITTED)'."""
    if not isinstance(fitted, dict):
        return []
    out = []
    mine, theirs = fitted.get("shape"), other.get("shape")
    if isinstance(mine, dict) and isinstance(theirs, dict):
        differ = shape_differences(mine, theirs, whose)
        out += ["model shape: " + ", ".join(differ)] if differ else []
    for key, what in (("device", "device"), ("threads", "engine threads")):
        a, b = fitted.get(key), other.get(key)
        if a is not None and b is not None and a != b:
            out.append(f"{what} {b!r} ({whose}: {a!r})")
    return out


if __name__ == "__main__":
    import sys

    if "--write" in sys.argv:
        target = Path("docs/ARCHITECTURE.md")
        target.write_text(splice_reference(target.read_text()))
        print(f"wrote the run folder keys into {target}")
    else:
        sys.stdout.write(key_reference())
