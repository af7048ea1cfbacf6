"""Critical paths: stages as a DAG of real dependencies, earliest finish, longest path, slack, what-if.

E(v) = d(v) + max over predecessors E(u) (0 without predecessors); the task's end-to-end is the
largest E; the critical path walks back from it through the predecessor that set each E; slack is
how much a node can grow before the end-to-end moves. Edges come from the events, not log order:
a span's `attrs.after` names the spans it waited for; without `after`, nodes of one stream (a
session or request for attempts, `attrs.stream` for spans) follow each other in time order.
"""
from __future__ import annotations

import graphlib
import json
from dataclasses import dataclass, field

import pyarrow as pa

from inferledger.ledger.tables import StageTable, gap_table

READS = ("ev", "attempts", "marks", "intervals")
CREATES = ("chain_nodes", "critical_path", "critical_path_edges", "critical_path_gaps")
PUBLIC = ("critical_path", "critical_path_edges")
SCOPE = "task"  # one graph per task, one chain per attempt

# the Python rows and the SQL-computed chains, ordered by scope, subject and node position (pos, not kept)
CRITICAL_PATH = StageTable("critical_path", (
    ("scope", pa.string()), ("scope_id", pa.string()), ("node", pa.string()), ("kind", pa.string()),
    ("start_ms", pa.float64()), ("dur_ms", pa.float64()), ("finish_ms", pa.float64()), ("slack_ms", pa.float64()),
    ("on_path", pa.bool_()), ("observed_start_ms", pa.float64()), ("e2e_ms", pa.float64()), ("pos", pa.int64())),
    order="scope, scope_id, pos", hidden=("pos",))
CRITICAL_PATH_EDGES = StageTable("critical_path_edges", (
    ("scope", pa.string()), ("scope_id", pa.string()), ("src", pa.string()), ("dst", pa.string()),
    ("pos", pa.int64())), order="scope, scope_id, pos", hidden=("pos",))
# @gaps: a dependency graph with a cycle or a negative duration
GAPS = gap_table("critical_path")


class DagError(ValueError):
    """A graph the longest-path rule cannot be applied to (a cycle, a negative duration)."""


@dataclass
class Dag:
    scope: str  # "task" or "attempt"
    scope_id: str
    dur_ms: dict[str, float] = field(default_factory=dict)
    kind: dict[str, str] = field(default_factory=dict)
    preds: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class PathResult:
    e2e_ms: float
    finish_ms: dict[str, float]
    slack_ms: dict[str, float]
    path: list[str]


def _topological(dag: Dag) -> list[str]:
    """The nodes, each after its predecessors (iterative, so a chain of any length is fine); ties by name."""
    sorter = graphlib.TopologicalSorter({v: dag.preds.get(v, []) for v in dag.dur_ms})
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        cycle = list(reversed(exc.args[1]))  # graphlib lists it against the edges' direction
        raise DagError(f"{dag.scope} {dag.scope_id}: dependency cycle {' -> '.join(cycle)}") from None
    order = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        order += [v for v in ready if v in dag.dur_ms]
        sorter.done(*ready)
    return order


def longest_path(dag: Dag, dur_ms: dict[str, float] | None = None) -> PathResult:
    dur = dag.dur_ms if dur_ms is None else dur_ms
    for v, d in dur.items():
        if d is None or d < 0:
            raise DagError(f"{dag.scope} {dag.scope_id}: node {v} has duration {d} (must be known and >= 0)")
    order = _topological(dag)
    finish: dict[str, float] = {}
    for v in order:
        finish[v] = dur[v] + max((finish[u] for u in dag.preds.get(v, [])), default=0.0)
    e2e = max(finish.values(), default=0.0)
    succs: dict[str, list[str]] = {v: [] for v in order}
    for v in order:
        for u in dag.preds.get(v, []):
            succs[u].append(v)
    latest_finish: dict[str, float] = {}
    for v in reversed(order):
        latest_finish[v] = min((latest_finish[s] - dur[s] for s in succs[v]), default=e2e)
    slack = {v: latest_finish[v] - finish[v] for v in order}
    path, v = [], max(order, key=lambda n: (finish[n], n)) if order else None
    while v is not None:
        path.append(v)
        preds = dag.preds.get(v, [])
        v = max(preds, key=lambda u: (finish[u], u)) if preds else None
    return PathResult(e2e, finish, slack, list(reversed(path)))


