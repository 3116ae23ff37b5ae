-- tests/bench/workload_sqlite.sql: an sqlite3 workload for the overhead benchmark
-- (scripts/bench/bench_overhead.sh): inserts rows made by a recursive CTE into an
-- in-memory database, indexes them and queries the index.
-- Usage: sqlite3 :memory: < workload_sqlite.sql (the row count is in the CTE below).
CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, payload BLOB);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 200000)
INSERT INTO t(name, grp, payload)
SELECT printf('name-%08d-%s', (i * 7919) % 1000003, hex(randomblob(4))), i % 97,
       zeroblob(16 + i % 64) FROM c;
CREATE INDEX t_name ON t(name);
CREATE INDEX t_grp ON t(grp, name);
SELECT count(*), count(DISTINCT grp), sum(length(name)) FROM t WHERE name > 'name-0005';
SELECT grp, count(*) FROM t GROUP BY grp ORDER BY 2 DESC LIMIT 3;
