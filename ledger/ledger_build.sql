-- Which code built this ledger: a reader holds it to its own (ledger/query.py), so a ledger that
-- another version of the modules built, whose columns may be others or mean other things, is rebuilt
-- rather than read as if it were current (docs/LEDGER.md "ledger_build").
--
-- scope: rollup
-- reads:
-- creates: ledger_build
-- @table ledger_build: one row: the inferledger that built this ledger and the sha256 of its ledger modules'
--   code (docs/LEDGER.md "ledger_build")
-- @column run_id: the run
-- @column inferledger_version: the package version that built it
-- @column modules_sha256: sha256 of every ledger module's code, in order (ledger/modules.py modules_sha256): a
--   reader whose modules hash otherwise refuses to draw the ledger and asks for a rebuild
CREATE OR REPLACE TABLE ledger_build AS
SELECT getvariable('run_id') AS run_id, getvariable('inferledger_version') AS inferledger_version,
       getvariable('modules_sha256') AS modules_sha256;