def _unique(name: str, taken: dict) -> str:
    if name not in taken:
        return name
    k = 2
    while f"{name}#{k}" in taken:
        k += 1
    return f"{name}#{k}"


def task_dags(con) -> list[tuple[Dag, list[tuple[str, int, int]], str | None]]:
    """One DAG per task from its spans, tool calls and attempts; with each node's (name, start, end)
    and the reason the task has no graph (None when it has one)."""
    rows = con.execute("""
        WITH spans AS (
          SELECT task_id, coalesce(json_extract_string(attrs, '$.span'), json_extract_string(attrs, '$.tool'), 'tool') AS name,
                 CASE WHEN name LIKE 'tool.%' THEN 'tool' ELSE 'span' END AS kind,
                 CASE WHEN name IN ('span.start', 'tool.start') THEN 'start' ELSE 'end' END AS edge,
                 coalesce(json_extract_string(attrs, '$.stream'), CASE WHEN name LIKE 'tool.%' THEN 'tool' ELSE source END) AS stream,
                 json_extract(attrs, '$.after')::VARCHAR AS after, ts_ns, seq, event_id, clock
          FROM ev WHERE task_id IS NOT NULL AND attempt_id IS NULL
            AND name IN ('span.start', 'span.end', 'tool.start', 'tool.end')
        ), numbered AS (
          SELECT *, row_number() OVER (PARTITION BY task_id, kind, name, edge ORDER BY ts_ns, seq, event_id) AS k FROM spans
        )
        SELECT s.task_id, s.kind, s.name, s.stream, s.after, s.ts_ns, e.ts_ns, s.clock, e.clock
        FROM numbered s JOIN numbered e ON e.task_id = s.task_id AND e.kind = s.kind AND e.name = s.name
             AND e.k = s.k AND e.edge = 'end'
        WHERE s.edge = 'start'
        UNION ALL
        SELECT a.task_id, 'attempt', a.attempt_id, coalesce(a.session_id, a.request_id, a.attempt_id), NULL,
               coalesce(m.created.ns, m.sent.ns, m.enqueued.ns), coalesce(m.client_end.ns, a.server_end_ns),
               CASE WHEN coalesce(m.created.ns, m.sent.ns) IS NOT NULL THEN coalesce(m.created.clock, m.sent.clock)
                    ELSE m.enqueued.clock END,
               CASE WHEN m.client_end.ns IS NOT NULL THEN m.client_end.clock ELSE a.server_clock END
        FROM attempts a JOIN marks m USING (attempt_id)
        WHERE a.task_id IS NOT NULL AND coalesce(m.created.ns, m.sent.ns, m.enqueued.ns) IS NOT NULL
          AND coalesce(m.client_end.ns, a.server_end_ns) IS NOT NULL
        ORDER BY 1, 6, 3
    """).fetchall()
    by_task: dict[str, list] = {}
    for row in rows:
        by_task.setdefault(row[0], []).append(row)
    out = []
    for task_id, items in sorted(by_task.items()):
        dag, times, after, streams = Dag("task", task_id), [], {}, {}
        clocks = {c for item in items for c in item[7:9]}
        if len(clocks) > 1:  # durations and time order across unmapped domains would be guesses
            out.append((Dag("task", task_id), [], f"task {task_id}: its stages lie in clocks {sorted(map(str, clocks))} "
                        "that one graph cannot compare"))
            continue
        for _, kind, name, stream, after_json, t0, t1, _c0, _c1 in items:
            node = _unique(name, dag.dur_ms)
            dag.dur_ms[node] = (t1 - t0) / 1e6
            dag.kind[node] = kind
            times.append((node, t0, t1))
            after[node] = json.loads(after_json) if after_json else None
            streams.setdefault(stream, []).append(node)
        known = set(dag.dur_ms)
        start = {n: t0 for n, t0, _ in times}
        end = {n: t1 for n, _, t1 in times}
        for node in dag.dur_ms:
            if after[node] is not None:
                dag.preds[node] = [u for u in after[node] if u in known]
        for stream, nodes in streams.items():
            for node in nodes:
                if after[node] is None:  # time order within its stream
                    before = [u for u in nodes if u != node and end[u] <= start[node]]
                    dag.preds[node] = [max(before, key=lambda u: (end[u], u))] if before else []
        out.append((dag, times, None))
    return out


