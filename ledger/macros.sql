-- Expressions several stages need, declared once as DuckDB macros (temporary: not part of the ledger).
--
-- scope: run
-- reads:
-- creates: first_point, last_point, point_of, json_double, json_bigint, sum_if_known, quantiles_linear,
--          quantile_linear, declared_replicas

-- The first (last) event of a group for which `cond` holds, as a point (ns, clock, eid). Ties on the
-- timestamp break by seq, then event id, in every stage alike.
CREATE OR REPLACE TEMP MACRO first_point(ts, clk, eid, sq, cond) AS
  arg_min(struct_pack(ns := ts, clock := clk, eid := eid), (ts, sq, eid)) FILTER (WHERE cond);
CREATE OR REPLACE TEMP MACRO last_point(ts, clk, eid, sq, cond) AS
  arg_max(struct_pack(ns := ts, clock := clk, eid := eid), (ts, sq, eid)) FILTER (WHERE cond);

-- A milestone that carries more than its point (a terminal's name, a finish reason), as a bare point.
CREATE OR REPLACE TEMP MACRO point_of(m) AS
  CASE WHEN m IS NOT NULL THEN struct_pack(ns := m.ns, clock := m.clock, eid := m.eid) END;

-- A number inside a JSON document; NULL when absent or not a number of that type. json_bigint is a count:
-- a JSON integer, or a float with no fraction (7.0), within ±2^53; 7.5, "7" or 1e30 are not counts
-- (a cast would round 7.5 to 8 or read the string), so they are NULL and the gap names the value.
CREATE OR REPLACE TEMP MACRO json_double(doc, path) AS TRY_CAST(json_extract_string(doc, path) AS DOUBLE);
CREATE OR REPLACE TEMP MACRO json_bigint(doc, path) AS
  CASE WHEN json_type(doc, path) IN ('BIGINT', 'UBIGINT', 'DOUBLE')
        AND TRY_CAST(json_extract_string(doc, path) AS DOUBLE) BETWEEN -9007199254740992 AND 9007199254740992
        AND TRY_CAST(json_extract_string(doc, path) AS DOUBLE) = floor(TRY_CAST(json_extract_string(doc, path) AS DOUBLE))
       THEN TRY_CAST(TRY_CAST(json_extract_string(doc, path) AS DOUBLE) AS BIGINT) END;

-- Σ x over a group whose every row knows `known`: 0 over no row, unknown (NULL) when any row does not.
CREATE OR REPLACE TEMP MACRO sum_if_known(known, x) AS
  CASE WHEN count(*) = 0 THEN 0 WHEN count(*) = count(known) THEN sum(x) END;

-- The ledger's one quantile rule for its own figures: linear interpolation between closest ranks
-- (Hyndman-Fan type 7, NumPy's default; docs/LEDGER.md "Quantiles"). Peers' rows keep their own rules.
CREATE OR REPLACE TEMP MACRO quantiles_linear(x, qs) AS quantile_cont(x, qs);
CREATE OR REPLACE TEMP MACRO quantile_linear(x, q) AS quantile_cont(x, q);  -- one q: a number, not a list

-- The replicas a deployment capture declared by kind (the manifest's deployment, set as the variable
-- `replica_kinds`: [[id, kind], ...]), one row each: replica_id, kind. No row for a run of one server.
CREATE OR REPLACE TEMP MACRO declared_replicas() AS TABLE
  SELECT x[1] AS replica_id, x[2] AS kind
  FROM (SELECT unnest(from_json(getvariable('replica_kinds'), '[["VARCHAR"]]')) AS x);