_ATTEMPT_NODES = """
    WITH pick AS (
      SELECT attempt_id, CASE WHEN bool_or(stream = 'client') THEN 'client' ELSE 'server' END AS stream
      FROM intervals WHERE stream IN ('client', 'server') GROUP BY attempt_id
    ), nodes AS (
      SELECT i.attempt_id, i.name, i.start_ns, i.end_ns, (i.end_ns - i.start_ns) / 1e6 AS dur_ms,
             row_number() OVER (PARTITION BY i.attempt_id ORDER BY i.start_ns, i.name) AS pos,
             row_number() OVER (PARTITION BY i.attempt_id, i.name ORDER BY i.start_ns) AS dup
      FROM intervals i JOIN pick p USING (attempt_id, stream)
      WHERE i.on_path AND i.kind IN ('span', 'state')
    )
    SELECT *, CASE WHEN dup = 1 THEN name ELSE name || '#' || dup END AS node,
           bool_and(dur_ms IS NOT NULL AND dur_ms >= 0) OVER (PARTITION BY attempt_id) AS clean
    FROM nodes"""


def attempt_dags(con, *, unclean_only: bool = False) -> list[tuple[Dag, list[tuple[str, int, int]], None]]:
    """One chain per attempt: the registered intervals of its client stream (else its server stream),
    in time order; a repeated name gets `#2`, `#3`. `unclean_only`: just the chains with a node of
    unknown or negative duration (the ones `build` hands to the general rule to be refused). Reads
    the temp table `chain_nodes` (`_chain_nodes`)."""
    rows = con.execute("SELECT attempt_id, node, start_ns, end_ns FROM chain_nodes "
                       f"{'WHERE NOT clean' if unclean_only else ''} ORDER BY attempt_id, pos").fetchall()
    out, cur = [], None
    for attempt_id, node, t0, t1 in rows:
        if cur is None or cur[0].scope_id != attempt_id:
            cur = (Dag("attempt", attempt_id), [], None)
            out.append(cur)
            prev = None
        dag, times, _ = cur
        dag.dur_ms[node] = None if t0 is None or t1 is None else (t1 - t0) / 1e6
        dag.kind[node] = "stage"
        dag.preds[node] = [prev] if prev else []
        times.append((node, t0, t1))
        prev = node
    return out


# A chain's longest path is the chain: E(v) is the running sum of durations, every node is on the
# path with zero slack. Computed in SQL for every chain whose durations are all known and >= 0.
_CHAIN_NODES = """
    SELECT 'attempt' AS scope, attempt_id AS scope_id, node, 'stage' AS kind,
           fin - dur_ms AS start_ms, dur_ms, fin AS finish_ms, 0.0 AS slack_ms, true AS on_path,
           (start_ns - min(start_ns) OVER (PARTITION BY attempt_id)) / 1e6 AS observed_start_ms,
           sum(dur_ms) OVER (PARTITION BY attempt_id) AS e2e_ms, pos
    FROM (SELECT *, sum(dur_ms) OVER (PARTITION BY attempt_id ORDER BY pos
                                      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS fin
          FROM chain_nodes WHERE clean)"""


def _chain_nodes(con) -> None:
    """Every attempt's chain nodes, once, for the three readers (refusals, nodes, edges)."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE chain_nodes AS {_ATTEMPT_NODES}")


def build(con, run=None) -> None:
    """Create critical_path and critical_path_edges, and critical_path_gaps: the graphs refused."""
    nodes, edges, problems = [], [], []
    _chain_nodes(con)
    for dag, times, problem in task_dags(con) + attempt_dags(con, unclean_only=True):
        if problem:
            problems.append((dag.scope, dag.scope_id, problem))
            continue
        try:
            res = longest_path(dag)
        except DagError as exc:
            problems.append((dag.scope, dag.scope_id, str(exc)))
            continue
        origin = min((t0 for _, t0, _ in times), default=0)
        on_path = set(res.path)
        for pos, (node, t0, _) in enumerate(times, 1):
            d = dag.dur_ms[node]
            nodes.append((dag.scope, dag.scope_id, node, dag.kind[node], res.finish_ms[node] - d, d, res.finish_ms[node],
                          res.slack_ms[node], node in on_path, (t0 - origin) / 1e6, res.e2e_ms, pos))
            edges.extend((dag.scope, dag.scope_id, u, node, pos) for u in dag.preds.get(node, []))
    CRITICAL_PATH.store(con, nodes, f"SELECT {', '.join(CRITICAL_PATH.names)} FROM ({_CHAIN_NODES})")
    CRITICAL_PATH_EDGES.store(con, edges, "SELECT 'attempt' AS scope, attempt_id AS scope_id, "
                              "lag(node) OVER (PARTITION BY attempt_id ORDER BY pos) AS src, node AS dst, pos "
                              "FROM chain_nodes WHERE clean "
                              "QUALIFY lag(node) OVER (PARTITION BY attempt_id ORDER BY pos) IS NOT NULL")
    needs = "a dependency graph without cycles or negative durations"
    GAPS.store(con, [(scope, subject, "critical_path", needs, detail) for scope, subject, detail in problems])


# @table critical_path: one row per node of each task's DAG and each attempt's chain (docs/LEDGER.md
#   "critical_path and critical_path_edges")
# @column scope: task (spans, tool calls and attempts of a task) or attempt (the chain of its intervals)
# @column scope_id: the task or attempt id
# @column node: the stage (a repeated name gets #2, #3)
# @column kind: span, tool, attempt or stage
# @column start_ms: its earliest start, E(v) − d(v), from the scope's start
# @column dur_ms: its duration d(v)
# @column finish_ms: its earliest finish E(v) = d(v) + max over predecessors E(u)
# @column slack_ms: latest finish − earliest finish: how much it can grow before e2e_ms does
# @column on_path: on the longest path
# @column observed_start_ms: when it really started, from the scope's first event
# @column e2e_ms: the scope's longest path, max E
#
# @table critical_path_edges: one row per dependency edge of those graphs
# @column scope: as critical_path.scope
# @column scope_id: as critical_path.scope_id
# @column src: the node waited for
# @column dst: the node that waited
def load_dags(con, scope: str | None = None, scope_id: str | None = None) -> list[Dag]:
    """The DAGs stored in a ledger (for what-if questions)."""
    where, params = [], []
    if scope:
        where.append("scope = ?")
        params.append(scope)
    if scope_id:
        where.append("scope_id = ?")
        params.append(scope_id)
    clause = (" WHERE " + " AND ".join(where)) if where else ""
    dags: dict[tuple, Dag] = {}
    for sc, sid, node, kind, dur in con.execute(
            f"SELECT scope, scope_id, node, kind, dur_ms FROM critical_path{clause} ORDER BY scope, scope_id, node",
            params).fetchall():
        dag = dags.setdefault((sc, sid), Dag(sc, sid))
        dag.dur_ms[node], dag.kind[node] = dur, kind
        dag.preds.setdefault(node, [])
    for sc, sid, src, dst in con.execute(f"SELECT scope, scope_id, src, dst FROM critical_path_edges{clause}",
                                         params).fetchall():
        if (sc, sid) in dags:
            dags[(sc, sid)].preds.setdefault(dst, []).append(src)
    return list(dags.values())


def ledger_dags(ledger, scope_id: str | None = None) -> list[Dag]:
    """`load_dags` of a built ledger file (RUN/ledger.duckdb), opened read-only."""
    import duckdb

    with duckdb.connect(str(ledger), read_only=True) as con:
        return load_dags(con, scope_id=scope_id)


def what_if(dag: Dag, node: str, *, shrink: float | None = None, to_ms: float | None = None):
    """(before, after) PathResults with `node` (and its #n repeats) shortened by a fraction or set to to_ms."""
    targets = [n for n in dag.dur_ms if n == node or n.startswith(node + "#")]
    if not targets:
        return None
    dur = dict(dag.dur_ms)
    for n in targets:
        dur[n] = to_ms if to_ms is not None else dur[n] * (1 - shrink)
    return longest_path(dag), longest_path(dag, dur)
